"""The trace: what a method's run produced, step by step and rank by rank."""

from __future__ import annotations

import ctypes
import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import torch

from ..world import wire

Tensors = dict[str, torch.Tensor]


# One optimizer step's settings: per param group, (name, value) pairs.
Settings = tuple[tuple[tuple[str, float], ...], ...]
# The settings recorded of each group, where the optimizer has them (betas split in two).
SETTINGS = ("lr", "momentum", "beta1", "beta2", "weight_decay")


def optimizer_settings(optimizer: torch.optim.Optimizer) -> Settings:
    """What ``optimizer`` would step with now, per param group: its lr, momentum, betas and
    weight decay, those it has.

    Example::

        >>> sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
        >>> optimizer_settings(sgd)
        ((('lr', 0.1), ('momentum', 0.9), ('weight_decay', 0.0)),)
    """
    found = []
    for group in optimizer.param_groups:
        values = dict(group)
        betas = values.pop("betas", None)
        if isinstance(betas, (tuple, list)) and len(betas) == 2:
            values["beta1"], values["beta2"] = betas
        pairs = []
        for name in SETTINGS:
            value = values.get(name)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                pairs.append((name, float(value)))
        found.append(tuple(pairs))
    return tuple(found)


@dataclasses.dataclass
class RankTrace:
    """One rank's record: per step the global loss it reports, its gradients just before the
    optimizer step (``None`` where the method cannot show them) and its parameters after it."""

    losses: list[float] = dataclasses.field(default_factory=list)
    grads: list[dict[str, torch.Tensor | None]] | None = dataclasses.field(default_factory=list)
    params: list[Tensors] = dataclasses.field(default_factory=list)
    # Per step, each time the code under check stepped the optimizer, where it owns the step:
    # the settings of every param group then, (name, value) pairs (lr, momentum, beta1, beta2,
    # weight_decay: see optimizer_settings). The harness's loops step once, at the scenario's
    # settings; None: not recorded.
    optimizer_calls: list[list[Settings]] | None = None
    # The global ranks of each process group besides the default one that the rank held
    # after training (the groups the code under check made); None: not recorded.
    groups: tuple[tuple[int, ...], ...] | None = None
    # The flat form a received trace arrived in, by field: grads and params are unpacked from
    # it on first use (the comparison of a passing example never needs them one by one).
    _arrived: dict[str, tuple[Layout, torch.Tensor]] = dataclasses.field(
        default_factory=dict, repr=False, compare=False
    )
    # What a comparison worked out from this record ahead of time (see
    # engine.compare.prepare_comparison); never sent with the trace.
    _memo: dict[str, Any] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # Steps recorded here by `record`, by field: their layout and one flat copy per step,
    # the form `packed` sends; unpacked into grads or params only if read on this side.
    _recording: dict[str, tuple[Layout, list[torch.Tensor]]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes the instance lacks: a received trace's unpacked fields,
        # or steps recorded flat here.
        if name in ("grads", "params"):
            recording = self.__dict__.get("_recording", {}).get(name)
            arrived = self.__dict__.get("_arrived", {}).get(name)
            if recording is not None:
                steps = _unpack(recording[0], _joined(recording[1]))
            elif arrived is not None:
                steps = _unpack(*arrived)
            else:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            setattr(self, name, steps)
            return steps
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        # Steps recorded flat are replaced with the field, never kept beside it.
        if name in ("grads", "params"):
            self.__dict__.get("_recording", {}).pop(name, None)
        object.__setattr__(self, name, value)

    def record(self, field: str, tensors: Iterable[tuple[str, torch.Tensor | None]]) -> None:
        """Append one step to ``grads`` or ``params``: each named tensor (``None`` for a missing
        gradient) copied now, all of them in one flat tensor.

        A rank records every parameter and gradient at every step and sends them home after
        every example: one copy per step, in the flat form :meth:`packed` sends, costs a
        fraction of a copy per tensor (as :func:`parameters` makes) packed afterwards.

        Example::

            >>> trace = RankTrace()
            >>> trace.record("params", [("w", torch.ones(2, 1)), ("b", torch.zeros(1))])
            >>> trace.recorded("params"), trace.params[0]["w"].shape
            (1, torch.Size([2, 1]))
        """
        entry: list[tuple[str, tuple[int, ...] | None, torch.dtype | None]] = []
        values: list[torch.Tensor] = []
        with torch.no_grad():  # the copy is no part of any graph (and needs no detach)
            for name, tensor in tensors:
                if tensor is None:
                    entry.append((name, None, None))
                    continue
                full = getattr(tensor, "full_tensor", None)  # a DTensor: a collective
                value = full() if full is not None else tensor
                entry.append((name, tuple(value.shape), value.dtype))
                values.append(value.reshape(-1))
            flat = _copied_flat(values)
        recording = self._recording.get(field)
        if recording is None:
            steps = self.__dict__.get(field, ())
            if field == "grads" and steps is None:
                raise ValueError("this trace records no gradients (its grads are None)")
            if steps or field not in self.__dict__:
                # Steps held one by one already (or received): the new one joins them so.
                getattr(self, field).append(_unpack([entry], flat.to(torch.float64))[0])
                return
            del self.__dict__[field]  # read back through __getattr__, if ever
            recording = self._recording[field] = ([], [])
        recording[0].append(entry)
        recording[1].append(flat)

    def __reduce__(self) -> tuple[Any, ...]:
        # A rank sends its trace home after every example: one flat buffer of raw bytes per
        # field pickles many times faster than a tensor per parameter per step (a pickled
        # tensor goes through torch's storage serialisation, ~0.3 ms each).
        fields = []
        for field in ("grads", "params"):
            packed = self.packed(field)
            fields.append(None if packed is None else (packed[0], _raw_bytes(packed[1])))
        return (
            _unpack_rank_trace,
            (self.losses, *fields, self.optimizer_calls, self.groups),
        )

    def recorded(self, field: str) -> int | None:
        """How many steps ``grads`` or ``params`` hold (None without gradients), without
        unpacking a received trace or one recorded flat."""
        if field in self._recording:
            return len(self._recording[field][0])
        if field in self._arrived and field not in self.__dict__:
            return len(self._arrived[field][0])
        steps = getattr(self, field)
        return None if steps is None else len(steps)

    def layout(self, field: str) -> Layout | None:
        """The names, shapes and dtypes of ``grads`` or ``params`` at each step (a missing
        gradient's shape None), read without unpacking; None without gradients."""
        if self.as_arrived(field):
            return self._arrived[field][0]
        if field in self._recording:
            return self._recording[field][0]
        steps = getattr(self, field)
        if steps is None:
            return None
        return [
            [
                (n, None if t is None else tuple(t.shape), None if t is None else t.dtype)
                for n, t in record.items()
            ]
            for record in steps
        ]

    def as_arrived(self, field: str) -> bool:
        """Whether ``grads`` or ``params`` is still the flat form the trace arrived in:
        never unpacked, so never edited."""
        return field in self._arrived and field not in self.__dict__

    def packed(self, field: str) -> tuple[Layout, torch.Tensor] | None:
        """``grads`` or ``params`` as ``(layout, flat float64 tensor)``: per step, per tensor,
        its name, shape and dtype, and every value in order (None without gradients)."""
        if self.as_arrived(field):
            return self._arrived[field]  # never unpacked, so never edited
        if field in self._recording:
            layout, chunks = self._recording[field]
            return layout, _joined(chunks).to("cpu")
        steps = getattr(self, field)
        # Packed afresh each time: a cached copy would go stale if a tensor were replaced.
        return None if steps is None else _pack(steps)


@dataclasses.dataclass
class Trace:
    """Every rank's record of one run of one method; the reference has a single "rank"."""

    method: str
    ranks: list[RankTrace]

    @property
    def steps(self) -> int:
        return self.ranks[0].recorded("params") or 0

    @property
    def has_grads(self) -> bool:
        return all(r.recorded("grads") == self.steps for r in self.ranks)


def stepped_gradients(ranks: list[RankTrace]) -> list[RankTrace]:
    """``ranks``, each rank's missing gradient of a parameter that another rank stepped
    taken from the first rank that did: where each rank records the gradients its optimizer
    steps on, a partitioned optimizer (ZeRO's: each rank steps the parameters it owns, the
    others' gradients dropped) has each parameter's gradient on its owner alone. Ranks that
    hold one still must agree; parameters are each rank's own, so a parameter never sent
    back from its owner still diverges. Traces with nothing to fill are returned unread.

    Example::

        >>> a, b = RankTrace([0.0]), RankTrace([0.0])
        >>> a.record("grads", [("w", torch.ones(1)), ("v", None)])
        >>> b.record("grads", [("w", None), ("v", torch.zeros(1))])
        >>> filled = stepped_gradients([a, b])
        >>> [sorted((n, float(g)) for n, g in r.grads[0].items()) for r in filled]
        [[('v', 0.0), ('w', 1.0)], [('v', 0.0), ('w', 1.0)]]
    """
    layouts = [r.layout("grads") for r in ranks]
    if any(layout is None for layout in layouts) or len(ranks) < 2:
        return ranks
    held: list[dict[str, int]] = []  # per step: a parameter's first rank holding its gradient
    for step in range(min(len(layout) for layout in layouts)):  # type: ignore[arg-type]
        firsts: dict[str, int] = {}
        for rank, layout in enumerate(layouts):
            for name, shape, _ in layout[step]:  # type: ignore[index]
                if shape is not None:
                    firsts.setdefault(name, rank)
        held.append(firsts)
    gaps = [
        (rank, step, name)
        for rank, layout in enumerate(layouts)
        for step, firsts in enumerate(held)
        for name, shape, _ in layout[step]  # type: ignore[index]
        if shape is None and name in firsts
    ]
    for rank, step, name in gaps:
        mine, holder = ranks[rank].grads, ranks[held[step][name]].grads
        assert mine is not None and holder is not None  # both have a layout
        mine[step][name] = holder[step][name]
    return ranks


def parameters(model: torch.nn.Module) -> Tensors:
    """A detached copy of every parameter, by name (shared parameters once); a sharded one
    (FSDP's DTensor) gathered whole, in the same order on every rank."""
    return {name: _whole(p) for name, p in model.named_parameters()}


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """A copy of every trainable parameter's gradient, ``None`` where it has none; sharded ones
    gathered whole, as :func:`parameters` does."""
    return {
        name: None if p.grad is None else _whole(p.grad)
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    value = tensor.detach()
    full = getattr(value, "full_tensor", None)  # a DTensor: a collective on every rank
    return (full() if full is not None else value).clone()


def named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor | None]]:
    """What :func:`parameters` copies, not copied: for :meth:`RankTrace.record`."""
    return list(model.named_parameters())


