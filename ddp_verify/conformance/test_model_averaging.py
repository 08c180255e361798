"""Model averaging (post-local SGD's other half): ``PeriodicModelAverager`` must average the
parameters of every rank of its group at exactly the steps its definition names (the step
count at or past ``warmup_steps`` and a multiple of ``period`` after it), leave them local at
every other step, and average over its group's ranks only (a subgroup's mean, not one divided
by the world size), whether called directly, on an optimizer's parameter groups, or by
``PostLocalSGDOptimizer``. ``HierarchicalModelAverager`` must average, at a step at or past
``warmup_steps``, over the groups of the level with the largest period that divides the step
count (consecutive ranks, as ``new_subgroups`` makes them), and nowhere else. The oracle is
each definition, simulated on one process. The post-local SGD communication hook (the other
half's first stage) must average DDP's gradients over the world before ``start_localSGD_iter``
and over the rank's subgroup from then on (or leave them local, with
``post_local_gradient_allreduce=False``)."""

from __future__ import annotations

from hypothesis import strategies as st

from ddp_verify.conformance import jobs, refusal_jobs
from ddp_verify.conformance.closed_forms import assert_every_rank_and_step

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
        # PostLocalSGDOptimizer's own methods: its state_dict() loaded into a fresh one before
        # a drawn step (the averager's step count with it), a param group added after.
        resume_at = draw_(st.integers(0, steps - 1)) if via == "optimizer" else 0
        add_group = via == "optimizer" and draw_(st.booleans())
        return values, deltas, period, warmup, members, via, resume_at, add_group

    return draw()  # fmt: skip


def test_periodic_model_averager_averages_its_group_at_the_steps_it_names(world, prove):
    def check(case):
        values, deltas, period, warmup, members, via, resume_at, add_group = case
        results = world.run(jobs.periodic_averaging, *case)
        want = expected(values, deltas, period, warmup, members)
        said = (
            f"PeriodicModelAverager(period={period}, warmup_steps={warmup}, process_group="
            f"{'the world' if members is None else f'new_group({members})'}) via {via}"
            + (f", resumed from its state_dict() before step {resume_at}" if resume_at else "")
            + (", the second tensor added with add_param_group" if add_group else "")
        )
        assert_every_rank_and_step(
            results,
            lambda rank, step: want[step][rank],
            lambda rank, step: (
                f"{said}: rank {rank}'s parameters after step {step} are not what its "
                "definition gives (average at steps >= warmup_steps that are a multiple of "
                "period after it, over the group's ranks)."
            ),
        )

    # Never left to chance: a warm-up that is not a multiple of the period (the averaging
    # steps are counted from its end), over the world and over a subgroup of one rank.
    size = world.size
    values = [[float(r), float(-r)] for r in range(size)]
    deltas = [[[float(r + t), 0.0] for r in range(size)] for t in range(5)]
    subgroup = [0, size - 1] if size > 2 else [0]  # smaller than the world
    boundary = [
        (values, deltas, 2, 1, None, "averager", 0, False),
        # A warm-up whose double is not a multiple of the period either: counting from its
        # end, not its start, is what tells steps 1 and 4 from 2 and 5.
        (values, deltas, 3, 1, None, "groups", 0, False),
        (values, deltas, 3, 1, subgroup, "optimizer", 0, False),
        # resumed at an averaging step (3: past the warm-up of 1, a period of 2 after it),
        # which only the restored step count tells from step 0
        (values, deltas, 2, 1, None, "optimizer", 3, True),
    ]
    prove(cases(size), check, examples=boundary)


def expected_hierarchical(values, deltas, levels, warmup):
    state = [list(v) for v in values]
    after = []
    for step, delta in enumerate(deltas):
        state = [
            [x + d for x, d in zip(s, dr, strict=True)] for s, dr in zip(state, delta, strict=True)
        ]
        dividing = [size for period, size in levels if step % period == 0]
        if step >= warmup and dividing:
            size = dividing[-1]  # the largest period's (levels go up in period)
            for start in range(0, len(state), size):
                block = state[start : start + size]
                mean = [sum(column) / size for column in zip(*block, strict=True)]
                state[start : start + size] = [list(mean) for _ in block]
        after.append([list(s) for s in state])
    return after


