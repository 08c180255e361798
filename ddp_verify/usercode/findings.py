"""The diagnosis's vocabulary: every finding a report can make, its stable code (public, as
``pattern`` in ``--json``) and its words, said the same whether the fitted weights found it or
a simulated mistake reproduced it; and :class:`Cause`, one finding made with its evidence.

Example::

    MICRO_EQUAL.cause(evidence=fit.evidence(), unit="token")
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Cause:
    """One cause of a divergence. ``subject``: what it is about (``gradient``, ``loss``,
    ``parameters``, ``run``); ``pattern``: the finding's code (``ranks:world``,
    ``micro:equal``, ...), derived from what the run did, never from the code's text;
    ``evidence``: the numbers behind it; ``weights``: the fitted weights, per rank and
    micro-batch, where a fit found it; ``scenario``: the scenario that shows it, where that
    is not the counterexample.

    Example::

        cause.text      # "gradients averaged over ranks by the world size, ..."
        cause.pattern   # "ranks:world"
    """

    text: str
    subject: str
    pattern: str
    evidence: str = ""
    weights: tuple[dict[str, Any], ...] = ()
    # The scenario that shows it, where it is not the counterexample's (a Scenario(...)
    # expression): a mistake found by a scenario that isolates one axis.
    scenario: str = ""
    # Which reading of the numbers it is, where the pattern has several (a scale's factor:
    # ``scale:N/W``); the pattern otherwise.
    reading: str = ""
    # Other readings the same numbers fit on its scenario (a factor equal to both W and N
    # where every rank holds one sample): not yet told apart.
    alternatives: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """What this cause says, as a reading (``scale:W``, ``ranks:samples``).

        Example::

            >>> Cause("...", "gradient", "scale", reading="scale:W").key
            'scale:W'
        """
        return self.reading or self.pattern

    def as_json(self) -> dict[str, Any]:
        return {
            "cause": self.text,
            "subject": self.subject,
            "pattern": self.pattern,
            "reading": self.key,
            "also_fits": list(self.alternatives),
            "evidence": self.evidence,
            "weights": list(self.weights),
            "scenario": self.scenario or None,
        }


@dataclasses.dataclass(frozen=True)
class Finding:
    """A finding: ``code`` (stable, public), ``subject`` and its words (``{unit}`` is
    ``sample`` or ``token``; ``{whole}`` what the objective is over the whole global batch,
    ``global mean`` unless a sum was declared)."""

    code: str
    subject: str
    words: str

    def says(self, **fill: Any) -> str:
        """The words, filled in (``unit``, ...); a placeholder not filled is left as it is.

        Example::

            >>> LOSS_LOCAL.says(whole="global sum")
            "the reported loss is the rank's local loss, not the global sum"
        """
        return self.words.format_map(_Fill({"whole": WHOLE_MEAN, **fill}))

    def cause(
        self,
        details: str = "",
        *,
        evidence: str = "",
        weights: tuple[dict[str, Any], ...] = (),
        **fill: Any,
    ) -> Cause:
        """This finding made, its words followed by ``details`` (the numbers of this run)."""
        return Cause(self.says(**fill) + details, self.subject, self.code, evidence, weights)


_ALL: dict[str, Finding] = {}

# What the objective is over the whole global batch, as the words say it.
WHOLE_MEAN = "global mean"
WHOLE_SUM = "global sum"


def whole(sums: bool) -> str:
    """How the words name the objective over the whole global batch.

    Example::

        >>> whole(sums=True)
        'global sum'
    """
    return WHOLE_SUM if sums else WHOLE_MEAN


class _Fill(dict[str, Any]):
    """Words' fill that leaves a placeholder it has no value for as it is."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _finding(code: str, subject: str, words: str) -> Finding:
    finding = Finding(code, subject, words)
    assert code not in _ALL, f"two findings coded {code!r}"
    _ALL[code] = finding
    return finding


