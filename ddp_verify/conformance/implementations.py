"""The implementations torch's optimizers have, as the constructor options that choose each:
the for-loop, foreach and fused paths (the names the conformance suite parametrizes by)."""

from __future__ import annotations

from typing import Any

IMPLEMENTATIONS: dict[str, dict[str, Any]] = {
    "for_loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}
