"""The bundled example: a plain PyTorch DDP training script, correct at every data-parallel
layout (a DistributedSampler, gradient accumulation with no_sync, each micro-batch's mean loss
divided by the accumulation steps: right when micro-batches hold as many samples). A script,
never imported by the package; ``ddp-verify parity`` with no script of yours checks it.

    torchrun --nproc-per-node 2 ddp_verify/parity/example_script.py --grad-accum 2 --batch-size 4

Checked, unmodified, by ``ddp-verify parity`` alone, which runs

    ddp-verify parity --layouts 1x4,2x2,4x1 --global-batch 16 --steps 3 -- \\
        python ddp_verify/parity/example_script.py --grad-accum {grad_accum} \\
        --batch-size {micro_batch}
"""

import argparse
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    parser.add_argument(
        "--batch-size", type=int, default=8, help="samples per micro-batch, per rank"
    )
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 6, generator=generator)
    targets = inputs @ torch.randn(6, 1, generator=generator)
    dataset = TensorDataset(inputs, targets)

    torch.manual_seed(1)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    batches = iter(DataLoader(dataset, batch_size=args.batch_size, sampler=sampler))

    for step in range(args.steps):
        optimizer.zero_grad()
        step_loss = torch.zeros(())
        for micro in range(args.grad_accum):
            x, y = next(batches)
            last = micro == args.grad_accum - 1
            with contextlib.nullcontext() if last else model.no_sync():
                loss = torch.nn.functional.mse_loss(model(x), y) / args.grad_accum
                loss.backward()
            step_loss += loss.detach()
        optimizer.step()
        # Log the step's loss over every rank, as the gradient averages it: rank 0's last
        # micro-batch alone would make each layout's loss curve its own.
        dist.all_reduce(step_loss)
        if dist.get_rank() == 0:
            print(f"step {step}: loss {step_loss.item() / dist.get_world_size():.6f}")

    dist.destroy_process_group()


# Imported (pytest --doctest-modules over the package), it trains nothing.
if __name__ == "__main__":
    main()
