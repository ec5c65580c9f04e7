"""Inline SVG charts for the report: every label and number is escaped and given room (nothing is
clipped); text widths are estimated for a monospace font so the layout needs no browser measurement."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from ..report import num, printable

CHAR_W = 7.4  # width of one character of the 12px monospace font used for every label
ROW_H = 20
PALETTE = ("#4a7bd0", "#d0704a", "#3c9a5f", "#9b59b6", "#c9a227", "#6c7a89", "#d04a7b", "#2bb0b0")
BAD, GOOD = "#c0392b", "#2e86c1"


def _label(s: object, limit: int = 28) -> str:
    """A log value as a short escaped label (cut with an ellipsis, never left unescaped)."""
    t = printable(s)
    return escape(t if len(t) <= limit else t[: limit - 1] + "…")


def _w(text: str) -> float:
    return len(text) * CHAR_W + 6


def _frame(title: str, width: float, height: float, body: str, note: str = "") -> str:
    """An SVG figure with its title and an optional note under it."""
    cap = f'<figcaption class="note">{escape(note)}</figcaption>' if note else ""
    return (
        f'<figure class="plot"><svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(title)}" font-family="monospace" '
        f'font-size="12"><text x="0" y="14" font-weight="bold" font-family="sans-serif" font-size="13">'
        f"{escape(title)}</text>{body}</svg>{cap}</figure>"
    )


def bars(
    title: str, items: Sequence[tuple[str, float, str | None]], *, fmt=num, plot_w: float = 260, note: str = ""
) -> str:
    """Horizontal bars (label, value, colour or None); each value is written after its bar."""
    if not items:
        return ""
    lw = max(_w(_label(lab)) for lab, _, _ in items)
    vw = max(_w(fmt(v)) for _, v, _ in items)
    top = max((abs(v) for _, v, _ in items), default=0) or 1
    rows = []
    for i, (lab, v, colour) in enumerate(items):
        y = 26 + ROW_H * i
        w = plot_w * abs(v) / top
        alarm = (
            ' fill="#b00020" font-weight="bold"' if colour == BAD else ""
        )  # a faulty row stands out even when its bar is thin
        rows.append(
            f'<text x="0" y="{y + 13}"{alarm}>{_label(lab)}</text>'
            f'<rect x="{lw:.1f}" y="{y + 2}" width="{max(w, 2.0 if colour == BAD and v else 0):.1f}" '
            f'height="{ROW_H - 5}" fill="{colour or PALETTE[0]}"/>'
            f'<text x="{lw + w + 4:.1f}" y="{y + 13}"{alarm}>{escape(fmt(v))}</text>'
        )
    return _frame(title, lw + plot_w + vw + 8, 32 + ROW_H * len(items), "".join(rows), note)


def _axis(lo: float, hi: float, x0: float, w: float, y: float) -> tuple[str, Callable[[float], float]]:
    """A horizontal axis from lo to hi with 5 ticks; returns (svg, value -> x)."""
    if hi <= lo:
        lo, hi = lo - 1, hi + 1

    def sx(v: float) -> float:
        return x0 + w * (v - lo) / (hi - lo)

    ticks = "".join(
        f'<line x1="{sx(t):.1f}" y1="{y}" x2="{sx(t):.1f}" y2="{y + 4}" stroke="#888"/>'
        f'<text x="{sx(t):.1f}" y="{y + 16}" text-anchor="middle">{escape(num(t))}</text>'
        for t in (lo + (hi - lo) * k / 4 for k in range(5))
    )
    return f'<line x1="{x0}" y1="{y}" x2="{x0 + w}" y2="{y}" stroke="#888"/>{ticks}', sx


def boxes(title: str, rows: Sequence[tuple[str, dict]], *, plot_w: float = 300, note: str = "") -> str:
    """Box plots on a shared axis; each row's dict holds min, q05, q25, q50, q75, q95, max and `n`."""
    rows = [(lab, q) for lab, q in rows if q.get("n") and q.get("min") is not None]
    if not rows:
        return ""
    lw = max(_w(_label(lab)) for lab, _ in rows) + 4
    lo = min(q["min"] for _, q in rows)
    hi = max(q["max"] for _, q in rows)
    ax_y = 26 + ROW_H * len(rows) + 4
    axis, sx = _axis(lo, hi, lw + 20, plot_w, ax_y)
    parts = [axis]
    if lo < 0 < hi:
        parts.append(
            f'<line x1="{sx(0):.1f}" y1="22" x2="{sx(0):.1f}" y2="{ax_y}" stroke="{BAD}" stroke-dasharray="3"/>'
        )
    for i, (lab, q) in enumerate(rows):
        y = 26 + ROW_H * i
        m = y + ROW_H / 2 - 2
        parts.append(
            f'<text x="0" y="{y + 13}">{_label(lab)}</text>'
            f'<line x1="{sx(q["min"]):.1f}" y1="{m}" x2="{sx(q["max"]):.1f}" y2="{m}" stroke="#999"/>'
            f'<line x1="{sx(q["q05"]):.1f}" y1="{m}" x2="{sx(q["q95"]):.1f}" y2="{m}" stroke="#333" stroke-width="2"/>'
            f'<rect x="{sx(q["q25"]):.1f}" y="{y + 3}" width="{max(sx(q["q75"]) - sx(q["q25"]), 1.5):.1f}" '
            f'height="{ROW_H - 9}" fill="{q.get("colour") or PALETTE[0]}" opacity=".8"/>'
            f'<line x1="{sx(q["q50"]):.1f}" y1="{y + 2}" x2="{sx(q["q50"]):.1f}" y2="{y + ROW_H - 5}" stroke="#000" '
            f'stroke-width="2"/><title>{_label(lab)}: n {q["n"]}, min {num(q["min"])}, median {num(q["q50"])}, '
            f"max {num(q['max'])}</title>"
        )
    return _frame(title, lw + plot_w + 60, ax_y + 24, "".join(parts), note)


