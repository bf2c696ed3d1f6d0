"""Figures on their own Agg canvas with margins fitted to what they draw (the report's plots, the plan's
curves; no pyplot, no global figure manager), and the rule that names their files (`file_stem`)."""

from __future__ import annotations

import gc
import hashlib
import re
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np


def plot_label(var: str) -> str:
    """The name as matplotlib text, its `$` escaped."""
    return str(var).replace("$", r"\$")  # matplotlib would parse '$...$' as mathtext


PLOT_DPI = 100


@contextmanager
def gc_paused():
    """The cyclic garbage collector off while plotting: matplotlib allocates many small objects, and each
    collection they trigger scans every object of the (large) pipeline process."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def new_figure(width: float, height: float, ncols: int = 1):
    """A figure on its own Agg canvas, and its row of axes; no pyplot, so no global figure manager."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=PLOT_DPI)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


@dataclass
class _Overhang:
    """Pixels an axes' decorations reach beyond its box. `left`, `right`: (anchor, pixels) pairs, the anchor
    a fraction of the axes' width (0 = its left edge), so that they follow the axes when it narrows."""
    left: list[tuple[float, float]]
    right: list[tuple[float, float]]
    below: float
    above: float


def _overhang(ax, renderer, title_room: float, measured: dict) -> _Overhang:
    """Tick labels as the draw will show them (the draw reuses their cached text metrics), axis labels,
    offset texts and title. A title wider than `title_room` pixels is set smaller to fit. `measured` keeps
    each tick label's extent around its tick between calls."""
    points = ax.get_figure().dpi / 72
    box = ax.bbox
    x0, x1 = ax.get_xlim()
    left, right, below = [(0.0, 0.0)], [(1.0, 0.0)], 0.0     # the box itself
    for loc, label in _drawn_tick_labels(ax.xaxis):
        at = ax.transData.transform((loc, 0))[0]
        key = (id(ax.xaxis), label.get_text())
        if key not in measured:
            bb = label.get_window_extent(renderer)
            measured[key] = (at - bb.x0, bb.x1 - at, box.y0 - bb.y0)
        to_left, to_right, down = measured[key]
        anchor = (loc - x0) / (x1 - x0)
        left.append((anchor, to_left))
        right.append((anchor, to_right))
        below = max(below, down)
    below += max(_text_size(ax.xaxis.label, renderer, ax.xaxis.labelpad * points)[1],
                 _text_size(ax.xaxis.offsetText, renderer, ax.xaxis.OFFSETTEXTPAD * points)[1])
    beside = 0.0
    for _, label in _drawn_tick_labels(ax.yaxis):
        key = (id(ax.yaxis), label.get_text())
        if key not in measured:
            measured[key] = box.x0 - label.get_window_extent(renderer).x0
        beside = max(beside, measured[key])
    left.append((0.0, beside + _text_size(ax.yaxis.label, renderer, ax.yaxis.labelpad * points)[0]))
    top = box.y1
    offset = ax.yaxis.offsetText               # e.g. '1e-7' above the y axis, placed there as the draw places it
    if offset.get_visible() and offset.get_text():
        offset.set_position((offset.get_position()[0], box.y1 + ax.yaxis.OFFSETTEXTPAD * points))
        top = offset.get_window_extent(renderer).y1
    if ax.title.get_text():
        title_width = ax.title.get_window_extent(renderer).width
        if title_width > title_room:
            ax.title.set_fontsize(ax.title.get_fontsize() * title_room / title_width)
        tb = ax.title.get_window_extent(renderer)
        if top > box.y1 and tb.overlaps(offset.get_window_extent(renderer)):
            top = max(top + tb.height, tb.y1)  # the draw lifts the title onto the offset text
        else:
            top = max(top, tb.y1)
        left.append((0.5, tb.width / 2))
        right.append((0.5, tb.width / 2))
    return _Overhang(left, right, below, top - box.y1)