def hierarchical_cases(world_size: int) -> st.SearchStrategy:
    # Group sizes: a chain of divisors, each dividing the next (so each level's groups nest in
    # the next's), ending at the world or at a smaller top level given as the averager's
    # process_group (consecutive ranks); periods going up with them. Below a top level smaller
    # than the world, levels of one rank only: larger ones wait forever (the averager makes
    # them with new_subgroups over its group, which every group's ranks call with their own
    # ranks; findings/hierarchical_averager_subgroup_hang.py), which only worlds of 8 or more
    # would draw.
    chains = []
    for top in (d for d in range(world_size, 0, -1) if world_size % d == 0):
        from_top = [[top]]
        for size in range(top - 1, 0, -1):
            from_top += [[size, *c] for c in from_top if c[0] % size == 0]
        chains += [c for c in from_top if top == world_size or set(c[:-1]) <= {1}]

    @st.composite
    def draw(draw_):
        sizes = draw_(st.sampled_from(chains))
        periods = sorted(
            draw_(st.sets(st.integers(1, 6), min_size=len(sizes), max_size=len(sizes)))
        )
        n = draw_(st.integers(1, 3))
        steps = draw_(st.integers(1, 9))
        vector = st.lists(VALUES, min_size=n, max_size=n)
        values = draw_(st.lists(vector, min_size=world_size, max_size=world_size))
        deltas = draw_(
            st.lists(
                st.lists(vector, min_size=world_size, max_size=world_size),
                min_size=steps,
                max_size=steps,
            )
        )
        warmup = draw_(st.integers(0, 5))
        return values, deltas, list(zip(periods, sizes, strict=True)), warmup

    return draw()  # fmt: skip


