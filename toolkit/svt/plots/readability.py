"""A reader's look at a drawn figure, as checks: text cut off at the figure's edge, two series drawn
alike (same colour, marker, line style and hatch) in one axes, and a legend drawn over the data.

``svt plot`` runs them on every figure it writes and says what it finds; the tests assert that no
figure of a real report gives any. Display coordinates throughout (the figure is drawn first), with
one pixel of slack for anti-aliasing.
"""

from __future__ import annotations

import numpy as np
from matplotlib.collections import PathCollection
from matplotlib.colors import to_hex
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text

SLACK = 1.0  # pixels


def problems(fig) -> list[str]:
    """Everything :func:`clipped_texts`, :func:`alike_series` and :func:`legends_over_data` find."""
    fig.canvas.draw()
    return clipped_texts(fig) + alike_series(fig) + legends_over_data(fig)


def _tick_labels(fig) -> dict[int, tuple]:
    """id -> (axis, which coordinate) of every tick label: matplotlib keeps labels for ticks beyond
    the view, which are never drawn."""
    out = {}
    for ax in fig.axes:
        for axis, i in ((ax.xaxis, 0), (ax.yaxis, 1)):
            for minor in (False, True):
                for t in axis.get_ticklabels(minor=minor):
                    out[id(t)] = (axis, i)
    return out


def _drawn(t: Text, ticks: dict) -> bool:
    if not t.get_visible() or not t.get_text().strip():
        return False
    if id(t) in ticks:  # a tick label is drawn only for a tick inside the axis's view
        axis, i = ticks[id(t)]
        lo, hi = sorted(axis.get_view_interval())
        v = t.get_position()[i]
        return lo - 1e-9 * max(1.0, abs(hi - lo)) <= v <= hi + 1e-9 * max(1.0, abs(hi - lo))
    return True


def clipped_texts(fig) -> list[str]:
    """Visible texts (titles, labels, tick labels, legend entries, notes) that leave the figure."""
    box = fig.bbox
    renderer = fig.canvas.get_renderer()
    ticks = _tick_labels(fig)
    out = []
    for t in fig.findobj(Text):
        if not _drawn(t, ticks):
            continue
        e = t.get_window_extent(renderer)
        if e.width == 0 and e.height == 0:
            continue
        if e.x0 < box.x0 - SLACK or e.y0 < box.y0 - SLACK or e.x1 > box.x1 + SLACK or e.y1 > box.y1 + SLACK:
            out.append(f"text {t.get_text()[:50]!r} is cut off at the figure's edge")
    return out


def _style(h) -> tuple:
    """How a legend entry's series looks: colour, marker, line style, hatch."""
    if isinstance(h, Line2D):
        return (to_hex(h.get_color()), h.get_marker() or "", h.get_linestyle(), "")
    if isinstance(h, Rectangle):
        return (to_hex(h.get_facecolor()), "", "", h.get_hatch() or "")
    if isinstance(h, PathCollection):
        fc = h.get_facecolor()
        return (to_hex(fc[0]) if len(fc) else "", "o", "", "")
    try:
        return (to_hex(h.get_facecolor()), "", "", getattr(h, "get_hatch", lambda: "")() or "")
    except (AttributeError, ValueError):
        return (repr(h),)


def alike_series(fig) -> list[str]:
    """Two legend entries of one axes drawn alike: a reader cannot tell them apart."""
    out = []
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None:
            continue
        seen: dict[tuple, str] = {}
        handles = leg.legend_handles
        for h, t in zip(handles, leg.get_texts(), strict=False):
            key = _style(h)
            label = t.get_text()
            if key in seen:
                out.append(f"{seen[key]!r} and {label!r} are drawn alike ({key[0]}) in {ax.get_title()[:40]!r}")
            else:
                seen[key] = label
    return out


def _data_boxes(ax) -> list:
    """Display-space boxes (x0, y0, x1, y1) of the data: line vertices, scatter points, bars."""
    boxes = []
    for line in ax.get_lines():
        if not line.get_visible() or line.get_label().startswith("_"):
            continue  # reference lines (chance, perfect calibration) are drawn unlabelled or behind
        xy = line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
        boxes += [(x, y, x, y) for x, y in xy if np.isfinite(x) and np.isfinite(y)]
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_visible():
            xy = coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), dtype=float))
            boxes += [(x, y, x, y) for x, y in xy if np.isfinite(x) and np.isfinite(y)]
    for p in ax.patches:
        if isinstance(p, Rectangle) and p.get_visible() and p.get_height() and np.isfinite(p.get_height()):
            e = p.get_window_extent()
            boxes.append((e.x0, e.y0, e.x1, e.y1))
    a = ax.bbox  # what the axes shows: marks outside it (a bar's hidden foot, a point beyond the limits) are not drawn
    shown = []
    for x0, y0, x1, y1 in boxes:
        x0, y0, x1, y1 = max(x0, a.x0), max(y0, a.y0), min(x1, a.x1), min(y1, a.y1)
        if x0 <= x1 and y0 <= y1:
            shown.append((x0, y0, x1, y1))
    return shown


def legends_over_data(fig) -> list[str]:
    """Legends drawn inside an axes over its data (a point, a line's vertex or a bar under them)."""
    out = []
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        leg = ax.get_legend()
        if not isinstance(leg, Legend) or not leg.get_visible():
            continue
        e = leg.get_window_extent(renderer)
        hits = sum(1 for x0, y0, x1, y1 in _data_boxes(ax)
                   if x0 < e.x1 - SLACK and x1 > e.x0 + SLACK and y0 < e.y1 - SLACK and y1 > e.y0 + SLACK)
        if hits:
            out.append(f"the legend of {ax.get_title()[:40]!r} covers {hits} data mark(s)")
    return out
