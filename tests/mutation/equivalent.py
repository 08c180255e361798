"""Generated mutants read as equivalent under torch's documented contract: each changes numbers
(its probe sees them move) but only in ways the contract leaves to the implementation, so no
property can kill one without pinning torch's code. Each is keyed by what it changes (module,
function, operator, change: line numbers move between releases), with the reason read from
the code. A declared mutant the suite kills counts as killed; one it lets through counts as
"equivalent" and leaves the score's denominator, shown beside the raw score
(:mod:`tests.mutation.generated`). Nothing else is ever excluded."""

from __future__ import annotations

_POWER = "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook"
_DRAWS = (
    "only which random initial matrix each gradient matrix gets, and where in the hook's "
    "buffers it lives: the matrices stay the same on every rank and fixed by random_seed "
    "(all PowerSGDState documents), every matrix is written back to its own gradient"
)

# (module, qualname, operator, change) -> why the contract cannot tell it from torch.
EQUIVALENT: dict[tuple[str, str, str, str], str] = {
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in tensors_to_compress -> reversed(list(...))"): _DRAWS,
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in shape_to_tensors.values() -> reversed(list(...))"): _DRAWS,
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in tensors -> reversed(list(...))"): _DRAWS,
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in maybe_batched_tensors_to_compress() -> reversed(list(...))"): _DRAWS,
    (_POWER, "powerSGD_hook", "reversed-iteration",
     "for ... in qs -> reversed(list(...))"): _DRAWS,
    ("torch.utils.data.distributed", "DistributedSampler.__iter__", "arithmetic",
     "self.seed + self.epoch -> self.seed - self.epoch"): (
        "another permutation, still a function of (seed, epoch) alone, the same on every rank "
        "and different for every epoch: all DistributedSampler and set_epoch document"
    ),
    ("torch.optim.adamw", "AdamW.__setstate__", "reversed-iteration",
     "for ... in self.param_groups -> reversed(list(...))"): (
        "the loop sets one constant (decoupled_weight_decay = True) in each param group, each "
        "group on its own: the order it visits them in leaves the same groups"
    ),
    ("torch.optim.lr_scheduler", "LRScheduler.__init__", "reversed-iteration",
     "for ... in optimizer.param_groups -> reversed(list(...))"): (
        "the loop gives each param group its own initial_lr (setdefault from the group's own "
        "lr), each group on its own: the order it visits them in leaves the same groups"
    ),
    ("torch.optim.lr_scheduler", "LRScheduler._update_lr", "reversed-iteration",
     "for ... in zip(self.optimizer.param_groups, values, strict=True) -> reversed(list(...))"): (
        "each param group is given its own value, paired with it by zip before the loop: the "
        "order it visits the pairs in leaves every group the learning rate it was given"
    ),
    ("torch.amp.grad_scaler", "GradScaler._unscale_grads_", "reversed-iteration",
     "for ... in per_dtype_grads.values() -> reversed(list(...))"): (
        "each (device, dtype) group of gradients is unscaled in place by the same inverse "
        "scale and checked into its device's found_inf, which only ever becomes 1: the order "
        "the groups are visited in leaves the same gradients and the same flags"
    ),
}  # fmt: skip


def why_equivalent(module: str, qualname: str, operator: str, change: str) -> str | None:
    """The reason a mutant is declared equivalent, or None."""
    return EQUIVALENT.get((module, qualname, operator, change))