def named_gradients(model: torch.nn.Module) -> list[tuple[str, torch.Tensor | None]]:
    """What :func:`gradients` copies, not copied: for :meth:`RankTrace.record`."""
    return [(name, p.grad) for name, p in model.named_parameters() if p.requires_grad]


def _copied_flat(values: list[torch.Tensor]) -> torch.Tensor:
    """Flat tensors joined in one copy, in their dtype where they share one (float64, exact for
    every float dtype, where they do not), on their device where they share one (the CPU
    where they do not: a model laid over several devices)."""
    if not values:
        return torch.zeros(0, dtype=torch.float64)
    dtype, device = values[0].dtype, values[0].device
    if any(v.device != device for v in values):
        values = [v.to("cpu", torch.float64) for v in values]
    elif any(v.dtype != dtype for v in values):
        values = [v.to(torch.float64) for v in values]
    return torch.cat(values)  # a copy, even of one tensor: the record never aliases the model


def _joined(chunks: list[torch.Tensor]) -> torch.Tensor:
    """Steps recorded flat, as one float64 tensor."""
    return _copied_flat(chunks).to(torch.float64)


# Per step, per tensor: its name, and its shape and dtype (None for a missing gradient).
Layout = list[list[tuple[str, tuple[int, ...] | None, torch.dtype | None]]]