# -- how ranks were combined (the gradient) ---------------------------------------------------
RANKS_WORLD = _finding(
    "ranks:world",
    "gradient",
    "gradients averaged over ranks by the world size, not weighted by each rank's {unit}s",
)
RANKS_SUM = _finding("ranks:sum", "gradient", "gradients summed across ranks but not divided")
TP_MODULE = _finding(
    "tp:module",
    "gradient",
    "the forward departs from the reference's at {module}: its output differs {own}, so the "
    "difference is made in its own forward, across the {tp} tensor-parallel ranks (a "
    "reduction of a sharded output missing, or done twice)",
)
RANKS_PIECE_MEAN = _finding(
    "ranks:piece-mean",
    "gradient",
    "each context-parallel rank's loss averaged over the {unit}s of its own piece of the "
    "sequences and the pieces weighted alike, where the reference layout takes one mean over "
    "the step's {unit}s{numbers}: divide each rank's summed loss by the step's {unit} count "
    "(all-reduced over the ranks), not by its piece's",
)
RANKS_OWN = _finding(
    "ranks:own",
    "gradient",
    "gradients never synchronised: each rank trained on its own {unit}s only",
)
RANKS_ONE = _finding(
    "ranks:one",
    "gradient",
    "rank {source}'s gradient used on {where} (broadcast or copied from rank {source} instead "
    "of combined over ranks)",
)
RANKS_SAMPLES = _finding(
    "ranks:samples",
    "gradient",
    "ranks weighted by their samples, not by the tokens that count (a count of sequences "
    "where the loss averages tokens)",
)
RANKS_MEANS_OVER_COUNT = _finding(
    "ranks:means-over-count",
    "gradient",
    "each rank's mean gradient summed and divided by the global {unit} count ({total}): a mean "
    "is already divided by its own count, so weight it by its share, or sum the ranks' sums",
)
RANKS_EQUAL = _finding(
    "ranks:equal",
    "gradient",
    "every rank's gradient counted {value:.4g} in all, whatever its share of the {unit}s",
)
RANKS_SHARES = _finding(
    "ranks:shares",
    "gradient",
    "each rank's summed gradient weighted by its share of the step's {unit}s, as averaging "
    "means weights it: under a declared sum the ranks' sums add whole (all_reduce with SUM, "
    "no weights, no division)",
)
RANKS_OTHER = _finding("ranks:other", "gradient", "ranks weighted wrongly")
RANKS_REDUCE_TO_0 = _finding(
    "ranks:reduce-to-0",
    "gradient",
    "gradients reduced onto rank 0 only (dist.reduce where all_reduce was needed): rank 0 "
    "holds the combined gradient after step 0, the other ranks do not",
)
SCALE = _finding("scale", "gradient", "{why}: every {unit} counted {factor:.4g}x what it should")
# What SCALE says, by the factor: the world size, its inverse, or another.
SUMMED_NOT_DIVIDED_BY_WORLD = "gradients summed across ranks but not divided by the world size"
DIVIDED_TWICE = "gradients divided by the world size once too often"
SCALED = "the gradient is scaled"
# Scale factors that are a ratio of counts say what was divided by what (N: the step's loss
# items, W: the world size, M: the micro-batches each rank holds).
SUMMED_OVER_ITEMS = (
    "a sum over the step's {n} {unit}s never divided by their count (a loss with sum "
    "reduction, or a mean multiplied back by its count)"
)
SUMMED_THEN_WORLD = (
    "each rank's loss summed over its {unit}s, then averaged over ranks by the world size (as "
    "DDP divides), never divided by the global count: {n} {unit}s / world size {world}"
)
MICRO_NOT_DIVIDED = (
    "the {m} micro-batches' gradients summed, not divided by their number (or weighted by "
    "their shares)"
)
MICRO_DIVIDED_TWICE = "the gradient divided by the number of micro-batches ({m}) once too often"
DIVIDED_BY_COUNT_TWICE = (
    "divided by the global {unit} count ({n}) once too often (a mean divided by its count again)"
)

