"""Layouts: how a run spreads over ranks (data parallel, FSDP2's shard and replicate degrees,
tensor, context and pipeline parallel) and how many micro-batches each optimizer step
accumulates, with the global batch held fixed; and the command each layout runs (the user's
own flags filled from placeholders).

A layout is written ``WxA`` (``2x4``: 2 data-parallel ranks, 4 micro-batches a step), or as
axes joined by dots, each a name and its degree: ``dp`` (plain data parallel, DDP),
``dp_replicate`` and ``dp_shard`` (FSDP2; both: HSDP), ``cp`` (context parallel), ``tp``
(tensor parallel), ``pp`` (pipeline stages) and ``a`` (micro-batches a step: accumulation,
or a pipeline schedule's micro-batches), as in ``dp2.pp2.a2``. The world size is the product
of the degrees; the ranks that hold distinct samples are the data-parallel ones
(``dp x dp_replicate x dp_shard``), which the global batch is split over.

Example::

    >>> [str(layout) for layout in parse_layouts("1x1,2x2,dp_shard2.tp2,dp2.pp2.a2")]
    ['1x1', '2x2', 'dp_shard2.tp2', 'dp2.pp2.a2']
    >>> fill(["train.py", "--bs", "{micro_batch}"], Layout(2, 2), global_batch=16)
    ['train.py', '--bs', '4']
    >>> parse_layout("dp2.tp2").world_size, parse_layout("dp2.tp2").data_parallel
    (4, 2)
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from collections.abc import Sequence

from ..world.naming import public

__all__ = [
    "AXES",
    "PLACEHOLDERS",
    "Layout",
    "LayoutError",
    "fill",
    "parse_layout",
    "parse_layouts",
    "per_node",
]

# The parallel axes a layout may name besides plain data parallel (dp) and accumulation (a),
# in the order a layout is written.
AXES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")

# What a command may say, filled per layout.
# {total_grad_accum}: the micro-batches of a step over every data-parallel rank (D x A), as
# scripts take it that divide their accumulation steps by the world size themselves
# (nanoGPT's gradient_accumulation_steps). {nproc_per_node} and {nnodes}: the devices per
# node and the nodes a layout runs on, as Lightning's Trainer(devices=..., num_nodes=...) and
# litgpt's --devices take them (their product must be the world size). {dp} ... {pp}: each
# axis's degree (1 where the layout does not name it), {data_parallel} their product over the
# data-parallel axes, as torchtitan's --parallelism.* flags take them.
PLACEHOLDERS = (
    "world_size",
    "grad_accum",
    "total_grad_accum",
    "micro_batch",
    "global_batch",
    "nproc_per_node",
    "nnodes",
    "dp",
    *AXES,
    "data_parallel",
)


@public
class LayoutError(ValueError):
    """A layout or a command that cannot be run as asked (a usage error).

    Example::

        >>> parse_layouts("2y2")
        Traceback (most recent call last):
        ...
        ddp_verify.LayoutError: layout '2y2' is neither WORLD_SIZExGRAD_ACCUM (2x4) nor ...
    """


@dataclasses.dataclass(frozen=True, order=True)
class Layout:
    """``world_size`` ranks, each accumulating ``grad_accum`` micro-batches per optimizer
    step; the degrees of the parallel axes besides plain data parallel (1: not used), whose
    product divides ``world_size``: what remains is ``dp``. Written ``WxA`` (``2x4``) where
    only data parallel is used, else ``dp2.tp2.a2`` (see the module text).

    Example::

        >>> Layout(4, 2, tp=2).dp, str(Layout(4, 2, tp=2))
        (2, 'dp2.tp2.a2')
    """

    world_size: int
    grad_accum: int
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        degrees = {axis: getattr(self, axis) for axis in AXES}
        if self.world_size < 1 or self.grad_accum < 1 or min(degrees.values()) < 1:
            raise LayoutError(f"layout {self!r}: every degree and count is at least 1")
        if self.world_size % math.prod(degrees.values()):
            raise LayoutError(
                f"layout {self!r}: {self.world_size} rank(s) are not a multiple of the degrees "
                f"{' x '.join(f'{a}{d}' for a, d in degrees.items() if d > 1)}"
            )

    @property
    def dp(self) -> int:
        """Plain data-parallel ranks (DDP): what the other axes leave of the world."""
        return self.world_size // math.prod(getattr(self, axis) for axis in AXES)

    @property
    def data_parallel(self) -> int:
        """The ranks that hold distinct samples: every data-parallel axis's degree."""
        return self.dp * self.dp_replicate * self.dp_shard

    @property
    def degrees(self) -> dict[str, int]:
        """Each axis's degree, ``dp`` first, ``a`` (the micro-batches) last."""
        return {"dp": self.dp, **{axis: getattr(self, axis) for axis in AXES}, "a": self.grad_accum}

    @property
    def plain(self) -> bool:
        """Whether only data parallel and accumulation are used (written ``WxA``)."""
        return all(getattr(self, axis) == 1 for axis in AXES)

    def __str__(self) -> str:
        if self.plain:
            return f"{self.world_size}x{self.grad_accum}"
        return ".".join(f"{axis}{d}" for axis, d in self.degrees.items() if d > 1) or "1x1"

    def micro_batch(self, global_batch: int) -> int:
        """The micro-batch size that keeps ``global_batch`` samples per optimizer step."""
        split = self.data_parallel * self.grad_accum
        if global_batch % split:
            raise LayoutError(
                f"layout {self} splits a global batch of {global_batch} into {split} "
                f"micro-batches, which does not divide it: choose --global-batch as a multiple "
                f"of every layout's data-parallel ranks x accumulation steps"
            )
        return global_batch // split


