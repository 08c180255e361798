"""Layouts: world size x gradient-accumulation steps with the global batch held fixed, and the
command each layout runs (the user's own flags filled from placeholders).

Example::

    >>> [str(layout) for layout in parse_layouts("1x1,2x2")]
    ['1x1', '2x2']
    >>> fill(["train.py", "--bs", "{micro_batch}"], Layout(2, 2), global_batch=16)
    ['train.py', '--bs', '4']
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Sequence

from ..world.naming import public

__all__ = [
    "PLACEHOLDERS",
    "Layout",
    "LayoutError",
    "fill",
    "parse_layout",
    "parse_layouts",
    "per_node",
]

# What a command may say, filled per layout.
# {total_grad_accum}: the micro-batches of a step over every rank (W x A), as scripts take
# it that divide their accumulation steps by the world size themselves (nanoGPT's
# gradient_accumulation_steps). {nproc_per_node} and {nnodes}: the devices per node and the
# nodes a layout runs on, as Lightning's Trainer(devices=..., num_nodes=...) and litgpt's
# --devices take them (their product must be the world size).
PLACEHOLDERS = (
    "world_size",
    "grad_accum",
    "total_grad_accum",
    "micro_batch",
    "global_batch",
    "nproc_per_node",
    "nnodes",
)


@public
class LayoutError(ValueError):
    """A layout or a command that cannot be run as asked (a usage error).

    Example::

        >>> parse_layouts("2y2")
        Traceback (most recent call last):
        ...
        ddp_verify.LayoutError: layout '2y2': expected WxA ...
    """


@dataclasses.dataclass(frozen=True, order=True)
class Layout:
    """``world_size`` ranks, each accumulating ``grad_accum`` micro-batches per optimizer
    step; written ``WxA`` (``2x4``)."""

    world_size: int
    grad_accum: int

    def __str__(self) -> str:
        return f"{self.world_size}x{self.grad_accum}"

    def micro_batch(self, global_batch: int) -> int:
        """The micro-batch size that keeps ``global_batch`` samples per optimizer step."""
        split = self.world_size * self.grad_accum
        if global_batch % split:
            raise LayoutError(
                f"layout {self} splits a global batch of {global_batch} into {split} "
                f"micro-batches, which does not divide it: choose --global-batch as a multiple "
                f"of every layout's world size x accumulation steps"
            )
        return global_batch // split


def parse_layout(text: str) -> Layout:
    """``"2x4"`` as a :class:`Layout`; :class:`LayoutError` naming what is wrong."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise LayoutError(
            f"layout {text!r} is not WORLD_SIZExGRAD_ACCUM with both at least 1 (e.g. 2x4)"
        )
    return Layout(int(match[1]), int(match[2]))


def parse_layouts(text: str) -> list[Layout]:
    """``"1x1,1x4,4x1"`` as layouts, in order, each once."""
    layouts = [parse_layout(part) for part in text.split(",") if part.strip()]
    if not layouts:
        raise LayoutError("--layouts names no layout (e.g. --layouts 1x1,2x2,4x1)")
    return list(dict.fromkeys(layouts))


def fill(
    command: Sequence[str], layout: Layout, *, global_batch: int | None, nnodes: int = 1
) -> list[str]:
    """``command`` with ``{world_size}``, ``{grad_accum}``, ``{total_grad_accum}`` (W x A),
    ``{micro_batch}``, ``{global_batch}``, ``{nproc_per_node}`` and ``{nnodes}`` filled for
    ``layout`` spread over ``nnodes`` (one where it has one rank); :class:`LayoutError` for
    any other placeholder, or ``{micro_batch}`` without a global batch.

    Example::

        >>> fill(["train.py", "--gradient_accumulation_steps={total_grad_accum}"],
        ...      Layout(2, 4), global_batch=None)
        ['train.py', '--gradient_accumulation_steps=8']
    """
    values: dict[str, object] = {
        "world_size": layout.world_size,
        "grad_accum": layout.grad_accum,
        "total_grad_accum": layout.world_size * layout.grad_accum,
    }
    nodes = 1 if layout.world_size == 1 else nnodes
    values["nnodes"] = nodes
    values["nproc_per_node"] = per_node(layout, nodes)
    if global_batch is not None:
        values["global_batch"] = global_batch
        values["micro_batch"] = layout.micro_batch(global_batch)
    filled = []
    for part in command:
        for _, field, _, _ in string.Formatter().parse(part):
            if field is None:
                continue
            if field not in PLACEHOLDERS:
                raise LayoutError(
                    f"{part!r}: {{{field}}} is no placeholder; the command may use "
                    + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                )
            if field not in values:
                raise LayoutError(f"{part!r}: {{{field}}} needs --global-batch N")
        filled.append(part.format(**values))
    return filled


def used_placeholders(command: Sequence[str]) -> set[str]:
    """The placeholders ``command`` uses.

    Example::

        >>> sorted(used_placeholders(["train.py", "--bs", "{micro_batch}", "--x={grad_accum}"]))
        ['grad_accum', 'micro_batch']
    """
    return {
        field
        for part in command
        for _, field, _, _ in string.Formatter().parse(part)
        if field is not None
    }


def check_placeholders(
    command: Sequence[str], layouts: Sequence[Layout], *, global_batch: int | None
) -> None:
    """The command tells the script what each layout changes, or :class:`LayoutError` naming
    the placeholder it lacks (said before anything runs: otherwise every layout trains
    another global batch, and the difference reads as the data's): a ``--global-batch`` the
    script is told through ``{micro_batch}`` or ``{global_batch}``; accumulation through
    ``{grad_accum}``, or both batch sizes, from which a script can derive it.

    Example::

        >>> check_placeholders(["train.py", "--grad-accum", "{grad_accum}"], [Layout(2, 2)],
        ...                    global_batch=16)
        Traceback (most recent call last):
        ...
        ddp_verify.LayoutError: --global-batch 16 is given, but the command ...
    """
    used = used_placeholders(command)
    if global_batch is not None and not used & {"micro_batch", "global_batch"}:
        raise LayoutError(
            f"--global-batch {global_batch} is given, but the command never passes the script "
            "a batch size: each layout would train the script's own, not "
            f"{global_batch} samples a step. Put {{micro_batch}} where it takes the per-rank "
            "batch size (--batch-size {micro_batch}), or {global_batch} where it takes the "
            "global one"
        )
    accumulating = [str(layout) for layout in layouts if layout.grad_accum > 1]
    derivable = {"micro_batch", "global_batch"} <= used
    told = bool(used & {"grad_accum", "total_grad_accum"})
    if accumulating and not told and not derivable:
        raise LayoutError(
            (
                f"layouts {', '.join(accumulating)} accumulate"
                if len(accumulating) > 1
                else f"layout {accumulating[0]} accumulates"
            )
            + " gradients, but the command never passes the script how many "
            "micro-batches a step holds: put {grad_accum} where it takes them "
            "(--grad-accum {grad_accum}), or give it both {micro_batch} and {global_batch}"
        )


def per_node(layout: Layout, nnodes: int) -> int:
    """The ranks each of ``nnodes`` nodes runs at ``layout``; :class:`LayoutError` where they
    do not divide.

    Example::

        >>> per_node(Layout(4, 1), 2)
        2
    """
    if layout.world_size % nnodes:
        raise LayoutError(
            f"layout {layout}: {layout.world_size} rank(s) do not divide over {nnodes} nodes; "
            "give layouts whose world size is a multiple of --nnodes"
        )
    return layout.world_size // nnodes