# -- how micro-batches were weighted within a rank ---------------------------------------------
MICRO_EQUAL = _finding(
    "micro:equal",
    "gradient",
    "micro-batch losses divided by the number of micro-batches instead of weighted by their "
    "sizes (a mean of micro-batch means)",
)
# MICRO_EQUAL's words where the loss averages a counted unit other than samples (tokens, or
# sequences under a declared sequence mean): the denominator it took instead.
MICRO_EQUAL_COUNTED = (
    "normalised per micro-batch by its own {unit} count instead of the global count: each "
    "micro-batch's mean counted the same, whatever its {unit}s"
)
# RANKS_WORLD's, likewise.
PER_RANK_DENOMINATOR = " (normalised per rank by its own {unit} count instead of the global count)"
# The counted units whose denominators those words name.
COUNTED_UNITS = ("token", "sequence")
MICRO_LAST_ONLY = _finding(
    "micro:last-only",
    "gradient",
    "only the last micro-batch's gradient kept (zero_grad() inside the accumulation loop)",
)
MICRO_DROPPED = _finding(
    "micro:dropped", "gradient", "some micro-batches counted 0 (their gradients were dropped)"
)
MICRO_SAMPLES = _finding(
    "micro:samples",
    "gradient",
    "micro-batches weighted by their samples, not by the tokens that count",
)
MICRO_ROWS = _finding(
    "micro:rows",
    "gradient",
    "each micro-batch's sequence mean taken over all its rows, sequences with no token that "
    "counts included (a count from the batch: loss_mat.size(0), .mean() over sequences), not "
    "over its sequences that count",
)
MICRO_WIDTH = _finding(
    "micro:padded-width",
    "gradient",
    "each micro-batch normalised by its own padded width (loss_mask.shape[-1]) where the "
    "declared constant was due: dynamic padding makes the widths differ, so each micro-batch "
    "counted constant / width times its share",
)
MICRO_OTHER = _finding("micro:other", "gradient", "micro-batches weighted wrongly within a rank")

# -- when the optimizer stepped ----------------------------------------------------------------
STEP_EACH = _finding(
    "step:each-micro-batch",
    "gradient",
    "optimizer stepped once per micro-batch instead of once per step after accumulating the "
    "micro-batches",
)
NONLINEAR = _finding(
    "nonlinear",
    "gradient",
    "the gradient is not a weighted sum of the micro-batches' gradients{measured}",
)
# What was measured of a gradient that no weighting explains.
PER_PARAMETER_SCALE = (
    ": each parameter's gradient is the full-batch one scaled by a factor of its own ({scales})"
)
NOT_PROPORTIONAL = (
    ": it is not proportional to the full-batch gradient (cosine {cosine:.4g}, norm ratio "
    "{ratio:.4g})"
)

# -- the reported loss -------------------------------------------------------------------------
CLIP = _finding(
    "clip",
    "gradient",
    "gradients clipped per rank before they were combined (clip_grad_norm_ on each rank's own "
    "gradient, to a norm of about {bound:.4g}): {ranks}; full-batch training clips the "
    "combined gradient, so clip after the all-reduce",
)

