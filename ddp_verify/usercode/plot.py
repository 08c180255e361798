"""Pictures of a verdict, for people who would rather look: ``ddp-verify check --plot FILE``
draws the weights the diagnosis fitted to each rank's micro-batches (per sample or token)
against the weights single-process training gives them. Drawn from the verdict's JSON
document, so a saved ``--json`` can be drawn again. matplotlib is an optional extra
(``pip install ddp_verify[plot]``), imported only here.

Example::

    save_weights_plot(verdict.to_json(), "weights.png")
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from ..world.naming import public

__all__ = ["PlotUnavailable", "figure_class", "save_weights_plot", "weights_rows"]


@public
class PlotUnavailable(RuntimeError):
    """matplotlib is not installed, or the document has nothing to draw.

    Example::

        >>> try:
        ...     save_weights_plot({"verdict": "equivalent", "likely_causes": []}, "w.png")
        ... except PlotUnavailable as error:
        ...     print(type(error).__name__)
        PlotUnavailable
    """


def figure_class() -> Any:
    """matplotlib's ``Figure`` (drawn without pyplot: no display, no global state)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(
            "plots need matplotlib: pip install 'ddp_verify[plot]' (or pip install matplotlib)"
        ) from None
    return Figure


def weights_rows(document: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The first cause that carries fitted weights, and its rows (rank, micro-batch, items,
    weight, expected); :class:`PlotUnavailable` where no cause does.

    Example::

        >>> doc = {"likely_causes": [{"pattern": "x", "weights": []},
        ...        {"pattern": "ranks:world", "weights": [{"rank": 0, "micro_batch": 0,
        ...         "items": 1, "weight": 0.5, "expected": 0.33}]}]}
        >>> weights_rows(doc)[0]["pattern"]
        'ranks:world'
    """
    for cause in document.get("likely_causes") or []:
        if cause.get("weights"):
            return cause, list(cause["weights"])
    raise PlotUnavailable(
        f"nothing to plot: the verdict is {document.get('verdict')!r} and no cause carries "
        "fitted weights (--plot draws them for a not-equivalent verdict whose weighting was "
        "fitted)"
    )


def save_weights_plot(document: dict[str, Any], path: str | Path) -> Path:
    """Draw the fitted weights of ``document`` (a verdict's ``to_json()``) to ``path`` (the
    format from its suffix: .png, .svg, .pdf)."""
    cause, rows = weights_rows(document)
    figure = figure_class()(figsize=(max(5.0, 0.7 * len(rows) + 2), 3.6), layout="constrained")
    axes = figure.subplots()
    labels = [f"r{r['rank']} mb{r['micro_batch']}\n({r['items']})" for r in rows]
    positions = list(range(len(rows)))
    axes.bar(positions, [r["weight"] for r in rows], color="tab:red", alpha=0.75, label="fitted")
    axes.scatter(
        positions,
        [r["expected"] for r in rows],
        marker="_",
        s=900,
        linewidths=3,
        color="black",
        zorder=3,
        label="single process",
    )
    axes.set_xticks(positions, labels)
    axes.set_xlabel("rank, micro-batch (samples or tokens)")
    axes.set_ylabel("weight per sample")
    top = max(max(r["weight"] for r in rows), max(r["expected"] for r in rows))
    axes.set_ylim(min(0.0, min(r["weight"] for r in rows) * 1.1), top * 1.3 or 1.0)
    name = Path(str(document.get("target") or document.get("kind") or "")).name
    title = f"{name}: {cause.get('pattern', '')}" if name else str(cause.get("pattern", ""))
    axes.set_title(textwrap.fill(title, 70), fontsize="medium")
    axes.legend(loc="upper right", ncols=2, fontsize="small")
    target = Path(path)
    figure.savefig(target, dpi=110)
    return target
