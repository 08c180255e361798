"""What a verifying world's ranks and helper import before their first job, named without
importing anything: the CLI hands the list to the fork server before this process imports
torch, so that the two imports run side by side."""

from __future__ import annotations

# Imported once, in the fork server: torch's first optimizer imports torch._dynamo (seconds
# of CPU per process otherwise); the rest is what methods, the reference and the diagnosis
# run.
RANK_PRELOAD = (
    "torch._dynamo",
    "torch.nn.parallel",
    "ddp_verify.usercode.adapters",
    "ddp_verify.methods.equivalence",
    "ddp_verify.usercode.diagnosis",
)
