"""The report page: the verdict, a table of every selected check, findings grouped per code with
examples, and plots of the distributions where the catalogued faults show. No JavaScript."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

import polars as pl

from ...checks.replay import replay_line
from ..report import Report, printable
from .figures import figures

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd}h3{font-size:1em}
table{border-collapse:collapse;font-size:.85em;width:100%}
td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}th{background:#f4f4f4}
td.num{text-align:right;white-space:nowrap}td.where{white-space:nowrap;width:1%}td.msg{word-break:break-word}
.verdict{font-size:1.2em;padding:.7em 1em;border-radius:6px;margin:1em 0}
.verdict.fail{background:#fdecea;border:1px solid #c0392b}.verdict.ok{background:#eafaf1;border:1px solid #2e8b57}
.verdict.incomplete{background:#fff4e5;border:1px solid #e67e22}
.status{font-weight:bold;white-space:nowrap}.fail{color:#b00020}.warn{color:#a15c00}.pass{color:#1b7a1b}
.partial{color:#8e44ad}.notrun{color:#666}.crashed{color:#a15c00;text-decoration:underline}
details pre{white-space:pre-wrap;font-size:.95em;background:#fafafa;padding:.5em;margin:.3em 0}
summary{cursor:pointer}.plots{display:flex;flex-wrap:wrap;gap:1.5em 2.5em}
figure.plot{margin:0}figcaption.note{font-size:.8em;color:#555;max-width:420px}
.sev-error{color:#b00020}.sev-warning{color:#a15c00}.sev-info,.sev-quiet{color:#555}"""

EXAMPLES = 20  # findings shown per code; the JSON format has them all
_STATUS = {  # status -> (label, css class, sort order)
    "crashed": ("crashed", "crashed", 0),
    "fail": ("fail", "fail", 1),
    "warn": ("findings", "warn", 2),
    "partial": ("partially run", "partial", 3),
    "notrun": ("not run", "notrun", 4),
    "pass": ("pass", "pass", 5),
}


def render_html(logs: Sequence[tuple[str, Report, dict | None]]) -> str:
    """The whole page as one string, for the logs `(title, report, statistics)`: one log's report,
    or several, each under its title after one line per log with its verdict (each log's element
    ids prefixed, so that every id stays unique). Every log string is escaped."""
    if len(logs) == 1:
        title, rep, stats = logs[0]
        t = escape(printable(title))
        body = [f"<h1>rollout-audit report: {t}</h1>", *_log(rep, stats, "")]
    else:
        t = f"{len(logs)} logs"
        rows = []
        for i, (title, rep, _) in enumerate(logs):
            cls, head, detail = verdict(rep)
            rows.append(
                f'<tr><td><a href="#log{i}">{escape(printable(title))}</a></td>'
                f'<td class="status {cls}">{escape(head)}</td><td>{escape(detail)}</td></tr>'
            )
        body = [
            f"<h1>rollout-audit report: {t}, each audited on its own</h1>",
            f'<table id="logs"><tr><th>log</th><th>verdict</th><th>why</th></tr>{"".join(rows)}</table>',
        ]
        for i, (title, rep, stats) in enumerate(logs):
            body += [f'<h2 class="log" id="log{i}">{escape(printable(title))}</h2>', *_log(rep, stats, f"log{i}-")]
    head = f'<!doctype html><html lang="en"><meta charset="utf-8"><link rel="icon" href="data:,"><title>rollout-audit: {t}</title>'
    return "\n".join([head, f"<style>{_CSS}</style><body>", *body, "</body></html>"])


def _log(rep: Report, stats: dict | None, ids: str) -> list[str]:
    """One log's part of the page: its verdict, its findings first, then every check, then the
    distributions. `ids`: the prefix of its element ids."""
    return [
        _verdict(rep, ids),
        "<h2>Findings</h2>",
        _findings(rep, ids),
        "<h2>Checks</h2>",
        _check_table(rep, ids),
        "<h2>Distributions</h2>",
        '<p class="note">Where the catalogued faults show. Red marks only what the audit found at fault (a '
        "value off its recomputation, a source trained on that must not be, an impossible value); blue a value "
        "recomputed that held; grey a value shown, not judged. Each plot's legend names its colours.</p>",
        f'<div class="plots">{"".join(figures(rep, stats or {}))}</div>',
    ]


def verdict(rep: Report) -> tuple[str, str, str]:
    """(css class, headline, detail): can this log be trained on, and if not, why."""
    by = rep.summary["by_severity"]
    if rep.unusable is not None:
        return "incomplete", "INCOMPLETE: nothing could be audited", printable(rep.unusable)
    if rep.crashes:
        codes = ", ".join(sorted({c["code"] for c in rep.crashes}))
        return "incomplete", "INCOMPLETE: do not trust this audit", f"check(s) {codes} crashed"
    failing = sorted(rep.codes("error"))
    if failing:
        return "fail", "FAIL: do not train on this log", f"{by['error']} error finding(s) in {', '.join(failing)}"
    notes = f"{by['warning']} warning(s), {by['info']} info"
    if rep.not_run:
        notes += f"; {len(rep.not_run)} check(s) not run (their faults were not looked for)"
    return "ok", "OK: no finding blocks training", notes


def _verdict(rep: Report, ids: str) -> str:
    cls, head, detail = verdict(rep)
    s = rep.summary
    counts = (
        f"{len(s['checks_run'])} checks run, {len(rep.partial)} partially run, {len(rep.not_run)} not run, "
        f"{len(s['checks_crashed'])} crashed; {s['rows_read']} trajectories, {s['tokens_read']} tokens read"
    )
    return (
        f'<div class="verdict {cls}" id="{ids}verdict"><strong>{escape(head)}</strong><br>{escape(detail)}'
        f"<br><small>{escape(counts)}</small>{_replayed(rep, ids)}</div>"
    )


