"""Uneven numbers of batches per rank under ``Join``: DDP (or the ``--ddp-wrapper``) must give
what torch documents, computed on one process by :mod:`ddp_verify.conformance.uneven_batches`."""

from __future__ import annotations

from ddp_verify.conformance.uneven_batches import check_join, join_runs


def test_join_with_uneven_batch_counts_follows_the_documented_semantics(
    world, data_parallel, prove
):
    # Both ways in: Join([model], ...) and DDP's own model.join(...), which passes the flag on.
    method = data_parallel(needs=("join_hook", "join"))
    prove(join_runs(world_size=world.size), lambda run: check_join(world, run, method))
