"""Inline SVG charts for the report: every label and number is escaped and given room (nothing is
clipped); text widths are estimated for a monospace font so the layout needs no browser measurement."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from ..report import num, printable

CHAR_W = 7.4  # width of one character of the 12px monospace font used for every label
ROW_H = 20
# One meaning per colour across the report: red marks a value the audit found at fault (a mismatch,
# a source trained on that must not be, an impossible value) and nothing else; blue a value that was
# recomputed and held; grey a value shown, not judged. Categories (stop causes, reward series) take
# the other hues, never red, and every plot says in its legend what its colours mean.
FAULT, HELD, NEUTRAL = "#c0392b", "#2e86c1", "#7f8c8d"
PALETTE = ("#4a7bd0", "#2bb0b0", "#c9a227", "#9b59b6", "#5d6d7e", "#3c9a5f", "#8d6e63", "#1f3a93")
REWARD_SUCCESS, REWARD_FAILURE = "#1b9e77", "#7570b3"  # a reward series, not a judgement: no red, no blue


def _label(s: object, limit: int = 28) -> str:
    """A log value as a short escaped label (cut with an ellipsis, never left unescaped)."""
    t = printable(s)
    return escape(t if len(t) <= limit else t[: limit - 1] + "…")


def _w(text: str) -> float:
    return len(text) * CHAR_W + 6


def _fault(colour: str | None) -> str:
    """The class of a mark: `fault` when it is drawn in the fault colour."""
    return ' class="fault"' if colour == FAULT else ""


def _frame(title: str, width: float, height: float, body: str, note: str = "") -> str:
    """An SVG figure with its title and an optional note under it; wide enough for its title."""
    width = max(width, len(title) * 8.0 + 4)
    cap = f'<figcaption class="note">{escape(note)}</figcaption>' if note else ""
    return (
        f'<figure class="plot"><svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(title)}" font-family="monospace" '
        f'font-size="12"><text x="0" y="14" font-weight="bold" font-family="sans-serif" font-size="13">'
        f"{escape(title)}</text>{body}</svg>{cap}</figure>"
    )


def _legend(entries: Sequence[tuple[str, str, str]], y: float, width: float) -> tuple[str, float, float]:
    """A legend of (shape: dot, box or dash; colour; text) entries from (0, y), wrapped at `width`;
    returns (svg, y below it, the rightmost x it reaches). A swatch says what a colour would mean:
    it is no fault itself."""
    parts, x, right = [], 0.0, 0.0
    for shape, colour, text in entries:
        label = _label(text, 48)
        w = 18 + _w(label)
        if x and x + w > width:
            x, y = 0.0, y + ROW_H - 4
        if shape == "dot":
            mark = f'<circle cx="{x + 5:.1f}" cy="{y - 4}" r="5" fill="{colour}"/>'
        elif shape == "dash":
            mark = f'<line x1="{x:.1f}" y1="{y - 4}" x2="{x + 10:.1f}" y2="{y - 4}" stroke="{colour}" stroke-dasharray="3"/>'
        else:
            mark = f'<rect x="{x:.1f}" y="{y - 9}" width="10" height="10" fill="{colour}"/>'
        parts.append(f'<g class="legend">{mark}<text x="{x + 14:.1f}" y="{y}">{label}</text></g>')
        right = max(right, x + w)
        x += w + 6
    return "".join(parts), y + 8, right


def bars(
    title: str,
    items: Sequence[tuple[str, float, str | None]],
    *,
    fmt=num,
    plot_w: float = 260,
    note: str = "",
    legend: Sequence[tuple[str, str, str]] = (),
) -> str:
    """Horizontal bars (label, value, colour or None); each value is written after its bar. A bar in
    the fault colour has its label and value in that colour too (it stands out even when thin)."""
    if not items:
        return ""
    lw = max(_w(_label(lab)) for lab, _, _ in items)
    vw = max(_w(fmt(v)) for _, v, _ in items)
    top = max((abs(v) for _, v, _ in items), default=0) or 1
    rows = []
    for i, (lab, v, colour) in enumerate(items):
        y = 26 + ROW_H * i
        w = plot_w * abs(v) / top
        alarm = f' fill="{FAULT}" font-weight="bold" class="fault"' if colour == FAULT else ""
        rows.append(
            f'<text x="0" y="{y + 13}"{alarm}>{_label(lab)}</text>'
            f'<rect x="{lw:.1f}" y="{y + 2}" width="{max(w, 2.0 if colour == FAULT and v else 0):.1f}" '
            f'height="{ROW_H - 5}" fill="{colour or PALETTE[0]}"{_fault(colour)}/>'
            f'<text x="{lw + w + 4:.1f}" y="{y + 13}"{alarm}>{escape(fmt(v))}</text>'
        )
    width = lw + plot_w + vw + 8
    key, bottom, right = _legend(legend, 42 + ROW_H * len(items), width) if legend else ("", 32 + ROW_H * len(items), 0)
    return _frame(title, max(width, right), bottom, "".join(rows) + key, note)


def _axis(lo: float, hi: float, x0: float, w: float, y: float) -> tuple[str, Callable[[float], float], float]:
    """A horizontal axis from lo to hi with 5 ticks, fewer when their labels would touch; returns
    (svg, value -> x, the rightmost x its labels reach)."""
    if hi <= lo:
        lo, hi = lo - 1, hi + 1

    def sx(v: float) -> float:
        return x0 + w * (v - lo) / (hi - lo)

    for k in (4, 2, 1):
        ticks = [lo + (hi - lo) * i / k for i in range(k + 1)]
        widest = max(_w(num(t)) for t in ticks)
        if widest + 4 <= w / k:
            break
    svg = "".join(
        f'<line x1="{sx(t):.1f}" y1="{y}" x2="{sx(t):.1f}" y2="{y + 4}" stroke="#888"/>'
        f'<text x="{sx(t):.1f}" y="{y + 16}" text-anchor="middle">{escape(num(t))}</text>'
        for t in ticks
    )
    return f'<line x1="{x0}" y1="{y}" x2="{x0 + w}" y2="{y}" stroke="#888"/>{svg}', sx, x0 + w + widest / 2


def boxes(
    title: str,
    rows: Sequence[tuple[str, dict]],
    *,
    plot_w: float = 300,
    note: str = "",
    zero: str = "",
    legend: Sequence[tuple[str, str, str]] = (),
) -> str:
    """Box plots on a shared axis; each row's dict holds min, q05, q25, q50, q75, q95, max, `n` and
    optionally `colour`. `zero` names a dashed line drawn at 0 (in the legend) when 0 is in range."""
    rows = [(lab, q) for lab, q in rows if q.get("n") and q.get("min") is not None]
    if not rows:
        return ""
    lw = max(_w(_label(lab)) for lab, _ in rows) + 4
    lo = min(q["min"] for _, q in rows)
    hi = max(q["max"] for _, q in rows)
    ax_y = 26 + ROW_H * len(rows) + 4
    axis, sx, right = _axis(lo, hi, lw + 20, plot_w, ax_y)
    parts = [axis]
    key = list(legend)
    if zero and lo < 0 < hi:
        parts.append(
            f'<line x1="{sx(0):.1f}" y1="22" x2="{sx(0):.1f}" y2="{ax_y}" stroke="#333" stroke-dasharray="3"/>'
        )
        key.append(("dash", "#333", zero))
    for i, (lab, q) in enumerate(rows):
        y = 26 + ROW_H * i
        m = y + ROW_H / 2 - 2
        colour = q.get("colour") or PALETTE[0]
        parts.append(
            f'<g><text x="0" y="{y + 13}">{_label(lab)}</text>'
            f'<line x1="{sx(q["min"]):.1f}" y1="{m}" x2="{sx(q["max"]):.1f}" y2="{m}" stroke="#999"/>'
            f'<line x1="{sx(q["q05"]):.1f}" y1="{m}" x2="{sx(q["q95"]):.1f}" y2="{m}" stroke="#333" stroke-width="2"/>'
            f'<rect x="{sx(q["q25"]):.1f}" y="{y + 3}" width="{max(sx(q["q75"]) - sx(q["q25"]), 1.5):.1f}" '
            f'height="{ROW_H - 9}" fill="{colour}" opacity=".8"{_fault(colour)}/>'
            f'<line x1="{sx(q["q50"]):.1f}" y1="{y + 2}" x2="{sx(q["q50"]):.1f}" y2="{y + ROW_H - 5}" stroke="#000" '
            f'stroke-width="2"/><title>{_label(lab)}: n {q["n"]}, min {num(q["min"])}, median {num(q["q50"])}, '
            f"max {num(q['max'])}</title></g>"
        )
    width = max(lw + plot_w + 60, right + 4)
    legend_svg, bottom, right = _legend(key, ax_y + 40, width) if key else ("", ax_y + 24, 0)
    return _frame(title, max(width, right), bottom, "".join(parts) + legend_svg, note)


def scatter(
    title: str,
    points: Sequence[tuple[float | None, float | None]],
    xlabel: str,
    ylabel: str,
    *,
    size: float = 260,
    note: str = "",
) -> str:
    """Recorded (y) against recomputed (x) with the y = x diagonal; points off it are drawn in the
    fault colour, and a legend says so. The left margin fits the widest y tick label beside the
    y-axis title, so neither covers the other."""
    pts = [(float(x), float(y)) for x, y in points if x is not None and y is not None and _finite(x) and _finite(y)]
    if not pts:
        return ""
    lo = min(min(x, y) for x, y in pts)
    hi = max(max(x, y) for x, y in pts)
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    ticks = (lo, (lo + hi) / 2, hi)
    tick_w = max(_w(num(t)) for t in ticks)
    x0, y0 = 24.0 + tick_w, 28.0  # the rotated y title takes x 0–18, the tick labels end at x0 - 4

    def sx(v: float) -> float:
        return x0 + size * (v - lo) / (hi - lo)

    def sy(v: float) -> float:
        return y0 + size * (hi - v) / (hi - lo)

    tol = 1e-6 * (hi - lo) + 1e-9
    colours = [FAULT if abs(x - y) > tol else HELD for x, y in pts]
    dots = "".join(
        f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}" opacity=".7"{_fault(c)}/>'
        for (x, y), c in zip(pts, colours)
    )
    marks = "".join(
        f'<text x="{sx(t):.1f}" y="{y0 + size + 22}" text-anchor="middle">{escape(num(t))}</text>'
        f'<text x="{x0 - 4:.1f}" y="{sy(t) + 4:.1f}" text-anchor="end">{escape(num(t))}</text>'
        for t in ticks
    )
    off = colours.count(FAULT)
    width = x0 + size + max(20.0, tick_w / 2 + 4)
    key, bottom, right = _legend(
        [("dot", HELD, "recorded = recomputed"), ("dot", FAULT, "recorded ≠ recomputed (mismatch)")],
        y0 + size + 60,
        width,
    )
    body = (
        f'<rect x="{x0:.1f}" y="{y0}" width="{size}" height="{size}" fill="none" stroke="#ccc"/>'
        f'<line x1="{sx(lo):.1f}" y1="{sy(lo):.1f}" x2="{sx(hi):.1f}" y2="{sy(hi):.1f}" stroke="#888" '
        f'stroke-dasharray="4"/>{dots}{marks}'
        f'<text x="{x0 + size / 2:.1f}" y="{y0 + size + 40}" text-anchor="middle">{_label(xlabel, int(size // CHAR_W))}</text>'
        f'<text x="13" y="{y0 + size / 2}" transform="rotate(-90 13 {y0 + size / 2})" text-anchor="middle">'
        f"{_label(ylabel, int(size // CHAR_W))}</text>{key}"
    )
    summary = f"{len(pts)} points, {off} off the diagonal"
    return _frame(title, max(width, right), bottom, body, f"{summary}. {note}".strip())


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
    width = lw + plot_w + 70
    key, bottom, right = _legend([("box", colour[c], c) for c in cats], 42 + ROW_H * len(rows), width)
    return _frame(title, max(width, right), bottom, "".join(parts) + key, note)


def dots(
    title: str,
    rows: Sequence[tuple[str, dict[str, float | None], bool]],
    series: dict[str, str],
    *,
    plot_w: float = 300,
    note: str = "",
    flagged: str = "",
) -> str:
    """A dot plot on a shared axis: per row (label, series -> value, at fault), one dot per series
    (series name -> colour), with a legend. A row at fault has its label in the fault colour, and
    `flagged` says in the legend what that means."""
    vals = [float(v) for _, d, _ in rows for v in d.values() if v is not None and _finite(v)]
    if not vals:
        return ""
    lw = max(_w(_label(lab)) for lab, _, _ in rows) + 4
    ax_y = 26 + ROW_H * len(rows) + 4
    axis, sx, right = _axis(min(vals), max(vals), lw + 10, plot_w, ax_y)
    parts = [axis]
    for i, (lab, d, bad) in enumerate(rows):
        y = 26 + ROW_H * i + ROW_H / 2 - 2
        alarm = f' fill="{FAULT}" font-weight="bold" class="fault"' if bad else ""
        parts.append(f'<text x="0" y="{y + 4}"{alarm}>{_label(lab)}</text>')
        parts.append(f'<line x1="{lw + 10}" y1="{y}" x2="{lw + 10 + plot_w}" y2="{y}" stroke="#eee"/>')
        for s, colour in series.items():
            v = d.get(s)
            if v is not None and _finite(v):
                parts.append(
                    f'<circle cx="{sx(v):.1f}" cy="{y}" r="5" fill="{colour}" opacity=".85">'
                    f"<title>{_label(lab)} {escape(s)}: {num(v)}</title></circle>"
                )
    width = max(lw + plot_w + 40, right + 4)
    entries = [("dot", colour, s) for s, colour in series.items()]
    if flagged and any(bad for _, _, bad in rows):
        entries.append(("box", FAULT, flagged))
    key, bottom, right = _legend(entries, ax_y + 40, width)
    return _frame(title, max(width, right), bottom, "".join(parts) + key, note)