def _not_replayed(rep: Report) -> str | None:
    """Why replay did not run, when it did not."""
    return None if rep.summary.get("replay") else rep.not_run.get("L205") or rep.unfulfilled.get("L205")


def _replayed(rep: Report, ids: str) -> str:
    """What replay recomputed, or why it did not run (said here once; the replay checks' rows point here)."""
    done = rep.summary.get("replay")
    if done:
        return f'<br><small id="{ids}replay">{escape(printable(replay_line(done)))}</small>'
    why = _not_replayed(rep)
    return f'<br><small id="{ids}replay">not replayed: {escape(printable(why))}</small>' if why else ""


def check_status(rep: Report) -> pl.DataFrame:
    """One row per selected check: code, name, severity, status, findings, reason (why not run / coverage)."""
    counts = rep.summary["counts"]
    failing = rep.codes("error")
    crashed = {c["code"]: printable(c["error"]) for c in rep.crashes}
    rows = []
    for code, rule in rep.rules.items():
        n = counts.get(code, 0)
        if code in crashed:
            status, why = "crashed", crashed[code]
        elif code in rep.not_run:
            status, why = "notrun", rep.not_run[code]
        elif code in failing:
            status, why = "fail", rep.partial.get(code, "")
        elif n:
            status, why = "warn", rep.partial.get(code, "")
        elif code in rep.partial:
            status, why = "partial", rep.partial[code]
        else:
            status, why = "pass", ""
        rows.append(
            {
                "code": code,
                "name": rule.name,
                "severity": rule.severity,
                "status": status,
                "findings": n,
                "reason": why,
                "order": _STATUS[status][2],
            }
        )
    schema = {
        "code": pl.String,
        "name": pl.String,
        "severity": pl.String,
        "status": pl.String,
        "findings": pl.Int64,
        "reason": pl.String,
        "order": pl.Int64,
    }
    return pl.DataFrame(rows, schema=schema).sort("order", "code")


def _check_table(rep: Report, ids: str) -> str:
    st = check_status(rep)
    replay_why = _not_replayed(rep)
    body = []
    for r in st.iter_rows(named=True):
        label, cls, _ = _STATUS[r["status"]]
        rule = rep.rules[r["code"]]
        reason = escape(printable(r["reason"]))
        if r["status"] == "notrun" and replay_why and r["reason"] == replay_why:  # said once, in the verdict
            reason = f'<a href="#{ids}replay">not replayed (why: under the verdict)</a>'
        body.append(
            f'<tr id="{ids}check-{r["code"]}" data-status="{r["status"]}"><td>{_code_link(r["code"], r["findings"], ids)}</td>'
            f'<td class="status {cls}">{label}</td><td class="num">{r["findings"]}</td>'
            f'<td class="{_severity_class(r["status"], rule.severity)}">{rule.severity}</td>'
            f"<td><details><summary>{escape(rule.name)}</summary><pre>{escape(rule.explanation)}</pre></details></td>"
            f"<td>{reason}</td></tr>"
        )
    return (
        f'<table id="{ids}checks"><tr><th>code</th><th>status</th><th>findings</th><th>severity</th>'
        f"<th>rule (click for the explanation)</th><th>reason / coverage</th></tr>{''.join(body)}</table>"
    )


def _severity_class(status: str, severity: str) -> str:
    """A check's severity in its colour only when the check found something: a check that passed
    (or did not run) shows its severity neutrally, so red stays the colour of error findings."""
    if status == "fail":
        return "sev-error"
    if status == "warn":  # findings below error (a warning rule, or an error rule's tolerated share)
        return "sev-info" if severity == "info" else "sev-warning"
    return "sev-quiet"


def _code_link(code: str, findings: int, ids: str) -> str:
    """A code, linked to its findings when it has some."""
    return f'<a href="#{ids}f-{code}">{code}</a>' if findings else code


def _findings(rep: Report, ids: str) -> str:
    if rep.findings.is_empty():
        return f'<p id="{ids}no-findings">No findings.</p>'
    out = []
    for (code,), grp in rep.findings.group_by("code", maintain_order=True):
        sev = grp["severity"][0]
        name = rep.rules[code].name if code in rep.rules else ""
        cols = [c for c in ("file", "trajectory_id", "turn", "position") if grp[c].null_count() < grp.height]
        head = "".join(f"<th>{c.replace('_id', '')}</th>" for c in cols) + "<th>message</th>"
        rows = []
        for r in grp.head(EXAMPLES).iter_rows(named=True):
            cells = "".join(f'<td class="where">{_cell(r[c], c)}</td>' for c in cols)
            rows.append(f'<tr>{cells}<td class="msg">{escape(printable(r["message"]))}</td></tr>')
        more = (
            f"<p>… {grp.height - EXAMPLES} more (all of them: <code>--format json</code>).</p>"
            if grp.height > EXAMPLES
            else ""
        )
        out.append(
            f'<section class="code" id="{ids}f-{code}"><h3 class="sev-{sev}">{code} [{sev}] {escape(name)}: '
            f"{grp.height} finding{'s' * (grp.height != 1)}</h3><table><tr>{head}</tr>{''.join(rows)}</table>{more}"
            "</section>"
        )
    return "".join(out)


def _cell(v: object, col: str) -> str:
    """A location cell: files shown by their last two path parts (the full path on hover)."""
    if v is None:
        return ""
    s = printable(v)
    if col == "file":
        short = "/".join(s.split("/")[-2:])
        return f'<span title="{escape(s)}">{escape(short)}</span>'
    return escape(s)
