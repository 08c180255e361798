"""What ``ddp-verify parity --plot`` and ``--html`` draw: every word readable at any number of
layouts (no label on another, none off the figure), and a page that wraps to any window."""

from __future__ import annotations

import itertools
import re

import pytest

pytest.importorskip("matplotlib", reason="plots need the plot extra (matplotlib)")


def document(layouts: int) -> dict:
    """A parity document of ``layouts`` layouts, each departing at step 0 and close to the
    reference (their crosses and curves bunched together, as real ones are)."""
    rows = [
        {
            "layout": f"{2 ** (i % 3)}x{2 ** (i // 3)}",
            "verdict": "not-equivalent" if i % 2 == 0 else "equivalent",
            "first_divergence_step": 0 if i % 2 == 0 else None,
            "curves": {
                "loss": [1.0 + 0.001 * i, 0.8, 0.6],
                "gradient_norm": [2.0 + 0.001 * i, 1.5, 1.2],
            },
        }
        for i in range(layouts)
    ]
    reference = {
        "layout": "1x1",
        "curves": {"loss": [1.0, 0.8, 0.6], "gradient_norm": [2, 1.5, 1.2]},
    }
    return {"target": "python train.py --grad-accum {grad_accum}", "layouts": rows,
            "reference_layout": reference, "report": "x" * 400}  # fmt: skip


def text_boxes(figure) -> list:
    """Every piece of text the figure draws, with its box on the canvas: the title, the
    legend's entries, annotations, the axis labels, and the tick labels of ticks within view
    (matplotlib keeps the others, undrawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = [figure._suptitle]
    for legend in figure.legends:
        texts += legend.get_texts()
    for axes in figure.axes:
        texts += axes.texts  # annotations
        for axis in (axes.xaxis, axes.yaxis):
            texts.append(axis.label)
            low, high = sorted(axis.get_view_interval())
            span = (high - low) * 1e-9
            for tick in axis.get_major_ticks():
                if low - span <= tick.get_loc() <= high + span:
                    texts.append(tick.label1)
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for t in texts
        if t is not None and t.get_visible() and t.get_text().strip()
    ]


@pytest.mark.parametrize("layouts", [2, 6])
def test_no_label_of_the_curves_lands_on_another_or_off_the_figure(layouts):
    # Issue 61: each layout's "departs" label was drawn beside its cross, and layouts that
    # depart at one step put them on top of each other.
    from ddp_verify.parity.plot import curves_figure

    figure = curves_figure(document(layouts))
    boxes = text_boxes(figure)
    said = [text for text, _ in boxes]
    # Every layout is named with its verdict, and where it departs.
    for row in document(layouts)["layouts"]:
        assert any(text.startswith(f"{row['layout']}: ") for text in said), said
    assert sum("departs at step 0" in text for text in said) == (layouts + 1) // 2
    width, height = figure.bbox.width, figure.bbox.height
    for text, box in boxes:
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, text
    for (a, first), (b, second) in itertools.combinations(boxes, 2):
        assert not first.overlaps(second), f"{a!r} overlaps {b!r}"


def test_the_page_wraps_its_report_and_fits_its_picture_to_the_window(tmp_path):
    from ddp_verify.parity.plot import save_html

    page = save_html(document(2), tmp_path / "parity.html").read_text()
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    assert style is not None, page[:500]
    rules = dict(re.findall(r"(\w+)\{([^}]*)\}", style[1]))
    assert "white-space:pre-wrap" in rules["pre"] and "overflow-wrap:anywhere" in rules["pre"]
    assert "max-width:100%" in rules["img"]
    assert "<meta name='viewport'" in page