LOSS_LOCAL = _finding(
    "loss:local", "loss", "the reported loss is the rank's local loss, not the {whole}"
)
LOSS_SUM = _finding("loss:sum", "loss", "the reported loss is summed across ranks but not divided")
LOSS_WORLD = _finding(
    "loss:world",
    "loss",
    "the reported loss is the unweighted mean of rank means (only right when every rank holds "
    "as many {unit}s)",
)
LOSS_MEANS_OVER_COUNT = _finding(
    "loss:means-over-count",
    "loss",
    "the reported loss sums the ranks' means and divides by the global {unit} count: a mean "
    "is already divided by its own count, so weight it by its share, or sum the ranks' sums",
)
LOSS_SHARES = _finding(
    "loss:shares",
    "loss",
    "the reported loss weights each rank's summed loss by its share of the step's {unit}s, as "
    "averaging means weights it: under a declared sum the ranks' sums add whole",
)
LOSS_ITEM_SUM = _finding(
    "loss:item-sum",
    "loss",
    "the reported loss is the sum of per-{unit} losses, not divided by their count",
)
LOSS_MICRO_EQUAL = _finding(
    "loss:micro-equal",
    "loss",
    "the reported loss averages micro-batch means, not weighted by their {unit}s",
)
LOSS_LAST_ONLY = _finding(
    "loss:last-only", "loss", "the reported loss is the last micro-batch's only"
)
LOSS_CARRIED = _finding(
    "loss:carried", "loss", "the reported loss accumulates across steps (never reset)"
)
LOSS_RANK0_ONLY = _finding(
    "loss:rank0-only",
    "loss",
    "only rank 0 holds the result: the other ranks report their own local loss or a partial "
    "sum of some ranks' (what a reduce onto rank 0, dist.reduce or a gather, leaves on them; "
    "the reduce tree of gloo and nccl leaves partial sums from 4 ranks on); if only rank 0's "
    "result is meant to be used, check with {result_on}, which holds rank 0's result to the "
    "{whole}",
)
LOSS_SCALED = _finding(
    "loss:scaled",
    "loss",
    "the reported loss is the {whole} times {factor}{why}",
)
# What LOSS_SCALED says, by the factor where it is a ratio of counts.
TIMES_WORLD = ": multiplied by the world size ({world})"
DIVIDED_BY_WORLD_TWICE = ": divided by the world size ({world}) once too often"
LOSS_DIVIDED_BY_COUNT_TWICE = (
    ": divided by the step's {unit} count ({n} at step {step}) once too often"
)
# The words LOSS_SCALED adds when the gradient is off by the same factor.
LOSS_SCALED_LIKE_GRADIENT = (
    ", the gradient's own factor: the loss that was backpropagated, scaled as the gradient "
    "is, is what was reported"
)
LOSS_UNEXPLAINED = _finding(
    "loss:unexplained",
    "loss",
    "the reported loss fits no weighting of the micro-batches' mean losses tried (by share, "
    "own, summed, 1/world size, item sums; micro-batches by {unit}s, equally, last only; "
    "carried over steps or not)",
)

