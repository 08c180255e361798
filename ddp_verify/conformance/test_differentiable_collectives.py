"""``torch.distributed.nn.functional``'s collectives, which carry gradients: each must give
the collective's value forward and, backward, the gradient of the sum of every rank's loss,
the closed form its definition gives (an all-gather's input gradient sums what every rank's
loss sends back to it; an all-reduce's sums every rank's; a broadcast's reaches the source
only). Contrastive losses gather features across ranks with these; an average where a sum
belongs, or a gradient left local, trains the towers at 1/W of their gradient."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from ddp_verify.conformance import jobs

# Small integers: every sum is exact in float64, so the closed form is met exactly.
VALUES = st.integers(-4, 4).map(float)


def cases(world_size: int, outputs: int) -> st.SearchStrategy:
    """(inputs per rank, weights per rank per output, source rank)."""
    return st.integers(1, 4).flatmap(
        lambda n: st.tuples(
            st.lists(st.lists(VALUES, min_size=n, max_size=n), min_size=world_size,
                     max_size=world_size),
            st.lists(
                st.lists(st.lists(VALUES, min_size=n, max_size=n), min_size=outputs,
                         max_size=outputs),
                min_size=world_size, max_size=world_size,
            ),
            st.integers(0, world_size - 1),
        )
    )  # fmt: skip


def _sum(vectors):
    return [sum(column) for column in zip(*vectors, strict=True)]


@pytest.mark.parametrize("kind", ["all_gather", "all_reduce", "broadcast"])
def test_differentiable_collectives_give_the_gradient_of_every_ranks_loss(world, prove, kind):
    size = world.size
    outputs = size if kind == "all_gather" else 1

    def check(case):
        inputs, weights, src = case
        results = world.run(jobs.differentiable_collective, kind, inputs, weights, src)
        if kind == "all_gather":
            forward = inputs
        elif kind == "all_reduce":
            forward = [_sum(inputs)]
        else:
            forward = [inputs[src]]
        for rank, (got, grad) in enumerate(results):
            assert got == forward, (
                f"torch.distributed.nn.functional.{kind} gave rank {rank} {got}, the ranks "
                f"sent {inputs}: expected {forward}"
            )
            if kind == "all_gather":
                # d(sum_k loss_k)/d input_r = sum_k weights[k][r]
                want = _sum([weights[k][rank] for k in range(size)])
            elif kind == "all_reduce" or rank == src:
                want = _sum([weights[k][0] for k in range(size)])
            else:
                want = [0.0] * len(inputs[rank])
            assert grad == want, (
                f"torch.distributed.nn.functional.{kind}: rank {rank}'s input gradient is "
                f"{grad}; the gradient of the sum of every rank's loss is {want} (weights "
                f"{weights}{f', source {src}' if kind == 'broadcast' else ''})"
            )

    prove(cases(size, outputs), check)