def scatter(
    title: str,
    points: Sequence[tuple[float | None, float | None]],
    xlabel: str,
    ylabel: str,
    *,
    size: float = 260,
    note: str = "",
) -> str:
    """Recorded (y) against recomputed (x) with the y = x diagonal; points off it are drawn in red."""
    pts = [(float(x), float(y)) for x, y in points if x is not None and y is not None and _finite(x) and _finite(y)]
    if not pts:
        return ""
    lo = min(min(x, y) for x, y in pts)
    hi = max(max(x, y) for x, y in pts)
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    x0, y0 = 60.0, 28.0

    def sx(v: float) -> float:
        return x0 + size * (v - lo) / (hi - lo)

    def sy(v: float) -> float:
        return y0 + size * (hi - v) / (hi - lo)

    tol = 1e-6 * (hi - lo) + 1e-9
    dots = "".join(
        f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{BAD if abs(x - y) > tol else GOOD}" opacity=".7"/>'
        for x, y in pts
    )
    ticks = "".join(
        f'<text x="{sx(t):.1f}" y="{y0 + size + 16}" text-anchor="middle">{escape(num(t))}</text>'
        f'<text x="{x0 - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{escape(num(t))}</text>'
        for t in (lo, (lo + hi) / 2, hi)
    )
    off = sum(abs(x - y) > tol for x, y in pts)
    body = (
        f'<rect x="{x0}" y="{y0}" width="{size}" height="{size}" fill="none" stroke="#ccc"/>'
        f'<line x1="{sx(lo):.1f}" y1="{sy(lo):.1f}" x2="{sx(hi):.1f}" y2="{sy(hi):.1f}" stroke="#888" '
        f'stroke-dasharray="4"/>{dots}{ticks}'
        f'<text x="{x0 + size / 2}" y="{y0 + size + 32}" text-anchor="middle">{escape(xlabel)}</text>'
        f'<text x="12" y="{y0 + size / 2}" transform="rotate(-90 12 {y0 + size / 2})" text-anchor="middle">'
        f"{escape(ylabel)}</text>"
    )
    summary = f"{len(pts)} points, {off} off the diagonal"
    return _frame(title, x0 + size + 20, y0 + size + 40, body, f"{summary}. {note}".strip())


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def stacked(title: str, rows: Sequence[tuple[str, dict[str, int]]], *, plot_w: float = 300, note: str = "") -> str:
    """Stacked horizontal bars of shares (each row sums to 1), a legend of the categories, and each row's total."""
    rows = [(lab, d) for lab, d in rows if sum(d.values())]
    if not rows:
        return ""
    cats = sorted({c for _, d in rows for c in d}, key=lambda c: -sum(d.get(c, 0) for _, d in rows))
    colour = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(cats)}
    lw = max(_w(_label(lab)) for lab, _ in rows)
    parts = []
    for i, (lab, d) in enumerate(rows):
        y = 26 + ROW_H * i
        total, x = sum(d.values()), lw
        parts.append(f'<text x="0" y="{y + 13}">{_label(lab)}</text>')
        for c in cats:
            w = plot_w * d.get(c, 0) / total
            if w:
                parts.append(
                    f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{ROW_H - 5}" fill="{colour[c]}">'
                    f"<title>{_label(c)}: {d[c]} of {total}</title></rect>"
                )
            x += w
        parts.append(f'<text x="{lw + plot_w + 4:.1f}" y="{y + 13}">n={total}</text>')
    ly = 32 + ROW_H * len(rows)
    legend, x = [], 0.0
    for c in cats:
        legend.append(
            f'<rect x="{x:.1f}" y="{ly}" width="10" height="10" fill="{colour[c]}"/>'
            f'<text x="{x + 14:.1f}" y="{ly + 10}">{_label(c, 20)}</text>'
        )
        x += 24 + _w(_label(c, 20))
    width = max(lw + plot_w + 70, x)
    return _frame(title, width, ly + 20, "".join(parts + legend), note)