_WXA = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*")
_PART = re.compile(r"([a-z_]+?)(\d+)")


def parse_layout(text: str) -> Layout:
    """``"2x4"`` or ``"dp2.pp2.a2"`` as a :class:`Layout`; :class:`LayoutError` naming what
    is wrong.

    Example::

        >>> parse_layout("dp_shard2.dp_replicate2")
        Layout(world_size=4, grad_accum=1, dp_replicate=2, dp_shard=2, cp=1, tp=1, pp=1)
    """
    match = _WXA.fullmatch(text)
    if match:
        if int(match[1]) < 1 or int(match[2]) < 1:
            raise LayoutError(f"layout {text!r}: both WORLD_SIZE and GRAD_ACCUM are at least 1")
        return Layout(int(match[1]), int(match[2]))
    names = ("dp", *AXES, "a")
    given: dict[str, int] = {}
    for part in text.strip().split("."):
        found = _PART.fullmatch(part.strip())
        if not found or found[1] not in names or int(found[2]) < 1:
            raise LayoutError(
                f"layout {text!r} is neither WORLD_SIZExGRAD_ACCUM (2x4) nor axes joined by "
                f"dots, each a name of {', '.join(names)} and a degree of at least 1 "
                f"(dp2.pp2.a2); {part!r} is not one"
            )
        if found[1] in given:
            raise LayoutError(f"layout {text!r} names {found[1]} twice")
        given[found[1]] = int(found[2])
    if given.get("dp", 1) > 1 and given.get("dp_replicate", 1) * given.get("dp_shard", 1) > 1:
        raise LayoutError(
            f"layout {text!r}: dp is plain data parallel (DDP), dp_replicate and dp_shard "
            "FSDP2's: say the data-parallel ranks one way (HSDP is dp_replicate2.dp_shard2)"
        )
    degrees = {axis: given.get(axis, 1) for axis in AXES}
    world = given.get("dp", 1) * math.prod(degrees.values())
    return Layout(world, given.get("a", 1), **degrees)


def parse_layouts(text: str) -> list[Layout]:
    """``"1x1,1x4,4x1"`` as layouts, in order, each once."""
    layouts = [parse_layout(part) for part in text.split(",") if part.strip()]
    if not layouts:
        raise LayoutError("--layouts names no layout (e.g. --layouts 1x1,2x2,4x1)")
    return list(dict.fromkeys(layouts))


def fill(
    command: Sequence[str], layout: Layout, *, global_batch: int | None, nnodes: int = 1
) -> list[str]:
    """``command`` with ``{world_size}``, ``{grad_accum}``, ``{total_grad_accum}`` (D x A),
    ``{micro_batch}``, ``{global_batch}``, ``{nproc_per_node}``, ``{nnodes}`` and each axis's
    degree (``{dp}``, ``{tp}``, ..., ``{data_parallel}``) filled for ``layout`` spread over
    ``nnodes`` (one where it has one rank); :class:`LayoutError` for any other placeholder,
    or ``{micro_batch}`` without a global batch.

    Example::

        >>> fill(["train.py", "--gradient_accumulation_steps={total_grad_accum}"],
        ...      Layout(2, 4), global_batch=None)
        ['train.py', '--gradient_accumulation_steps=8']
    """
    values: dict[str, object] = {
        "world_size": layout.world_size,
        "grad_accum": layout.grad_accum,
        "total_grad_accum": layout.data_parallel * layout.grad_accum,
        "data_parallel": layout.data_parallel,
        **{axis: d for axis, d in layout.degrees.items() if axis != "a"},
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
    ``{grad_accum}``, or both batch sizes, from which a script can derive it; each parallel
    axis a layout uses through its degree's placeholder (``{tp}``, ...).

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
    for axis in AXES:
        using = [str(layout) for layout in layouts if getattr(layout, axis) > 1]
        if using and axis not in used:
            raise LayoutError(
                f"layout {using[0]} has {axis} {getattr(parse_layout(using[0]), axis)}, but "
                f"the command never passes the script that degree: put {{{axis}}} where it "
                f"takes it (--{axis.replace('_', '-')} {{{axis}}}), or the script runs every "
                "rank as plain data parallel"
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
