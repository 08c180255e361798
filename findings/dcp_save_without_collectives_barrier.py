"""torch.distributed.checkpoint.save(use_collectives=False) (experimental) is documented to
"save a checkpoint without using cross-rank synchronization", but it ends with a barrier over
its group (``_save_state_dict``: ``distW.barrier()`` after writing). A rank that saves alone,
as that wording allows, waits forever for the others; where they make a collective of their
own afterwards, the barrier completes against it instead, and the program's collectives are
out of step from there on, silently. Two ranks, rank 0 saving alone, then both at a barrier
(torch 2.13.0):

    python findings/dcp_save_without_collectives_barrier.py
    # rank 0 saved alone
    # rank 1 passed its barrier   (against rank 0's save's barrier)
    # then rank 0's own barrier: "still waiting after 20 s", or "a rank failed" where
    # rank 1 has already left

Found by ``pytest --pyargs ddp_verify.conformance`` (test_checkpoint.py).
"""

import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

WORLD, WAIT_S = 2, 20


def run(rank: int, port: int, directory: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    if rank == 0:
        dcp.save({"w": torch.ones(2)}, checkpoint_id=f"{directory}/solo", use_collectives=False)
        print("rank 0 saved alone", flush=True)
    dist.barrier()
    print(f"rank {rank} passed its barrier", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    context = mp.start_processes(
        run, args=(free_port, tempfile.mkdtemp()), nprocs=WORLD, join=False
    )
    try:
        finished = context.join(timeout=WAIT_S)
    except Exception as exc:  # a rank that raised
        print(f"a rank failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        sys.exit(1)
    if not finished:
        print(f"still waiting after {WAIT_S} s: the save's barrier took the place of another")
        for process in context.processes:
            process.kill()
        sys.exit(1)