def _drawn_tick_labels(axis) -> list:
    """(location, label) of the major ticks in view, their labels (and the offset text) set and placed as the
    draw sets them."""
    locs = axis.get_majorticklocs()
    formatter = axis.get_major_formatter()
    texts = formatter.format_ticks(locs)
    axis.offsetText.set_text(formatter.get_offset())
    lo, hi = sorted(axis.get_view_interval())
    slack = 1e-10 * (hi - lo)
    drawn = []
    for loc, text, tick in zip(locs, texts, axis.get_major_ticks(len(locs))):
        if lo - slack <= loc <= hi + slack and tick.label1.get_visible():
            tick.update_position(loc)
            tick.label1.set_text(text)
            drawn.append((loc, tick.label1))
    return drawn


def _text_size(text, renderer, pad: float = 0.0) -> tuple[float, float]:
    """Width and height in pixels of a text plus `pad`; nothing for an empty or hidden one."""
    if not text.get_visible() or not text.get_text():
        return 0.0, 0.0
    bb = text.get_window_extent(renderer)
    return bb.width + pad, bb.height + pad


def fit_layout(fig) -> None:
    """Margins and gaps (tight_layout's padding: 1.08 font sizes) that keep the tick labels, axis labels and
    titles of a row of axes inside the canvas and apart.

    Stands in for tight_layout, which lays out every artist and leaves a layout engine that makes savefig
    draw twice; here only the decorations are measured and each bound is solved for in pixels. Measured
    again after each change, since the ticks an axis gets depend on its length."""
    import matplotlib

    renderer = fig.canvas.get_renderer()
    pad = 1.08 * matplotlib.rcParams["font.size"] * fig.dpi / 72
    applied, measured = None, {}
    for _ in range(3):
        left, right, bottom, top, gap = _margins(fig, renderer, pad, measured)
        if applied is not None and np.allclose(applied, (left, right, bottom, top, gap), atol=0.5):
            return
        width, height, n = fig.bbox.width, fig.bbox.height, len(fig.axes)
        axes_width = (width - left - right - (n - 1) * gap) / n
        fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                            top=1 - top / height, wspace=gap / axes_width if n > 1 else None)
        applied = (left, right, bottom, top, gap)


def _margins(fig, renderer, pad: float, measured: dict) -> tuple[float, float, float, float, float]:
    """(left, right, bottom, top, gap between axes) in pixels for the row of axes as it is now."""
    n = len(fig.axes)
    width, height = fig.bbox.width, fig.bbox.height
    over = [_overhang(ax, renderer, width / n - 2 * pad, measured) for ax in fig.axes]
    bottom = min(max(o.below for o in over) + pad, 0.6 * height)
    top = min(max(o.above for o in over) + pad, 0.3 * height)
    left = right = gap = pad
    for _ in range(6):                    # each bound is exact given the other two; they barely interact
        for f, e in over[0].left:         # left + f * axes width - e >= pad
            left = max(left, (pad + e - f * (width - right - (n - 1) * gap) / n) / max(1 - f / n, 1e-3))
        for f, e in over[-1].right:       # right + (1 - f) * axes width - e >= pad
            g = 1 - f
            right = max(right, (pad + e - g * (width - left - (n - 1) * gap) / n) / max(1 - g / n, 1e-3))
        for a, b in zip(over, over[1:]):  # gap + (1 - fa + fb) * axes width - ea - eb >= pad
            for fa, ea in a.right:
                for fb, eb in b.left:
                    c = 1 - fa + fb
                    if 1 - c * (n - 1) / n > 0.1:
                        gap = max(gap, (pad + ea + eb - c * (width - left - right) / n) / (1 - c * (n - 1) / n))
        left, right = min(left, 0.4 * width), min(right, 0.4 * width)
        gap = min(gap, 0.5 * (width - left - right) / max(n - 1, 1))    # the axes keep half the width left
    return left, right, bottom, top, gap


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


def file_stem(name: str) -> str:
    """A file name stem for a data or spec name: the name itself when it is a plain word (letters, digits,
    '.', '_', '-'; at most 80 characters; not ending in '.'), else a slug of it plus a short hash of the name,
    so that no name can leave its folder ('../x', 'a/b', '..') and two names never share a stem."""
    name = str(name)
    if _SAFE_NAME.fullmatch(name) and not name.endswith("."):
        return name
    return hashed_stem(name)


def hashed_stem(name: str) -> str:
    """A slug of the name plus the first 10 hex digits of its SHA-256 (see file_stem)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:60] or "var"
    return f"{slug}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"
