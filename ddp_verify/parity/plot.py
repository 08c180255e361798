"""``ddp-verify parity --plot FILE`` and ``--html FILE``: each layout's per-step loss and
gradient norm against the reference's, the first divergence marked. Drawn from the parity
run's JSON document (its ``layouts`` rows and ``reference_layout`` carry the curves), so a
saved ``--json`` can be drawn again. matplotlib is an optional extra.

Example::

    save_curves(result.to_json(), "parity.png")
    save_html(result.to_json(), "parity.html")
"""

from __future__ import annotations

import base64
import html
import io
import textwrap
from pathlib import Path
from typing import Any

from ..usercode.plot import PlotUnavailable, figure_class

__all__ = ["curves_figure", "save_curves", "save_html"]

_PANELS = (("loss", "loss"), ("gradient_norm", "gradient norm"))


# Legend entries per row under the panels.
_LEGEND_COLUMNS = 3


def curves_figure(document: dict[str, Any]) -> Any:
    """The figure: one panel per quantity, the reference in black, each layout in its own
    colour, a cross where it first departs from the reference. Every word is in the legend
    under the panels (which layout, its verdict, the step it departs at), laid out by
    matplotlib, so that no label lands on another at any number of layouts."""
    reference = document.get("reference_layout") or {}
    rows = [row for row in document.get("layouts") or [] if row.get("curves")]
    if not reference.get("curves") or not rows:
        raise PlotUnavailable("nothing to plot: no layout ran to a recording (the report says why)")
    legend_rows = -(-(len(rows) + 1) // _LEGEND_COLUMNS)
    figure = figure_class()(figsize=(9.0, 3.4 + 0.3 * legend_rows), layout="constrained")
    panels = figure.subplots(1, len(_PANELS))
    for axes, (key, label) in zip(panels, _PANELS, strict=True):
        expected = reference["curves"][key]
        axes.plot(
            range(len(expected)), expected, color="black", linewidth=2.5,
            label=f"{reference['layout']} (reference)",
        )  # fmt: skip
        for row in rows:
            values = row["curves"][key]
            step = row.get("first_divergence_step")
            (line,) = axes.plot(
                range(len(values)), values, marker="o", linestyle="--", label=_said(row)
            )
            if step is not None and step < len(values):
                axes.plot(
                    [step], [values[step]], marker="x", markersize=14, markeredgewidth=3,
                    color=line.get_color(),
                )  # fmt: skip
        axes.set_xlabel("optimizer step")
        axes.set_ylabel(label)
        axes.set_xticks(range(len(expected)))
    handles, labels = panels[0].get_legend_handles_labels()
    figure.legend(
        handles, labels, loc="outside lower center", ncols=_LEGEND_COLUMNS, fontsize="small"
    )
    title = f"ddp-verify parity: {document.get('target') or ''}"
    figure.suptitle(textwrap.fill(title, 120), fontsize="small")
    return figure


def _said(row: dict[str, Any]) -> str:
    """A layout's legend entry: its label, its verdict, the step it departs at (marked x)."""
    if row["verdict"] == "equivalent":
        return f"{row['layout']}: equivalent"
    step = row.get("first_divergence_step")
    departs = f", departs at step {step} (x)" if step is not None else ""
    return f"{row['layout']}: not equivalent{departs}"


def save_curves(document: dict[str, Any], path: str | Path) -> Path:
    """Draw the curves to ``path`` (format from its suffix: .png, .svg, .pdf)."""
    target = Path(path)
    curves_figure(document).savefig(target, dpi=110)
    return target


# The page fits any window: the title and the report wrap (a report's lines run to hundreds
# of characters: commands, causes), the picture shrinks to the page's width.
_STYLE = (
    "body{max-width:72rem;margin:1rem auto;padding:0 1rem;font-family:sans-serif}"
    "h1{font-size:1.1rem;overflow-wrap:anywhere}"
    "img{max-width:100%;height:auto}"
    "pre{white-space:pre-wrap;overflow-wrap:anywhere;font-size:0.85rem}"
)


def save_html(document: dict[str, Any], path: str | Path) -> Path:
    """One self-contained page: the curves (embedded PNG) and the report."""
    buffer = io.BytesIO()
    curves_figure(document).savefig(buffer, format="png", dpi=110)
    image = base64.b64encode(buffer.getvalue()).decode("ascii")
    title = html.escape(f"ddp-verify parity: {document.get('target') or ''}")
    page = (
        f"<!doctype html>\n<html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{title}</title>\n<style>{_STYLE}</style></head>"
        f"<body>\n<h1>{title}</h1>\n<img alt='per-step loss and gradient norm of each layout' "
        f"src='data:image/png;base64,{image}'>\n<pre>{html.escape(document.get('report') or '')}"
        "</pre>\n</body></html>\n"
    )
    target = Path(path)
    target.write_text(page, encoding="utf-8")
    return target