def step_lengths(layout: Layout) -> list[int]:
    """How many values each step holds in a packed flat tensor."""
    return [sum(_numel(shape) for _, shape, _ in entry if shape is not None) for entry in layout]


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _pack(steps: list[dict[str, torch.Tensor | None]]) -> tuple[Layout, torch.Tensor]:
    """Every tensor of every step in one float64 tensor (exact for every float dtype)."""
    layout: Layout = []
    chunks = []
    for record in steps:
        entry: list[tuple[str, tuple[int, ...] | None, torch.dtype | None]] = []
        for name, tensor in record.items():
            if tensor is None:
                entry.append((name, None, None))
            else:
                entry.append((name, tuple(tensor.shape), tensor.dtype))
                chunks.append(tensor.detach().reshape(-1).to("cpu", torch.float64))
        layout.append(entry)
    flat = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.float64)
    return layout, flat


def _raw_bytes(flat: torch.Tensor) -> bytes:
    """A contiguous CPU tensor's memory as bytes, in one copy. Not ``.numpy().tobytes()``:
    torch runs without numpy, and so must the harness."""
    flat = flat.contiguous()
    return ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size())


def _unpack(layout: Layout, flat: torch.Tensor) -> list[dict[str, Any]]:
    # One conversion per dtype, then views: a conversion per tensor costs more than the rest.
    dtypes = {dtype for entry in layout for _, _, dtype in entry if dtype is not None}
    as_dtype = {dtype: flat.to(dtype) for dtype in dtypes}
    steps: list[dict[str, Any]] = []
    offset = 0
    for entry in layout:
        record: dict[str, Any] = {}
        for name, shape, dtype in entry:
            if shape is None:
                record[name] = None
                continue
            count = _numel(shape)
            record[name] = as_dtype[dtype][offset : offset + count].view(shape)
            offset += count
        steps.append(record)
    return steps


@wire.reducer
def _unpack_rank_trace(
    losses: list[float],
    grads: tuple[Layout, bytes] | None,
    params: tuple[Layout, bytes] | None,
    optimizer_calls: list[list[Settings]] | None = None,
    groups: tuple[tuple[int, ...], ...] | None = None,
) -> RankTrace:
    trace = RankTrace(losses)
    trace.grads = None
    trace.optimizer_calls = optimizer_calls
    trace.groups = groups
    for field, packed in (("grads", grads), ("params", params)):
        if packed is None:
            continue
        layout, raw = packed
        flat = (
            torch.frombuffer(bytearray(raw), dtype=torch.float64)
            if raw
            else torch.zeros(0, dtype=torch.float64)
        )
        del trace.__dict__[field]  # unpacked on first use, by __getattr__
        trace._arrived[field] = (layout, flat)
    return trace
