"""Model averaging (post-local SGD's other half): ``PeriodicModelAverager`` must average the
parameters of every rank of its group at exactly the steps its definition names (the step
count at or past ``warmup_steps`` and a multiple of ``period`` after it), leave them local at
every other step, and average over its group's ranks only (a subgroup's mean, not one divided
by the world size), whether called directly, on an optimizer's parameter groups, or by
``PostLocalSGDOptimizer``. The oracle is that definition, simulated on one process."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from ddp_verify.conformance import jobs

# Small integers: means of up to 4 ranks are exact enough for a tight bound in float64.
VALUES = st.integers(-8, 8).map(float)


def expected(values, deltas, period, warmup, members):
    state = [list(v) for v in values]
    group = members if members is not None else list(range(len(values)))
    after = []
    for step, delta in enumerate(deltas):
        state = [
            [x + d for x, d in zip(s, dr, strict=True)] for s, dr in zip(state, delta, strict=True)
        ]
        if step >= warmup and (step - warmup) % period == 0:
            mean = [sum(state[r][i] for r in group) / len(group) for i in range(len(state[0]))]
            for r in group:
                state[r] = list(mean)
        after.append([list(s) for s in state])
    return after


def cases(world_size: int) -> st.SearchStrategy:
    @st.composite
    def draw(draw_):
        n = draw_(st.integers(2, 5))
        steps = draw_(st.integers(1, 6))
        vector = st.lists(VALUES, min_size=n, max_size=n)
        values = draw_(st.lists(vector, min_size=world_size, max_size=world_size))
        deltas = draw_(
            st.lists(
                st.lists(vector, min_size=world_size, max_size=world_size),
                min_size=steps,
                max_size=steps,
            )
        )
        period = draw_(st.integers(1, 3))
        warmup = draw_(st.integers(0, 4))
        members = draw_(
            st.none()
            | st.lists(st.integers(0, world_size - 1), min_size=1, unique=True).map(sorted)
        )
        via = draw_(st.sampled_from(("averager", "groups", "optimizer")))
        return values, deltas, period, warmup, members, via

    return draw()  # fmt: skip


def test_periodic_model_averager_averages_its_group_at_the_steps_it_names(world, prove):
    def check(case):
        values, deltas, period, warmup, members, via = case
        results = world.run(jobs.periodic_averaging, *case)
        want = expected(values, deltas, period, warmup, members)
        said = (
            f"PeriodicModelAverager(period={period}, warmup_steps={warmup}, process_group="
            f"{'the world' if members is None else f'new_group({members})'}) via {via}"
        )
        for rank, steps in enumerate(results):
            for step, got in enumerate(steps):
                torch.testing.assert_close(
                    torch.tensor(got, dtype=torch.float64),
                    torch.tensor(want[step][rank], dtype=torch.float64),
                    rtol=1e-12,
                    atol=1e-12,
                    msg=lambda m, rank=rank, step=step: (
                        f"{said}: rank {rank}'s parameters after step {step} are not what "
                        f"its definition gives (average at steps >= warmup_steps that are a "
                        f"multiple of period after it, over the group's ranks).\n{m}"
                    ),
                )

    # Never left to chance: a warm-up that is not a multiple of the period (the averaging
    # steps are counted from its end), over the world and over a subgroup of one rank.
    size = world.size
    values = [[float(r), float(-r)] for r in range(size)]
    deltas = [[[float(r + t), 0.0] for r in range(size)] for t in range(5)]
    boundary = [
        (values, deltas, 2, 1, None, "averager"),
        (values, deltas, 3, 1, [0, size - 1], "optimizer"),
    ]
    prove(cases(size), check, examples=boundary)


def test_the_oracle_averages_at_the_steps_the_documentation_names():
    # period 2 after a warm-up of 1: steps 1 and 3 average, 0 and 2 do not.
    values, deltas = [[0.0], [2.0]], [[[0.0], [0.0]]] * 4
    after = expected(values, deltas, period=2, warmup=1, members=None)
    assert [a[0][0] for a in after] == [0.0, 1.0, 1.0, 1.0]
    moving = [[[1.0], [0.0]]] * 4
    after = expected([[0.0], [0.0]], moving, period=2, warmup=1, members=None)
    assert [a[0][0] for a in after] == [1.0, 1.0, 2.0, 2.0]
