"""`rollout-audit report`: one self-contained HTML page (inline SVG plots, no JavaScript)."""

from __future__ import annotations

from html import escape

from .report import Report

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
.error{color:#b00020}.warning{color:#a15c00}.info{color:#555}.ok{color:#1b7a1b}
.plots{display:flex;flex-wrap:wrap;gap:2em}"""


def bar_chart(title: str, items: list[tuple[str, float]], width: int = 420) -> str:
    """A horizontal bar chart as inline SVG."""
    if not items:
        return ""
    h = 22 * len(items) + 30
    top = max(v for _, v in items) or 1
    rows = []
    for i, (label, v) in enumerate(items):
        y = 25 + 22 * i
        w = (width - 170) * v / top
        rows.append(
            f'<text x="0" y="{y + 13}" font-size="12">{escape(str(label))[:22]}</text>'
            f'<rect x="150" y="{y}" width="{w:.1f}" height="16" fill="#4a7bd0"/>'
            f'<text x="{155 + w:.1f}" y="{y + 13}" font-size="11">{v:g}</text>'
        )
    return (
        f'<svg width="{width}" height="{h}" role="img"><text x="0" y="14" font-weight="bold" '
        f'font-size="13">{escape(title)}</text>{"".join(rows)}</svg>'
    )


def render_html(rep: Report, stats: dict | None, title: str) -> str:
    """The report page: verdict, findings per code, plots of the log's statistics, not-run checks."""
    by = rep.summary["by_severity"]
    verdict = '<span class="error">FAIL</span>' if by["error"] else '<span class="ok">ok</span>'
    parts = [
        f"<!doctype html><meta charset=utf-8><title>{escape(title)}</title><style>{_CSS}</style>",
        f"<h1>rollout-audit: {escape(title)} — {verdict}</h1>",
        f"<p>{by['error']} errors, {by['warning']} warnings, {by['info']} info; "
        f"{rep.summary['rows_read']} trajectories, {rep.summary['tokens_read']} tokens read.</p>",
    ]
    plots = [bar_chart("findings per code", sorted(rep.summary["counts"].items()))]
    if stats:
        plots.append(bar_chart("tokens by source", list(stats.get("tokens_by_source", {}).items())))
        plots.append(bar_chart("stop reasons", list(stats.get("stop_reasons", {}).items())))
        plots.append(
            bar_chart(
                "turns by policy version", [(f"v{k}", v) for k, v in stats.get("turns_by_policy_version", {}).items()]
            )
        )
    parts.append(f'<div class="plots">{"".join(p for p in plots if p)}</div>')
    parts.append("<h2>Findings</h2>")
    if rep.findings.is_empty():
        parts.append("<p>No findings.</p>")
    else:
        head = "".join(f"<th>{c}</th>" for c in rep.findings.columns)
        body = []
        for r in rep.findings.head(2000).iter_rows(named=True):
            cells = "".join(f"<td>{escape('' if v is None else str(v))}</td>" for v in r.values())
            body.append(f'<tr class="{r["severity"]}">{cells}</tr>')
        parts.append(f"<table><tr>{head}</tr>{''.join(body)}</table>")
        if rep.findings.height > 2000:
            parts.append(f"<p>… {rep.findings.height - 2000} more: use --format json.</p>")
    if rep.not_run:
        parts.append(
            "<h2>Not run</h2><table>"
            + "".join(f"<tr><td>{c}</td><td>{escape(w)}</td></tr>" for c, w in sorted(rep.not_run.items()))
            + "</table>"
        )
    return "\n".join(parts)