# -- what the parameters or the run show at a glance ------------------------------------------
PARTIAL_SYNC = _finding(
    "partial-sync",
    "parameters",
    "some parameters are not synchronised across ranks (ranks disagree on {names} after step "
    "0, and agree on the others)",
)
MASK_IGNORED = _finding(
    "mask:ignored",
    "gradient",
    "losses the mask excludes are counted: the result changes with loss_mat where loss_mask "
    "is 0 ({zeroed}); multiply loss_mat by loss_mask before reducing it",
)
LOSSY = _finding(
    "lossy",
    "gradient",
    "lossy compression ({fmt} rounding): every gradient, parameter and loss is within what "
    "{fmt}'s rounding allows ({bound}); if the hook compresses on purpose, check it with "
    "{lossy}",
)
LOW_RANK = _finding(
    "lowrank",
    "gradient",
    "a low-rank approximation of the gradient, not rounding: {what}; a low-rank hook "
    "(PowerSGD) is exact only at a rank that reaches every matrix's smaller side: check it "
    "at full rank with {lossy} and a state of that rank",
)
# A torch issue the conformance suite knows (ddp_verify/conformance/test_comm_hooks.py marks
# its tests with it), as a check's failure shows it: the ranks' words, then the finding.
POWERSGD_UNUSED_SIGNATURE = (
    r"gloo::EnforceNotMet|op\.preamble\.length <= op\.nbytes"
    r"|(?s:did not finish within.*powerSGD_hook\.py)"
    # The same wait, told as a collective mismatch before the time-out (world/deadlock.py).
    r"|(?s:waited in a collective.*powerSGD_hook\.py)"
)
TORCH_POWERSGD_UNUSED = _finding(
    "torch:powersgd-unused",
    "run",
    "torch's known PowerSGD issue, not your code's: with a parameter forward never uses, DDP "
    "looks for unused parameters and powerSGD_hook's ranks call collectives of different "
    "sizes (gloo aborts, or the ranks wait until the timeout); avoid it with {exclude}",
)
KEEPS_STATE = _finding(
    "state:carried",
    "run",
    "the code keeps state between calls (a module global, a cache or an attribute carried "
    "over from earlier calls, never reset): {how}; the causes after this one describe one "
    "call's result with that state in it",
)
BATCH_NORM = _finding(
    "batch-norm",
    "run",
    "BatchNorm normalises each forward by its own batch's statistics: data-parallel training "
    "normalises each rank's micro-batch by its own, full-batch training the whole global "
    "batch (documented DDP behaviour; use SyncBatchNorm with one micro-batch per rank for "
    "global statistics)",
)
COLLECTIVES_PER_MICRO_BATCH = _finding(
    "collectives-per-micro-batch",
    "run",
    "collectives called once per micro-batch (gradients synchronised or the optimizer stepped "
    "per micro-batch), and in step {step} the ranks held different numbers of micro-batches "
    "({held}), so their collectives did not pair up. If every rank of your training always "
    "has as many micro-batches, check with {same_counts}; otherwise synchronise once per step",
)
# -- a loss that couples samples across ranks (coupled-loss) -----------------------------------
COUPLED_SCALE = _finding(
    "coupled:scale",
    "gradient",
    "the gradient is {factor} times the reference's on every parameter{why}",
)
# What COUPLED_SCALE adds, by its factor.
COUPLED_TIMES_WORLD = (
    ": the loss multiplied by the world size where its gradient already reaches every "
    "rank's features (a gather with gradients): multiply only where the gradient reaches "
    "the local features alone"
)
COUPLED_OVER_WORLD = (
    ": every rank's gradient is the whole batch's, and DDP's average divides it by the "
    "world size once too often"
)
COUPLED_LOCAL_GRADIENT = _finding(
    "coupled:local-gradient",
    "gradient",
    "every rank computes the loss of the whole batch, but its gradient reaches only the "
    "rank's local features (the others came out of a gather without gradients), and DDP "
    "averages: the towers get {towers} of their gradient{learned}. Gather with gradients "
    "(torch.distributed.nn.functional.all_gather), or multiply the loss by the world size",
)
COUPLED_NO_FEATURE_GRADIENT = _finding(
    "coupled:no-feature-gradient",
    "gradient",
    "no gradient reaches the towers: every feature the loss used came out of a gather "
    "without gradients (dist.all_gather returns copies); put the local features back in "
    "their slot, or gather with torch.distributed.nn.functional.all_gather",
)
COUPLED_LOCAL_NEGATIVES = _finding(
    "coupled:local-negatives",
    "gradient",
    "negatives from the local batch only: each rank's loss is its own pairs' loss, as if "
    "every rank trained alone; gather the other ranks' features to use them as negatives",
)
COUPLED_RANKS_EQUAL = _finding(
    "coupled:ranks-equal",
    "gradient",
    "each rank's loss is the mean over its own pairs, and DDP's average counts every rank "
    "{share}, whatever its pairs: weight each rank's loss by its pairs x world size / the "
    "global pairs (or sum over the rank's pairs and divide by the global count), or check "
    "with --even-batches if every rank always holds as many",
)
COUPLED_CONSTANT_FEATURES = _finding(
    "coupled:constant-features",
    "gradient",
    "the other ranks' features are constants in each rank's loss: no gradient crosses ranks, "
    "so the gradient through the other ranks' pairs is missing; gather or exchange with "
    "gradients (torch.distributed.nn.functional.all_gather, or an autograd function whose "
    "backward sends each gradient back to the rank its features came from)",
)
COUPLED_CONSTANT_TOWER = _finding(
    "coupled:constant-tower",
    "gradient",
    "the other ranks' {tower} features are constants in each rank's loss (gathered without "
    "gradients), while the {other} features carry theirs across ranks: {tower} misses the "
    "gradient through the other ranks' pairs; gather both views the same way, with "
    "gradients (torch.distributed.nn.functional.all_gather)",
)
COUPLED_UNEVEN = _finding(
    "coupled:uneven",
    "run",
    "the code cannot take ranks holding different numbers of pairs ({sizes}): {what}. If "
    "every rank always holds as many, check with --even-batches; otherwise exchange sizes "
    "first, pad to the longest for the gather and cut each rank's rows back out",
)
COUPLED_WRONG_POSITIVES = _finding(
    "coupled:wrong-positives",
    "gradient",
    "some pairs were scored against another pair's view as their positive ({matched}): "
    "positives labelled by rank x local batch assume every rank holds as many pairs; offset "
    "each rank's labels by the pairs the ranks before it hold (exchange the sizes first), or "
    "check with --even-batches if every rank always holds as many",
)
COUPLED_UNEXPLAINED = _finding(
    "coupled:unexplained",
    "run",
    "no reading of a coupled loss fits this divergence (read: a scale, the gradient "
    "reaching local features only or none, local negatives, ranks weighted equally, no "
    "gradient crossing ranks, which pairs were matched); what limits it: {why}",
)

