"""DDP's fused optimizer (``_register_fused_optim``): the optimizer runs inside the backward
pass, on each bucket's averaged gradient, and must train what the optimizer run after the
backward trains: the published SGD rule (momentum buffer b <- momentum * b + g, p <- p - lr b;
b = g at the first step) on the mean over ranks of their gradients, written out here on one
process."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ddp_verify.conformance import jobs
from ddp_verify.conformance.closed_forms import assert_every_rank_and_step

VALUES = st.integers(-3, 3).map(float)


def reference(lr, momentum, inputs, size):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    buffers: list[torch.Tensor | None] = [None, None]
    after = []
    for step in inputs:
        model.zero_grad()
        loss = sum(
            model(torch.tensor(step[r], dtype=torch.float64)).pow(2).sum() for r in range(size)
        )
        (loss / size).backward()
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                g = p.grad
                buffers[i] = g.clone() if buffers[i] is None else momentum * buffers[i] + g
                p -= lr * (buffers[i] if momentum else g)
        after.append([float(v) for p in model.parameters() for v in p.detach().reshape(-1)])
    return after


def test_ddp_fused_sgd_follows_the_published_rule_on_the_averaged_gradient(world, prove):
    size = world.size

    def check(case):
        lr, momentum, inputs = case
        results = world.run(jobs.fused_optimizer_steps, lr, momentum, inputs)
        want = reference(lr, momentum, inputs, size)
        assert_every_rank_and_step(
            results,
            lambda rank, step: want[step],
            lambda rank, step: (
                f"DDP._register_fused_optim(SGD, lr={lr}, momentum={momentum}): rank {rank}'s "
                f"parameters after step {step} are not SGD's on the mean of the ranks' gradients."
            ),
            rtol=1e-10,
        )

    rows = st.lists(st.lists(VALUES, min_size=3, max_size=3), min_size=1, max_size=3)
    steps = st.lists(st.lists(rows, min_size=size, max_size=size), min_size=2, max_size=4)
    prove(
        st.tuples(st.sampled_from((0.01, 0.05)), st.sampled_from((0.0, 0.5, 0.9)), steps),
        check,
    )
