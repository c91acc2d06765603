"""Inline SVG primitives for the report's charts: a frame with titled, labelled axes, and a legend.

Hand-made SVG keeps the page self-contained (no chart library, no script): every chart is a
fixed-size ``viewBox`` that scales with the page, its values readable in hover tooltips
(``<title>``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import attrs

WIDTH, HEIGHT = 900, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 34, 44

#: Okabe-Ito: distinguishable with the common colour-vision deficiencies
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")


def nice_ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``high`` (1, 2, 2.5 or 5 times a power of ten)."""
    if high <= 0 or not math.isfinite(high):
        return [0.0, 1.0]
    raw = high / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    n = math.ceil(high / step - 1e-9)
    return [i * step for i in range(n + 1)]


def tick_label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.3g}"


@attrs.frozen
class Frame:
    """The plot area of one chart, and its y scale (0 at the bottom)."""

    y_top: float
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = RIGHT

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - TOP - BOTTOM

    def y(self, value: float) -> float:
        return TOP + self.plot_h * (1 - value / self.y_top) if self.y_top else TOP + self.plot_h

    def x(self, fraction: float) -> float:
        return self.left + self.plot_w * fraction


def open_svg(cls: str, title: str, frame: Frame, attrs_: str = "") -> str:
    return (f'<svg class="chart {cls}" {attrs_} viewBox="0 0 {frame.width} {frame.height}" '
            f'width="{frame.width}" height="{frame.height}" role="img" aria-label="{escape(title)}">'
            f'<text class="title" x="{frame.left}" y="18">{escape(title)}</text>')


def y_axis(frame: Frame, ticks: Sequence[float], label: str) -> str:
    out = []
    for t in ticks:
        y = frame.y(t)
        out.append(f'<line class="grid" x1="{frame.left}" x2="{frame.left + frame.plot_w}" '
                   f'y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{frame.left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f"{tick_label(t)}</text>")
    mid = TOP + frame.plot_h / 2
    out.append(f'<text class="axis-label" transform="translate(14 {mid:.1f}) rotate(-90)" '
               f'text-anchor="middle">{escape(label)}</text>')
    out.append(f'<line class="axis" x1="{frame.left}" x2="{frame.left}" y1="{TOP}" '
               f'y2="{TOP + frame.plot_h}"/>')
    return "".join(out)


def x_axis(frame: Frame, ticks: Sequence[tuple[float, str]], label: str) -> str:
    """``ticks`` as (fraction of the plot width, label)."""
    base = TOP + frame.plot_h
    out = [f'<line class="axis" x1="{frame.left}" x2="{frame.left + frame.plot_w}" y1="{base}" y2="{base}"/>']
    for fraction, text in ticks:
        x = frame.x(fraction)
        out.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{base}" y2="{base + 4}"/>'
                   f'<text class="tick" x="{x:.1f}" y="{base + 16}" text-anchor="middle">'
                   f"{escape(text)}</text>")
    out.append(f'<text class="axis-label" x="{frame.left + frame.plot_w / 2:.1f}" y="{frame.height - 6}" '
               f'text-anchor="middle">{escape(label)}</text>')
    return "".join(out)


def legend(entries: Sequence[tuple[str, str]]) -> str:
    """An HTML legend (wraps with the page) of (colour, label)."""
    items = "".join(f'<span class="key"><i style="background:{c}"></i>{escape(t)}</span>' for c, t in entries)
    return f'<div class="legend">{items}</div>'


def index_ticks(labels: Sequence[int], count: int = 10) -> list[tuple[float, str]]:
    """About ``count`` x ticks over equally wide slots labelled ``labels`` (slot centres)."""
    n = len(labels)
    if not n:
        return []
    step = max(1, math.ceil(n / count))
    return [((i + 0.5) / n, str(labels[i])) for i in range(0, n, step)]
