"""Uneven numbers of batches per rank under ``Join``: DDP (or the ``--ddp-wrapper``) must give
what torch documents, computed on one process by :mod:`ddp_verify.conformance.uneven_batches`."""

from __future__ import annotations

import pytest

from ddp_verify.conformance import jobs
from ddp_verify.conformance.known import known_torch_issue
from ddp_verify.conformance.uneven_batches import JoinRun, check_join, join_runs
from ddp_verify.engine.scenario import Scenario


def test_join_with_uneven_batch_counts_follows_the_documented_semantics(
    world, data_parallel, prove
):
    # Both ways in: Join([model], ...) and DDP's own model.join(...), which passes the flag on.
    method = data_parallel(needs=("join_hook", "join"))
    prove(join_runs(world_size=world.size), lambda run: check_join(world, run, method))


@known_torch_issue(
    "documented limit: ZeroRedundancyOptimizer's join hook steps a joined rank's shard with "
    "the gradients that rank holds ('Gradients must be properly set before this hook is "
    "called'), and DDP's join hook all-reduces zeros for it and discards the result: under "
    "Join([model, optimizer]) the shards of ranks out of batches step on stale gradients",
    raises=AssertionError,
    match=r"under Join, rank \d+'s parameter .*\n.*Join\(\[model, ZeroRedundancyOptimizer\]",
)
def test_join_with_zero_redundancy_optimizer_follows_the_documented_semantics(
    world, data_parallel, prove
):
    # Join([model, ZeroRedundancyOptimizer]): a rank that has run out of batches still steps
    # its shard (the optimizer's join hook) so that the ranks still training get its
    # parameters; held to the same documented semantics as DDP alone.
    if world.size < 2:
        pytest.skip("a world of 1 has no rank to run out of batches first")
    method = data_parallel(needs=("join_hook",))
    size = world.size
    one_short = JoinRun(
        Scenario(world_size=size, schedule=(((1,),) * size,) * 2), (2,) + (1,) * (size - 1),
        zero=True,
    )  # fmt: skip
    prove(
        join_runs(world_size=size, zero=True),
        lambda run: check_join(world, run, method),
        examples=[one_short],
    )


@pytest.mark.parametrize("shortest", ["rank_0", "the_last_rank", "every_other_rank"])
def test_join_starts_each_forward_from_the_buffers_of_a_rank_still_training(world, shortest):
    # With broadcast_buffers, each forward starts from one rank's buffers; under Join the ranks
    # agree on one that still trains (torch's code: rank 0 "may already have been joined and
    # have stale module buffers"). Every rank still training at iteration t must start it from
    # the running statistics some such rank held after iteration t - 1, all from the same.
    if world.size < 2:
        pytest.skip("a world of 1 has no rank to run out of batches first")
    last = world.size - 1
    batches = {
        "rank_0": [1] + [3] * last,
        "the_last_rank": [3] * last + [1],
        "every_other_rank": [3 if r % 2 else 1 for r in range(world.size)],
    }[shortest]
    starts, after = zip(*world.run(jobs.join_buffer_sources, batches), strict=True)
    for t in range(1, max(batches)):
        active = [r for r in range(world.size) if batches[r] > t]
        begun = {tuple(starts[r][t]) for r in active}
        held = {r: after[r][t - 1] for r in active}
        assert len(begun) == 1, f"batches {batches}, iteration {t}: {active} began from {begun}"
        assert list(next(iter(begun))) in held.values(), (
            f"batches {batches}, iteration {t}: the ranks still training began from running "
            f"means {begun}, none of which a rank still training held after the iteration "
            f"before ({held}); each rank's after each iteration: {after}"
        )


def test_join_throwing_on_early_termination_stops_every_rank_where_the_first_runs_out(world, prove):
    # Join(throw_on_early_termination=True): once a rank has run out of batches, every rank
    # raises a RuntimeError instead of shadowing it, having finished as many steps as the
    # shortest; with batches even, none raises.
    from hypothesis import strategies as st

    def check(batches: list[int]) -> None:
        shortest, uneven = min(batches), len(set(batches)) > 1
        for rank, got in enumerate(world.run(jobs.join_throwing, batches)):
            said = f"batches {batches}, rank {rank}"
            assert got["done"] == shortest, (
                f"{said}: finished {got['done']} steps, not the shortest rank's {shortest}"
            )
            if uneven:
                assert got["raised"] is not None, f"{said}: no error once a rank ran out"
            else:
                assert got["raised"] is None, f"{said}: raised {got['raised']}, inputs even"

    size = world.size
    prove(
        st.lists(st.integers(0, 3), min_size=size, max_size=size),
        check,
        examples=[[1] * size, [2 + (r % 2) for r in range(size)]],
    )


@pytest.mark.parametrize("enable", [False, True], ids=["disabled", "enabled"])
def test_join_disabled_does_nothing_and_enabled_tells_the_context_each_step(world, enable):
    # Join(enable=False) "disables the context manager's functionality": no joinable is told
    # to notify it (notify_join_context returns None, no all-reduce), and with even batches
    # training is plain DDP's. Enabled, the first joinable gets a work handle every step.
    # Rank r's inputs are all r + 1 (3 rows, loss the sum): every step's gradient is the
    # mean of 3 (r + 1) for each weight and 3 for the bias, whatever the parameters.
    size, steps = world.size, 2
    mean_weight = 3 * (size + 1) / 2
    want = [[-0.5 * steps * mean_weight] * 2, [-0.5 * steps * 3.0]]
    for rank, got in enumerate(world.run(jobs.join_disabled, steps, enable)):
        assert got["handles"] == [enable] * steps, (
            f"Join(enable={enable}) on rank {rank}: notify_join_context gave a work handle at "
            f"steps {got['handles']}, expected {'every step' if enable else 'none'}"
        )
        assert got["params"] == want, (
            f"Join(enable={enable}), {steps} even steps on rank {rank}: parameters "
            f"{got['params']}, plain DDP gives {want}"
        )
