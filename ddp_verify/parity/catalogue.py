"""Every cause ``ddp-verify parity`` can name that a check does not, as table rows: its own
findings about whole scripts' recordings, and the count ratios it reads a layout's gradient
by. The causes page (docs/reference/causes.md) shows them beside the check's.

Example::

    >>> [row.pattern for row in script_causes()][:2]
    ['data:same-samples', 'data:duplicated']
"""

from __future__ import annotations

from ..usercode import findings as f
from ..usercode.diagnosis.catalogue import Row, words_of
from ..world.naming import option
from .compare import RATIOS

__all__ = ["script_causes"]

# What finds each of parity's own findings, in the recordings the layouts leave.
FOUND_BY: dict[str, str] = {
    f.DATA_SAME.code: "the samples each rank trained, against the other ranks'",
    f.DATA_DUPLICATED.code: "the samples each step trained, against earlier steps'",
    f.DATA_MISSING.code: "the samples each step trained, against the reference's",
    f.DATA_ORDER.code: "the samples each step trained, against the reference's",
    f.SYNC_LEFT_OUT.code: "the ranks' parameters after a step",
    f.MICRO_CLEARED.code: "the gradient recorded after each micro-batch's backward",
    f.MICRO_OWN_MEAN.code: "each micro-batch's share of the step, fitted",
    f.RANKS_PIECE_MEAN.code: "the ranks' losses weighted by their pieces' tokens, against the "
    "reference's",
    f.TP_MODULE.code: "each module's output at the first forward, against the reference's",
    f.MICRO_WEIGHTS.code: "each micro-batch's share of the step, fitted",
    f.GRAD_DIFFERS.code: "the gradient against the reference's, no multiple of it",
    f.PRECISION_LOWER.code: "the gradient against the reference's, a factor of 1",
    f.LOG_DIFFERS.code: "the logged loss against the layout's own losses",
    f.OPTIMIZER_SETTINGS.code: "the optimizer's settings recorded at each step",
    f.SCRIPT_STEPS.code: "the steps each layout recorded",
    f.REFERENCE_UNREPRODUCED.code: "a second run of the reference layout, before any other",
    f.MODEL_DROPOUT.code: "the model's dropout modules in training mode, at its first forward",
    f.WEIGHTS_START.code: "a digest of every rank's weights at its first forward",
    f.LAUNCH_NO_GROUP.code: "the process group each rank formed, against the layout asked",
    f.LAUNCH_MICRO.code: "the micro-batches rank 0 ran a step, against the layout asked",
    f.TRAINS_NOTHING.code: "the reference's gradients, before any layout",
}

# Symbols for the numbers parity's words hold.
_SYMBOLS = {
    "numbers": "",
    "difference": "d",
    "native": option("dtype", "native"),
    "got": "G",
    "wanted": "R",
    "what": "which samples, at which step",
    "layout": "R",
    "source": "the source, by file and line, with its fix",
    "modules": "'name' p=...",
    "where": "which ranks of which layout",
    "asked": "A",
}

# Where one finding's symbols read otherwise.
_OWN = {
    f.OPTIMIZER_SETTINGS.code: {"what": "the settings that differ, at which step"},
    f.MICRO_WEIGHTS.code: {"numbers": "w1, w2, ..."},
    f.RANKS_PIECE_MEAN.code: {
        "unit": "token",
        "numbers": " (each rank's tokens, and how many times its share it counted)",
    },
    f.REFERENCE_UNREPRODUCED.code: {"what": "which samples or tensors, at which step"},
    f.LAUNCH_NO_GROUP.code: {"layout": "L", "what": "which ranks formed which group"},
    f.LAUNCH_MICRO.code: {"layout": "L"},
    f.TRAINS_NOTHING.code: {"steps": "S"},
}


def script_causes() -> list[Row]:
    """Parity's own findings, then each count ratio a layout's gradient is read by (a
    factor of the accumulation steps A, the world size W, or both, against the
    reference's)."""
    made = [
        Row(x.code, FOUND_BY[x.code], words_of(x, **{**_SYMBOLS, **_OWN.get(x.code, {})}))
        for x in f.SCRIPT_FINDINGS
    ]
    for key, _, why in RATIOS:
        words = words_of(f.SCALE, why=why, factor="k ")
        made.append(
            Row(f"scale:{key}", "the gradient against the reference's, a count ratio", words)
        )
    return made