def test_hierarchical_model_averager_averages_the_largest_dividing_periods_groups(world, prove):
    def check(case):
        values, deltas, levels, warmup = case
        results = world.run(jobs.hierarchical_averaging, *case)
        want = expected_hierarchical(values, deltas, levels, warmup)
        top = levels[-1][1]
        group = "" if top == world.size else f", process_group=<{top} consecutive ranks>"
        said = (
            f"HierarchicalModelAverager(period_group_size_dict={dict(levels)}, "
            f"warmup_steps={warmup}{group})"
        )
        assert_every_rank_and_step(
            results,
            lambda rank, step: want[step][rank],
            lambda rank, step: (
                f"{said}: rank {rank}'s parameters after step {step} are not what its "
                "definition gives (at a step >= warmup_steps, the mean over the groups of the "
                "largest period dividing the step)."
            ),
        )

    # Never left to chance: every level reached, the top one (the world) at a step its smaller
    # periods also divide, warm-up covering a step the top level would have averaged.
    size = world.size
    values = [[float(r * r)] for r in range(size)]
    deltas = [[[float(r + t)] for r in range(size)] for t in range(7)]
    levels = [(2, size // 2 if size % 2 == 0 else 1), (6, size)]
    prove(hierarchical_cases(size), check, examples=[(values, deltas, levels, 1)])


def test_the_hierarchical_oracle_averages_where_its_documentation_says():
    # Periods 2 (pairs) and 4 (all four): step 2 averages the pairs, step 4 all of them, steps
    # 1 and 3 nothing; warm-up 1 skips step 0 (which every period divides).
    values = [[0.0], [4.0], [8.0], [12.0]]
    after = expected_hierarchical(values, [[[0.0]] * 4] * 5, [(2, 2), (4, 4)], warmup=1)
    assert [a[0][0] for a in after] == [0.0, 0.0, 2.0, 2.0, 6.0]
    assert [a[3][0] for a in after] == [12.0, 12.0, 10.0, 10.0, 6.0]


def test_the_oracle_averages_at_the_steps_the_documentation_names():
    # period 2 after a warm-up of 1: steps 1 and 3 average, 0 and 2 do not.
    values, deltas = [[0.0], [2.0]], [[[0.0], [0.0]]] * 4
    after = expected(values, deltas, period=2, warmup=1, members=None)
    assert [a[0][0] for a in after] == [0.0, 1.0, 1.0, 1.0]
    moving = [[[1.0], [0.0]]] * 4
    after = expected([[0.0], [0.0]], moving, period=2, warmup=1, members=None)
    assert [a[0][0] for a in after] == [1.0, 1.0, 2.0, 2.0]


def expected_post_local(
    gradients, start, subgroup_size, post_local_gradient_allreduce, global_size=None
):
    after = []
    for step, given in enumerate(gradients):
        if step < start:
            size = global_size or len(given)
            blocks = [list(range(b, b + size)) for b in range(0, len(given), size)]
        elif post_local_gradient_allreduce:
            blocks = [
                list(range(b, b + subgroup_size)) for b in range(0, len(given), subgroup_size)
            ]
        else:
            blocks = [[r] for r in range(len(given))]
        got = [list(g) for g in given]
        for block in blocks:
            mean = [
                sum(column) / len(block) for column in zip(*(given[r] for r in block), strict=True)
            ]
            for r in block:
                got[r] = mean
        after.append(got)
    return after


def test_post_local_sgd_hook_averages_over_the_world_then_over_the_subgroup(world, prove):
    size = world.size
    divisors = [d for d in range(1, size + 1) if size % d == 0]

    @st.composite
    def draw(draw_):
        n, steps = draw_(st.integers(1, 3)), draw_(st.integers(1, 5))
        vector = st.lists(VALUES, min_size=n, max_size=n)
        gradients = draw_(
            st.lists(st.lists(vector, min_size=size, max_size=size), min_size=steps, max_size=steps)
        )
        return (
            gradients,
            draw_(st.integers(0, 4)),
            draw_(st.sampled_from(divisors)),
            draw_(st.booleans()),
            draw_(st.none() | st.sampled_from(divisors)),  # process_group: the world or blocks
        )

    def check(case):
        _, start, subgroup_size, allreduce, global_size = case
        results = world.run(jobs.post_local_sgd_gradients, *case)
        want = expected_post_local(*case)
        group = "None" if global_size is None else f"new_subgroups(group_size={global_size})"
        said = (
            f"DDP with post_localSGD_hook(PostLocalSGDState(process_group={group}, "
            f"start_localSGD_iter={start}, subgroup=new_subgroups(group_size={subgroup_size}), "
            f"post_local_gradient_allreduce={allreduce}))"
        )
        assert_every_rank_and_step(
            results,
            lambda rank, step: want[step][rank],
            lambda rank, step: (
                f"{said}: rank {rank}'s gradient at step {step} is not the mean over "
                f"{'its process group' if step < start else 'its subgroup'}."
            ),
        )

    gradients = [[[float(r + 1 + 2 * t)] for r in range(size)] for t in range(4)]
    boundary = (gradients, 2, divisors[len(divisors) // 2], True, None)
    prove(draw(), check, examples=[boundary])


AVERAGER_REFUSED = {
    "periodic, warmup_steps -1": r"ValueError: Arg ``warmup_steps`` must be a non-negative",
    "periodic, period 0": r"ValueError: Arg ``period`` must be a positive value",
    "periodic, period 1": r"UserWarning: When period is 1, no need to use model averaging",
    "hierarchical, no levels": r"ValueError: Arg ``period_group_size_dict`` must not be empty",
    "hierarchical, a period 0": r"ValueError: The minimum period in arg ``period_group_size_dict``",
    "hierarchical, a largest period of 1": r"UserWarning: When the maximum period in arg",
    "hierarchical, a last size not the group's": r"ValueError: The last value in arg "
    r"``period_group_size_dict`` \d+ must be equal to the size of arg ``process_group``",
    "hierarchical, warmup_steps -1": r"ValueError: Arg ``warmup_steps`` must be a non-negative",
}


def test_the_averagers_refuse_and_warn_of_what_their_documentation_does(world):
    # A negative warmup or a period below 1 would average at steps no schedule names (or at
    # none); a period of 1 is accepted with the documented warning that DDP alone does it
    # cheaper; the edges just inside (warmup 0, period 2) are accepted without a word.
    results = world.run(refusal_jobs.averager_refusals)
    refusal_jobs.assert_refused(results, AVERAGER_REFUSED, "the model averagers")
    for rank, said in enumerate(results):
        for name in ("periodic, period 2 from step 0", "hierarchical, period 2 from step 0"):
            assert said[name] is None, f"{name}: refused or warned of on rank {rank}: {said[name]}"
