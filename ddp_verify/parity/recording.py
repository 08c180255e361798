"""A layout's recording, as the recorder left it in its directory: one file per rank, read as
data (``torch.load(weights_only=True)``), checked complete, and seen as the engine's
:class:`~ddp_verify.engine.trace.Trace` for the comparison.

Example::

    recording = Recording.load(Path("rec/2x2"))
    recording.world_size, recording.steps, recording.samples(0)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

import torch

from ..engine.trace import RankTrace, Trace
from ..world.naming import public
from .layouts import Layout, LayoutError, parse_layout
from .recorder import recording_path

__all__ = ["Pads", "Recording", "RecordingError", "as_seen_by", "canonical", "pads_between"]

# Per input (a forward's argument position or keyword), the digest of the value that pads
# its rows; an input not named is not padded.
Pads = dict[str, str]


def _parts(row: str) -> list[tuple[str, list[str]]]:
    """A fingerprint's inputs and the forms of each (an older recording's bare digest is one
    input of one form)."""
    if "=" not in row:
        return [("", [row])]
    return [(key, forms.split("/")) for key, _, forms in (p.partition("=") for p in row.split())]


def canonical(row: str, pads: Pads | None = None) -> str:
    """A sample's identity: per input its whole row, or where the row ends in its input's
    pad value, the row without that trailing run.

    Example::

        >>> canonical("0=full/zero/short", {"0": "zero"})
        '0=short'
        >>> canonical("0=full/seven/short", {"0": "zero"})
        '0=full'
    """
    pads = pads or {}
    said = []
    for key, forms in _parts(row):
        padded = len(forms) == 3 and pads.get(key) == forms[1]
        said.append(f"{key}={forms[2] if padded else forms[0]}" if key else forms[0])
    return " ".join(said)


def pads_between(reference: Recording, other: Recording, steps: int) -> Pads:
    """The pad value of each input that makes the two recordings train the same samples at
    the most steps. Each input's candidates are no padding and the values most rows of
    either recording end in, tried in every combination (inputs padded together, the ids
    with the pad id and the labels with -100, agree only together); the fewest pads win a
    tie, no padding where nothing agrees more. Evidence, not a guess of the
    pad id: a value that pads rows in one layout and not another is what makes the steps'
    samples agree.

    Example::

        pads = pads_between(reference, other, steps=3)  # {'input_ids': '9f2c...'}
    """
    ends: dict[str, collections.Counter[str]] = {}
    for recording in (reference, other):
        for key, counts in recording.trailing().items():
            ends.setdefault(key, collections.Counter()).update(counts)

    def agreeing(pads: Pads) -> int:
        return sum(reference.samples(s, pads) == other.samples(s, pads) for s in range(steps))

    keys = sorted(ends)
    options: list[list[str | None]] = [
        [None, *(v for v, _ in ends[k].most_common(3))] for k in keys
    ]
    best: Pads = {}
    score = agreeing(best)
    if math.prod(len(o) for o in options) <= 256:
        # Every combination: inputs padded together (ids and labels) agree only together.
        for values in itertools.product(*options):
            tried = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
            found = agreeing(tried)
            if found > score or (found == score and found and len(tried) < len(best)):
                best, score = tried, found
        return best
    for key, choices in zip(keys, options, strict=True):  # too many: each input in turn
        for value in choices[1:]:
            if value is not None and agreeing({**best, key: value}) > score:
                best = {**best, key: value}
                score = agreeing(best)
    return best


def as_seen_by(reference: Recording, other: Recording, steps: int) -> Recording | None:
    """The reference's samples as ``other``'s ranks see them: the reference itself, or where
    ``other`` is context parallel, its samples cut into the pieces that degree's ranks hold,
    in order or load-balanced, whichever trains the same samples at the most steps (evidence,
    not a guess of the script's cut). None where the reference recorded no such pieces.

    Example::

        seen = as_seen_by(reference, other, steps=3)  # reference, or its cut "2" or "2z"
    """
    degree = other.layout.cp
    if degree == 1:
        return reference
    cuts = [c for c in (reference.cut(f"{degree}"), reference.cut(f"{degree}z")) if c]
    if not cuts:
        return None

    def agreeing(cut: Recording) -> int:
        pads = pads_between(cut, other, steps)
        return sum(cut.samples(s, pads) == other.samples(s, pads) for s in range(steps))

    # The first (in order) wins a tie: where nothing tells them apart, either is as good.
    return max(cuts, key=agreeing)


@public
class RecordingError(ValueError):
    """A directory that holds no complete recording (a usage error, or a run that failed).

    Example::

        >>> from pathlib import Path
        >>> try:
        ...     Recording.load(Path("no-such-directory"))
        ... except RecordingError as error:
        ...     print(type(error).__module__, type(error).__name__)
        ddp_verify RecordingError
    """


@dataclasses.dataclass
class Recording:
    """Every rank's record of one layout's run. ``label``: how reports name it."""

    label: str
    ranks: list[dict[str, Any]]
    directory: Path | None = None

    @classmethod
    def load(cls, directory: Path, label: str | None = None) -> Recording:
        """The recording in ``directory``; :class:`RecordingError` naming what is missing."""
        first = recording_path(directory, 0)
        if not first.exists():
            raise RecordingError(
                f"{directory}: no recording (rank0.pt is missing): run the script with "
                "DDP_VERIFY_RECORD set to this directory (ddp_verify installed in the "
                "interpreter the ranks run), or with ddp-verify parity"
            )
        ranks = [_read(first)]
        size = int(ranks[0]["meta"]["world_size"])
        for rank in range(1, size):
            path = recording_path(directory, rank)
            if not path.exists():
                raise RecordingError(
                    f"{directory}: rank {rank} of {size} left no recording (did it fail?)"
                )
            ranks.append(_read(path))
        return cls(label or directory.name, ranks, directory)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def layout(self) -> Layout:
        """The layout the run was launched at (recorded, or its label), else what it shows:
        its ranks, each accumulating rank 0's micro-batches, data parallel.

        Example::

            Recording.load(Path("rec/dp2.tp2")).layout.tp  # 2
        """
        for said in (self.ranks[0]["meta"].get("layout"), self.label):
            with contextlib.suppress(LayoutError, TypeError):
                layout = parse_layout(str(said))
                if layout.world_size == self.world_size:
                    return layout
        return Layout(self.world_size, max(self.grad_accum, 1))

    def stages(self, rank: int) -> list[tuple[int, int]]:
        """The pipeline stages ``rank`` ran, as ``(index, count)`` (empty: not pipelined)."""
        return [(int(i), int(n)) for i, n in self.ranks[rank]["meta"].get("stages") or ()]

    @property
    def pipelined(self) -> bool:
        return any(self.stages(r) for r in range(self.world_size))

    @property
    def data_ranks(self) -> list[int]:
        """The ranks whose forwards see the samples: a pipeline's first stage (the others see
        the activations the one before sends), every rank otherwise."""
        return [
            r
            for r in range(self.world_size)
            if not self.stages(r) or any(i == 0 for i, _ in self.stages(r))
        ]

    @property
    def replicas(self) -> int:
        """How many data ranks forward each sample alike: the ranks of one tensor-parallel
        group all forward the same micro-batches (a context-parallel group's each its own
        piece of them: see :meth:`cut`)."""
        return self.layout.tp

    def cut(self, split: str) -> Recording | None:
        """This recording as a context-parallel layout's ranks see its samples: each
        forward's samples as the pieces ``split`` names (``"2"``: two in order, ``"2z"``:
        load-balanced; recorded where the run was told, see ``recorder.ENV_PIECES``). None
        where they were not recorded."""
        ranks = []
        for rank in self.ranks:
            steps = []
            for record in rank["steps"]:
                cut = record.get("pieces", {}).get(split)
                if cut is None or len(cut) != len(record["batches"]):
                    return None
                steps.append({**record, "batches": cut})
            ranks.append({**rank, "steps": steps})
        return Recording(f"{self.label} cut {split}", ranks, self.directory)

    @property
    def meta(self) -> dict[str, Any]:
        """Rank 0's record of the run itself (its dtype, what it drew, its dropout)."""
        return dict(self.ranks[0]["meta"])

    @property
    def steps(self) -> int:
        """The optimizer steps every rank recorded."""
        return min(len(r["steps"]) for r in self.ranks)

    @property
    def grad_accum(self) -> int:
        """Forwards of the model per optimizer step on rank 0 at step 0 (its micro-batches)."""
        return len(self.ranks[0]["steps"][0]["batches"]) if self.steps else 0

    @property
    def float64(self) -> bool:
        """Whether the script ran in float64 throughout (not forced to its own precision)."""
        meta = self.ranks[0]["meta"]
        return (
            bool(meta["float64"])
            and meta["param_dtypes"] == ["torch.float64"]
            and not (meta["autocast"])
            and not self.lower_inside
        )

    @property
    def lower_inside(self) -> dict[str, str] | None:
        """Where a run in float64 computed in a lower precision inside, as the recorder saw
        it on any rank: ``{"dtype", "call", "where"}``, or None."""
        meta = self.ranks[0]["meta"]
        if meta["param_dtypes"] != ["torch.float64"] or meta["autocast"]:
            return None  # not a float64 run: its own precision is the one it runs in
        for rank in self.ranks:
            found = rank["meta"].get("lower_inside")
            if found:
                return dict(found)
        return None

    @property
    def exchanged(self) -> list[str]:
        """Where any rank sent other ranks a tensor computed from the model (features for a
        loss that couples samples across ranks): ``"all_gather at train.py:42"``, in the
        order first seen. Not at a layout that splits each sample over ranks (context or
        tensor parallel): what its ranks send each other (a piece's keys and values, a
        shard's activations) is the layout's own work on one sample, no coupling of
        samples."""
        if self.layout.cp > 1 or self.layout.tp > 1:
            return []
        found: list[str] = []
        for rank in self.ranks:
            found += [w for w in rank["meta"].get("exchanged", ()) if w not in found]
        return found

    @property
    def precision(self) -> str:
        """What the script computed in: ``float64``, or its parameters' dtype and autocast,
        and the lower precision it computed in inside."""
        meta = self.ranks[0]["meta"]
        dtypes = ", ".join(d.replace("torch.", "") for d in meta["param_dtypes"]) or "unknown"
        said = dtypes + (f" under autocast {meta['autocast']}" if meta["autocast"] else "")
        lower = self.lower_inside
        if lower:
            said += f", in {lower['dtype']} inside ({lower['call']} at {lower['where']})"
        return said

    def step(self, rank: int, step: int) -> dict[str, Any]:
        return self.ranks[rank]["steps"][step]

    def samples(self, step: int, pads: Pads | None = None) -> collections.Counter[str]:
        """Every sample that reached the model at ``step``, on every rank, as a multiset:
        each known by what it is, the trailing run of its input's pad value (``pads``, by
        input; see :func:`pads_between`) left out, whatever its padding width."""
        found = collections.Counter(
            canonical(row, pads)
            for rank in self.data_ranks
            for batch in self.step(rank, step)["batches"]
            for row in batch
        )
        # Each sample once, where the replicas of a tensor-parallel group each forward it.
        copies = self.replicas
        if copies > 1 and all(count % copies == 0 for count in found.values()):
            found = collections.Counter({row: n // copies for row, n in found.items()})
        return found

    def rank_samples(self, rank: int, step: int, pads: Pads | None = None) -> list[str]:
        return [canonical(row, pads) for batch in self.step(rank, step)["batches"] for row in batch]

    def trailing(self) -> dict[str, collections.Counter[str]]:
        """Per input, how many rows end in each value (their last position's digest)."""
        found: dict[str, collections.Counter[str]] = {}
        for rank in range(self.world_size):
            for record in self.ranks[rank]["steps"]:
                for batch in record["batches"]:
                    for row in batch:
                        for key, forms in _parts(row):
                            if len(forms) == 3:
                                found.setdefault(key, collections.Counter())[forms[1]] += 1
        return found

    def backward_losses(self, rank: int, step: int) -> list[float]:
        return list(self.step(rank, step)["losses"])

    def effective_loss(self, step: int) -> float:
        """The loss the step's gradient is the gradient of, under averaging over ranks: the
        mean over ranks of the losses each passed to backward, summed over its micro-batches
        (and divided by what a pipeline schedule divided the gradients by after them). A
        pipeline's loss is its last stage's: the mean is over the ranks that computed one."""
        ranks = list(range(self.world_size))
        if self.pipelined:
            ranks = [r for r in ranks if self.backward_losses(r, step)] or ranks
        total = sum(
            sum(self.backward_losses(r, step)) / self.step(r, step).get("grad_scale", 1)
            for r in ranks
        )
        return total / len(ranks)

    def trace(self, steps: int) -> Trace:
        """The first ``steps`` steps as the engine's trace: per rank the effective loss, the
        gradients the optimizer saw, the parameters after each step."""
        losses = [self.effective_loss(s) for s in range(steps)]
        ranks = []
        for rank in range(self.world_size):
            record = [self._whole_model(rank, s) for s in range(steps)]
            ranks.append(
                RankTrace(
                    list(losses),
                    [{k: _double(v) for k, v in r["grads"].items()} for r in record],
                    [{k: v.double() for k, v in r["params"].items()} for r in record],
                )
            )
        return Trace(self.label, ranks)

    def _whole_model(self, rank: int, step: int) -> dict[str, Any]:
        """``rank``'s gradients and parameters at ``step``, and for each parameter it does
        not hold (another pipeline stage's), those of the first rank that does, by name."""
        own = self.step(rank, step)
        if not self.pipelined:
            return own
        grads, params = dict(own["grads"]), dict(own["params"])
        for other in range(self.world_size):
            theirs = self.step(other, step)
            for name, value in theirs["grads"].items():
                grads.setdefault(name, value)
            for name, value in theirs["params"].items():
                params.setdefault(name, value)
        return {"grads": grads, "params": params}


def _double(value: torch.Tensor | None) -> torch.Tensor | None:
    return None if value is None else value.double()


def _read(path: Path) -> dict[str, Any]:
    try:
        data = torch.load(path, weights_only=True)
    except Exception as exc:
        raise RecordingError(f"{path}: not a recording ddp_verify wrote ({exc})") from None
    if not isinstance(data, dict) or "meta" not in data or "steps" not in data:
        raise RecordingError(f"{path}: not a recording ddp_verify wrote")
    return data