NO_KNOWN_MISTAKE = "no known mistake reproduces this divergence"
UNEXPLAINED = _finding(
    "unexplained",
    "run",
    NO_KNOWN_MISTAKE + ": the gradients each rank ended with {read} and the reported loss is "
    "the {whole}, so the difference lies elsewhere (the optimizer, the parameters' "
    "update); see the first divergence above",
)
DIAGNOSIS_FAILED = _finding("none", "run", "not found: the diagnosis failed ({reason})")

OBJECTIVE_OTHER = _finding(
    "objective:other",
    "gradient",
    "the code computes {computed} where {declared} was declared: its gradient is the "
    "{computed} objective's on the whole global batch, exactly",
)

PACKED_ROWS = _finding(
    "packed:rows",
    "gradient",
    "a packed row taken for a sequence: each row's {declared} term computed over all its "
    "segments, the rows' sum divided by the {over} (a sequence mean per row, the boundaries "
    "it is handed unused)",
)

PACKED_BOUNDARY = _finding(
    "packed:boundary",
    "gradient",
    "a boundary token counted: each packed sequence's last position also trained to predict "
    "the next sequence's first token (boundary predictions at step 0: {count}), the labels shifted "
    "within the row and the boundary never masked where the collator kept that label "
    "(position_ids restart at 0 there); the sum divided by {over}",
)
PACKED_DISAGREES = _finding(
    "packed:disagrees",
    "gradient",
    "right padded, wrong packed: the same scenario with a sequence a row ({unpacked}) "
    "trains what the reference trains, packed ({packing}) it does not, so the code reads the "
    "packed layout wrong",
)

OBJECTIVE_WINDOW = _finding(
    "objective:window",
    "gradient",
    "each step normalised by {computed} where {declared} was declared ({meant}): {factors}",
)

OBJECTIVE_TERM = _finding(
    "objective:term",
    "gradient",
    "a term of the objective not weighted as declared: {terms}",
)