def dots(
    title: str,
    rows: Sequence[tuple[str, dict[str, float | None]]],
    series: dict[str, str],
    *,
    plot_w: float = 300,
    note: str = "",
) -> str:
    """A dot plot on a shared axis: per row, one dot per series (series name -> colour), with a legend."""
    vals = [float(v) for _, d in rows for v in d.values() if v is not None and _finite(v)]
    if not vals:
        return ""
    lw = max(_w(_label(lab)) for lab, _ in rows) + 4
    ax_y = 26 + ROW_H * len(rows) + 4
    axis, sx = _axis(min(vals), max(vals), lw + 10, plot_w, ax_y)
    parts = [axis]
    for i, (lab, d) in enumerate(rows):
        y = 26 + ROW_H * i + ROW_H / 2 - 2
        parts.append(f'<text x="0" y="{y + 4}">{_label(lab)}</text>')
        parts.append(f'<line x1="{lw + 10}" y1="{y}" x2="{lw + 10 + plot_w}" y2="{y}" stroke="#eee"/>')
        for s, colour in series.items():
            v = d.get(s)
            if v is not None and _finite(v):
                parts.append(
                    f'<circle cx="{sx(v):.1f}" cy="{y}" r="5" fill="{colour}" opacity=".85">'
                    f"<title>{_label(lab)} {escape(s)}: {num(v)}</title></circle>"
                )
    x = 0.0
    for s, colour in series.items():
        parts.append(
            f'<circle cx="{x + 5:.1f}" cy="{ax_y + 30}" r="5" fill="{colour}"/>'
            f'<text x="{x + 14:.1f}" y="{ax_y + 34}">{escape(s)}</text>'
        )
        x += 30 + _w(s)
    return _frame(title, max(lw + plot_w + 40, x), ax_y + 44, "".join(parts), note)
