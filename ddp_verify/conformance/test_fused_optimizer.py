"""DDP's fused optimizer (``_register_fused_optim``): the optimizer runs inside the backward
pass, on each bucket's averaged gradient, and must train what the optimizer run after the
backward trains: the published SGD rule (momentum buffer b <- momentum * b + g, p <- p - lr b;
b = g at the first step) on the mean over ranks of their gradients, written out here on one
process."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ddp_verify.conformance import jobs

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
        for rank, steps in enumerate(results):
            for step, got in enumerate(steps):
                torch.testing.assert_close(
                    torch.tensor(got, dtype=torch.float64),
                    torch.tensor(want[step], dtype=torch.float64),
                    rtol=1e-10,
                    atol=1e-12,
                    msg=lambda m, rank=rank, step=step: (
                        f"DDP._register_fused_optim(SGD, lr={lr}, momentum={momentum}): rank "
                        f"{rank}'s parameters after step {step} are not SGD's on the mean of "
                        f"the ranks' gradients.\n{m}"
                    ),
                )

    rows = st.lists(st.lists(VALUES, min_size=3, max_size=3), min_size=1, max_size=3)
    steps = st.lists(st.lists(rows, min_size=size, max_size=size), min_size=2, max_size=4)
    prove(
        st.tuples(st.sampled_from((0.01, 0.05)), st.sampled_from((0.0, 0.5, 0.9)), steps),
        check,
    )