# -- whole training scripts (ddp-verify parity) -------------------------------------------------
DATA_SAME = _finding(
    "data:same-samples",
    "data",
    "every rank trained on the same samples: no DistributedSampler (or a sampler that ignores "
    "the rank), so the layout's global batch is one rank's batch repeated {world} times",
)
DATA_DUPLICATED = _finding(
    "data:duplicated",
    "data",
    "samples trained more than once ({what}): a DistributedSampler pads the last batch by "
    "repeating samples when the dataset does not divide by the world size",
)
DATA_MISSING = _finding(
    "data:missing",
    "data",
    "samples of the reference's global batch missing ({what}): dropped by the split "
    "(drop_last, or a batch size that does not divide)",
)
DATA_ORDER = _finding(
    "data:order",
    "data",
    "the samples of a step depend on the layout ({what}): a shuffle or a split whose order "
    "changes with the world size or the micro-batch size",
)
SYNC_LEFT_OUT = _finding(
    "sync:left-out",
    "gradient",
    "parameters left out of synchronisation: {names} differ from rank to rank (a parameter "
    "DDP ignores, or one that never reaches a hook)",
)
LOSS_INTEGER = _finding(
    "loss:integer",
    "loss",
    "a value truncated or rounded to a whole number on its way ({whole}): a sum held in an "
    "integer tensor, or int() of a float",
)
NAN_EMPTY_RANK = _finding(
    "nan:empty-rank",
    "run",
    "rank {empty} holds no sample at step {step} and the code divides by its count: 0/0 is "
    "NaN, and an all-reduce spreads it to every rank (weight by the count, or skip the "
    "division where it is 0)",
)
NAN = _finding(
    "nan",
    "run",
    "a NaN or an infinity at step {step} on rank(s) {nonfinite}: a division by zero, a log of 0, "
    "or an overflow in the code",
)
LABEL_DROPPED = _finding(
    "label:dropped",
    "gradient",
    "the items whose target is {label} left out of the loss: a label value taken for padding "
    "or ignored (the ignored target is -100: compare with it, not with 0 or -1)",
)
IGNORED_COUNTED = _finding(
    "label:ignored-counted",
    "gradient",
    "targets the loss must ignore (-100: padding, prompt tokens) counted, as class 0: a mask "
    "built from the labels and never applied, or labels clamped before the loss",
)
PARAMS_REPLACED = _finding(
    "params:replaced",
    "parameters",
    "parameters replaced after the optimizer step, not gradients misweighted ({replaced})",
)
TIED_REPEATED = _finding(
    "tied:repeated",
    "gradient",
    "{tied}: a parameter reached by several names (tied weights) synchronised once per name "
    "(named_parameters(remove_duplicate=False), or each module's parameters in turn): "
    "a weighted average applied twice is still the average, anything else compounds",
)
PARAMS_STALE = _finding(
    "params:stale",
    "parameters",
    "parameters {stale} kept as before the step while other ranks updated them: a parameter a rank "
    "does not step itself must come back from the rank that does (a partitioned optimizer's "
    "broadcast or all-gather of the updated parameters left out)",
)
MICRO_UNSYNCED = _finding(
    "micro:unsynced",
    "gradient",
    "micro-batch(es) {local} never synchronised: each rank kept its own gradient of them "
    "while micro-batch(es) {shared} were combined across ranks (a sync inside the "
    "accumulation loop run on some micro-batches only, or DDP's sync flag on the wrong one)",
)
MICRO_CLEARED = _finding(
    "micro:cleared",
    "gradient",
    "zero_grad() inside the accumulation loop: the gradients were cleared before a later "
    "micro-batch's backward ({where}), so only the last micro-batch of each rank counted",
)
MICRO_OWN_MEAN = _finding(
    "micro:own-mean",
    "gradient",
    "each micro-batch's loss averaged over its own {unit}s and the micro-batches weighted "
    "equally, where the reference layout takes one mean over the step's {unit}s{numbers}",
)
MICRO_WEIGHTS = _finding(
    "micro:weights",
    "gradient",
    "the micro-batches weighted other than their share of the step: to give the reference's "
    "gradient their contributions must count {numbers} (1 = as they did)",
)
GRAD_DIFFERS = _finding(
    "grad:differs",
    "gradient",
    "the gradient the optimizer saw differs from the reference's and is not a multiple of it"
    "{measured}: some samples, micro-batches or ranks counted other than their share",
)
PRECISION_LOWER = _finding(
    "precision:lower",
    "gradient",
    "the gradient is the reference's to {difference:.2g} relative, a factor of 1: rounding, "
    "not a weighting; the script computes in a lower precision than float64 somewhere (a "
    "float32 kernel, autocast, a cast in the loss), where float64's bound is too tight: "
    "check it at its own precision with {native}",
)
LOG_DIFFERS = _finding(
    "log:differs",
    "loss",
    "the logged loss is not the reference's, and is none of the layout's own losses tried "
    "(rank 0's, its last micro-batch's, the sum over ranks, divided once too often)",
)
OPTIMIZER_SETTINGS = _finding(
    "optimizer:settings",
    "optimizer",
    "the optimizer's settings depend on the layout ({what}): a learning-rate schedule or "
    "another setting stepped by micro-batch, by process or by samples seen, not by "
    "optimizer step",
)
SCRIPT_STEPS = _finding(
    "steps:fewer",
    "run",
    "the layout recorded {got} optimizer step(s) where the reference recorded {wanted}: its "
    "data ran out sooner, or it stopped",
)

REFERENCE_UNREPRODUCED = _finding(
    "reference:unreproduced",
    "run",
    "two runs of the reference layout {layout} differ ({what}), so no layout can be held to "
    "it: {source}",
)
WEIGHTS_START = _finding(
    "weights:start",
    "run",
    "the model's starting weights differ from the reference's ({where}): initialised from "
    "no seed, or one that depends on the layout (the rank, the world size), and never made "
    "alike (DDP broadcasts rank 0's; code that synchronises its own gradients must start "
    "every rank alike)",
)
LAUNCH_NO_GROUP = _finding(
    "launch:no-group",
    "run",
    "the ranks of layout {layout} never joined one process group ({what}): each trained "
    "alone, so the layout never ran as asked (a framework started under torchrun without a "
    "distributed strategy runs single-device in every rank: give it one, e.g. "
    "Fabric(strategy='ddp'), Trainer(strategy='ddp'), or init_process_group)",
)
LAUNCH_MICRO = _finding(
    "launch:micro-batches",
    "run",
    "layout {layout} ran {got} micro-batch(es) a step where it asks {asked}: the script did "
    "not take the accumulation it was given, or counts it otherwise (parity's placeholder "
    "total_grad_accum gives the micro-batches of every rank, grad_accum each rank's)",
)
TRAINS_NOTHING = _finding(
    "reference:trains-nothing",
    "run",
    "the reference layout {layout} trains nothing: every gradient its optimizer saw is "
    "exactly 0 at every step recorded ({steps}), so no layout can be told from it (a loss "
    "that is 0, detached, multiplied by 0, or masked to nothing)",
)
MODEL_DROPOUT = _finding(
    "model:dropout",
    "run",
    "the model trains with dropout ({modules}): each layout draws its masks from its own "
    "ranks' generators, so layouts differ by the masks alone, whatever the weighting (and "
    "the masks advance torch's global generator by an amount that follows the micro-batch: "
    "samples drawn from it after differ too); set the dropout to 0 for the check (the "
    "script's own flag for it, in the command parity runs)",
)

# What only ddp-verify parity says: its own comparison of whole scripts' recordings (it says
# the diagnosis's findings too, where a layout's gradient fits one of them).
SCRIPT_FINDINGS = (
    DATA_SAME,
    DATA_DUPLICATED,
    DATA_MISSING,
    DATA_ORDER,
    SYNC_LEFT_OUT,
    MICRO_CLEARED,
    MICRO_OWN_MEAN,
    MICRO_WEIGHTS,
    RANKS_PIECE_MEAN,
    TP_MODULE,
    GRAD_DIFFERS,
    PRECISION_LOWER,
    LOG_DIFFERS,
    OPTIMIZER_SETTINGS,
    SCRIPT_STEPS,
    REFERENCE_UNREPRODUCED,
    MODEL_DROPOUT,
    WEIGHTS_START,
    LAUNCH_NO_GROUP,
    LAUNCH_MICRO,
    TRAINS_NOTHING,
)

# Findings both the check and parity say, each from evidence of its own: one vocabulary.
SHARED_FINDINGS = (OPTIMIZER_SETTINGS,)

# Findings a simulated mistake's run is matched for, where the fit could not say.
OPEN_QUESTIONS = (NONLINEAR, LOSS_UNEXPLAINED)


def finding(code: str) -> Finding:
    """The finding ``code`` names; a ``KeyError`` for none.

    Example::

        >>> finding("ranks:world").subject
        'gradient'
    """
    return _ALL[code]


def every_finding() -> tuple[Finding, ...]:
    """The whole vocabulary, in the order it is written above."""
    return tuple(_ALL.values())
