"""The output formats of a report (text, concise, json, github, junit; sarif in .sarif), registered with
`running.report` so that `Report.render(fmt)` finds them. The JSON shape is a stable interface."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import polars as pl

from ..checks.common import num
from ..checks.replay import replay_line
from ..running.report import MAX_CHARS, Report, plural, register_format, verdict, verdict_line

__all__ = [
    "FORMATS",
    "MANY_LOGS",
    "MAX_CHARS",
    "Report",
    "json_text",
    "num",
    "printable",
    "render_logs",
    "strict",
    "verdict",
    "verdict_line",
]
# Characters a log string must not bring to a terminal, a CI log or an XML file: C0/C1 controls
# (escape sequences, newlines that start a forged `::error` line), DEL, bidirectional overrides,
# line/paragraph separators, surrogates and the non-characters U+FFFE/U+FFFF (illegal in XML).
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# What a GitHub Actions runner takes for a workflow command inside a line: `::` (a command when a line
# starts with it, leading blanks aside) and `##[` (the legacy form, obeyed anywhere in a line). A log
# string never brings either, nor half of one that the text around it would complete (a `:` or `##`
# at its edge): that character is shown escaped (`:\\x3a`, `\\x3a`, `#\\x23[`).
_COMMAND = re.compile(r"(?<=:):|^:|:$|(?<=#)#(?=\[|$)")


def printable(value: object) -> str:
    """`value` as text safe to print: unprintable characters shown as escapes (`\\x1b`), and no
    workflow command a CI runner would obey (`::`, `##[`), wherever the text lands in a line."""
    return _COMMAND.sub(_escape_char, _UNPRINTABLE.sub(_escape_char, str(value)))


# a non-finite number in JSON output: a string (NaN and Infinity are not JSON), as the README states
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def strict(value: Any) -> Any:
    """`value` with every non-finite float replaced by its string (`"NaN"`, `"Infinity"`,
    `"-Infinity"`), in dicts, lists and tuples at any depth: what strict JSON can hold."""
    if isinstance(value, float):
        return value if math.isfinite(value) else NON_FINITE[str(value)]
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def json_text(value: Any, indent: int | None = 1) -> str:
    """`value` as strict JSON (RFC 8259): non-finite floats as strings, anything else that is not
    JSON as its text."""
    return json.dumps(strict(value), indent=indent, default=str, allow_nan=False)


def _escape_char(m: re.Match) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


FORMATS = ("text", "concise", "json", "github", "junit", "sarif")


def _where(r: dict) -> str:
    parts = []
    if r["file"]:
        parts.append(printable(r["file"]))
    if r["trajectory_id"] is not None:
        parts.append(f"trajectory {printable(r['trajectory_id'])}")
    if r["turn"] is not None:
        parts.append(f"turn {r['turn']}")
    if r["position"] is not None:
        parts.append(f"position {r['position']}")
    return ", ".join(parts)


_STYLE = {"error": "bold red", "warning": "yellow", "info": "blue", "where": "cyan", "ok": "bold green"}


def render_text(
    rep: Report,
    limit: int | None = 20,
    *,
    color: bool = False,
    strict: bool = False,
    quiet: bool = False,
    show_not_run: bool = False,
    errors: bool = True,
    **_: object,
) -> str:
    """Findings grouped by code, a bounded sample each, then not-run checks and a summary line.
    `quiet`: the findings alone (nothing when there are none). `color`: ANSI styles (rich).
    `errors=False`: without the lines saying why the audit is incomplete (`audit_errors`), which the
    caller says elsewhere (the command line: on stderr)."""
    out: list[list[tuple[str, str | None]]] = []  # lines of (text, style) segments
    shown_findings = rep.findings.filter(pl.col("severity") != "info") if quiet else rep.findings
    for (code,), grp in shown_findings.group_by("code", maintain_order=True):
        sev = grp["severity"][0]
        name = rep.rules[code].name if code in rep.rules else ""
        out.append([(f"{code} [{sev}]", _STYLE[sev]), (f" {name}: {plural(grp.height, 'finding')}", None)])
        shown = grp if limit is None else grp.head(limit)
        for r in shown.iter_rows(named=True):
            where = _where(r)
            msg = printable(r["message"])
            out.append(
                [("  ", None), (f"{where}:", _STYLE["where"]), (f" {msg}", None)] if where else [(f"  {msg}", None)]
            )
        if limit is not None and grp.height > limit:
            out.append([(f"  ... {grp.height - limit} more (use --show-all or --format json)", None)])
    if not quiet:
        out += [[(line, None)] for line in _coda(rep, show_not_run, errors)]
        if rep.unusable is None and rep.summary.get("configuration"):
            out.append([(f"configuration: {printable(rep.summary['configuration'])}", None)])
        if rep.unusable is None:
            v = verdict(rep, strict)
            line = verdict_line(rep, strict)
            out.append([(v, _STYLE["ok"] if v == "ok" else _STYLE["error"]), (line[len(v) :], None)])
    return _join(out, color)


def audit_errors(rep: Report) -> list[str]:
    """Why the audit could not be completed (exit 2), in full, one line each: why nothing was
    audited, each crashed check with where and what it raised, what was asked for and did not
    happen, no check run. `incomplete` says the same in short."""
    if rep.unusable is not None:
        conf = rep.summary.get("configuration")
        return [
            f"nothing to audit: {printable(rep.unusable)}" + (f" (configuration: {printable(conf)})" if conf else "")
        ]
    out = []
    for c in rep.crashes:
        where = ", ".join(x for x in (c["file"], c["rows"] and f"rows {c['rows']}") if x)
        out.append(
            f"check {c['code']} crashed{' on ' + printable(where) if where else ''}: {printable(c['error'])}"
            + (f" ({c['times']} times)" if c["times"] > 1 else "")
        )
    out += _unfulfilled_lines(rep)
    if not rep.summary["checks_run"] and not rep.crashes:
        out.append("no check ran: nothing was verified")
    return out


def _coda(rep: Report, show_not_run: bool = True, errors: bool = True) -> list[str]:
    """What follows the findings: why nothing was audited, or not-run (one line naming them unless
    `show_not_run`), partial and crashed checks (`errors=False`: without the `audit_errors`)."""
    said = [f"error: {line}" for line in audit_errors(rep)] if errors else []
    if rep.unusable is not None:
        return said
    out = _policy_lines(rep)
    if rep.summary.get("replay"):
        out.append(replay_line(rep.summary["replay"]))
    if rep.not_run and show_not_run:
        out.append("not run:")
        out += [f"  {code}: {printable(why)}" for code, why in sorted(rep.not_run.items())]
    elif rep.not_run:
        out.append(f"not run: {', '.join(sorted(rep.not_run))} (--show-not-run for why)")
    left = rep.summary.get("checks_in_preview_not_selected") or []
    if left:  # a bundled fault a preview check catches must not pass without a word
        out.append(f"in preview, not selected: {', '.join(left)} (--preview runs them)")
    if rep.partial:
        out.append("partially run:")
        out += [f"  {code}: {printable(why)}" for code, why in sorted(rep.partial.items())]
    return out + said


def _policy_lines(rep: Report) -> list[str]:
    """What tolerated rates and a baseline (`rollout_audit.session.verdict`) did, one line each."""
    out = []
    for code, t in rep.summary.get("tolerated", {}).items():
        state, what = ("within", "reported as warnings") if t["within"] else ("above", "errors")
        out.append(
            f"{code}: {plural(t['trajectories'], 'trajectory', 'trajectories')} of {t['of']} ({t['share']:.2%}), "
            f"{state} the tolerated {t['limit']:.2%}: {what}"
        )
    b = rep.summary.get("baseline")
    if b:
        out.append(
            f"baseline {printable(b['file'])}: {b['seen']} of {b['recorded']} recorded findings seen, "
            f"{b['gone']} gone, {b['new']} new"
        )
    return out


def _unfulfilled_lines(rep: Report) -> list[str]:
    """One line per reason something asked for did not happen, naming the checks it stopped."""
    by_reason: dict[str, list[str]] = {}
    for code, why in sorted(rep.unfulfilled.items()):
        by_reason.setdefault(why, []).append(code)
    return [f"{', '.join(codes)}: {printable(why)}" for why, codes in by_reason.items()]


def incomplete(rep: Report) -> list[str]:
    """Why the audit could not be completed (exit 2), one line each; empty when it was."""
    if rep.unusable is not None:
        return [f"nothing to audit: {printable(rep.unusable)}"]
    if rep.crashes:
        codes = ", ".join(sorted({c["code"] for c in rep.crashes}))
        return [f"check(s) {codes} crashed; the audit is incomplete"]
    out = _unfulfilled_lines(rep)
    if not rep.summary["checks_run"]:
        out.append("no check ran: nothing was verified")
    return out


def _join(lines: list[list[tuple[str, str | None]]], color: bool) -> str:
    """Lines of styled segments as plain text, or with ANSI styles through rich."""
    if not color:
        return "\n".join("".join(t for t, _ in line) for line in lines)
    import io

    from rich.console import Console
    from rich.text import Text

    buf = io.StringIO()
    con = Console(  # asked for colour (--color) wins over NO_COLOR, which would leave bold alone
        file=buf,
        force_terminal=True,
        color_system="standard",
        width=1 << 20,
        highlight=False,
        soft_wrap=True,
        no_color=False,
    )
    for line in lines:
        con.print(Text.assemble(*((t, st or "") for t, st in line)), end="\n")  # Text: never parsed as markup
    return buf.getvalue().rstrip("\n")


def render_concise(
    rep: Report, *, strict: bool = False, quiet: bool = False, label: str = "", errors: bool = True, **_: object
) -> str:
    """One finding per line, `file:trajectory:turn:position: CODE message` (grep and editors);
    absent parts are empty, `:` in a trajectory id is escaped (`\\x3a`). Then the verdict line
    (`errors=False`: without the `audit_errors` lines before it, said elsewhere)."""
    lines = []
    for r in (rep.findings.filter(pl.col("severity") != "info") if quiet else rep.findings).iter_rows(named=True):
        tid = "" if r["trajectory_id"] is None else printable(r["trajectory_id"]).replace(":", "\\x3a")
        loc = [printable(r["file"] or ""), tid, *("" if r[k] is None else str(r[k]) for k in ("turn", "position"))]
        lines.append(f"{':'.join(loc)}: {r['code']} {printable(r['message'])}")
    if not quiet:  # `label` (several logs): the log's path before its verdict line
        lines += [f"{label}error: {x}" for x in audit_errors(rep)] if errors else []
        if rep.unusable is None:
            lines.append(label + verdict_line(rep, strict))
    return "\n".join(lines)


def render_github(rep: Report, **_: object) -> str:
    """GitHub Actions workflow commands, one annotation per finding."""
    level = {"error": "error", "warning": "warning", "info": "notice"}
    lines = []
    for r in rep.findings.iter_rows(named=True):
        msg = f"{r['code']} {printable(r['message'])}"
        loc = _where({**r, "file": None})
        if loc:
            msg += f" ({loc})"
        props = ([f"file={_gh_property(printable(r['file']))}"] if r["file"] else []) + [
            f"title={_gh_property(r['code'])}"
        ]
        lines.append(f"::{level[r['severity']]} {','.join(props)}::{_gh_data(msg)}")
    for c in rep.crashes:
        where = " ".join(x for x in (printable(c["file"] or ""), c["rows"] or "") if x)
        lines.append(
            f"::error title={_gh_property(c['code'] + ' crashed')}::{_gh_data(f'{where}: ' + printable(c['error']))}"
        )
    for code, why in sorted(rep.unfulfilled.items()):
        lines.append(f"::error title={_gh_property(f'{code} not run')}::{_gh_data(printable(why))}")
    by_reason: dict[str, list[str]] = {}  # checks not run, one notice for all: a clean log is one line
    for code, why in sorted(rep.not_run.items()):
        if code not in rep.unfulfilled:
            by_reason.setdefault(printable(why), []).append(code)
    if by_reason:
        n = sum(map(len, by_reason.values()))
        said = "; ".join(f"{', '.join(codes)}: {why}" for why, codes in by_reason.items())
        lines.append(f"::notice title={_gh_property(plural(n, 'check', 'checks') + ' not run')}::{_gh_data(said)}")
    return "\n".join(lines)


def _gh_data(s: str) -> str:
    """A workflow command's message, escaped per the runner's rules (`%`, CR, LF)."""
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(s: str) -> str:
    """A workflow command's property value, escaped per the runner's rules (also `:` and `,`)."""
    return _gh_data(s).replace(":", "%3A").replace(",", "%2C")


def render_junit(rep: Report, **_: object) -> str:
    """JUnit XML: one test case per check code; error findings fail it, not-run skips it."""
    from xml.sax.saxutils import escape, quoteattr  # brings urllib.request and http.client: JUnit only

    cases = []
    failures = skipped = 0
    for code, rule in sorted(rep.rules.items()):
        grp = rep.findings.filter(pl.col("code") == code)
        body = ""
        text = "\n".join(f"{_where(r)}: {printable(r['message'])}" for r in grp.head(200).iter_rows(named=True))
        crashed = [c for c in rep.crashes if c["code"] == code]
        if crashed:
            body = f"<error message={quoteattr(printable(crashed[0]['error']))}/>"
            failures += 1
        elif code in rep.unfulfilled:
            body = f"<error message={quoteattr(printable(rep.unfulfilled[code]))}/>"
            failures += 1
        elif code in rep.not_run:
            body = f"<skipped message={quoteattr(printable(rep.not_run[code]))}/>"
            skipped += 1
        elif grp.height and rule.severity == "error":
            body = f"<failure message={quoteattr(plural(grp.height, 'finding'))}>{escape(text)}</failure>"
            failures += 1
        elif grp.height:
            body = f"<system-out>{escape(text)}</system-out>"
        cases.append(f'  <testcase classname="rollout-audit" name={quoteattr(f"{code} {rule.name}")}>{body}</testcase>')
    head = (
        f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="rollout-audit" tests="{len(cases)}" '
        f'failures="{failures}" skipped="{skipped}">'
    )
    return "\n".join([head, *cases, "</testsuite>"])


# Formats that render several logs as one document of their own (SARIF: a run per log), by
# name: render(reports, **options) -> str, registered by the module that defines the format
MANY_LOGS: dict[str, Callable[..., str]] = {}


def render_logs(reports: list[tuple[list, Report]], fmt: str, **kw: Any) -> str:
    """The reports of several logs, each `(paths, report)`: one report as `Report.render` gives
    it; several, each under its (first) path: a `== PATH ==` header (text), the path before each
    verdict line (concise), one JSON object `{"logs": [...]}`, one JUnit `<testsuites>`; a format in
    `MANY_LOGS` as it renders them (SARIF: one log, a run per log)."""
    if len(reports) == 1:
        return reports[0][1].render(fmt, **kw)
    if fmt in MANY_LOGS:
        return MANY_LOGS[fmt](reports, **kw)
    if fmt == "json":
        return json_text({"logs": [{"path": str(p[0]), **r.to_dict()} for p, r in reports]})
    if fmt == "junit":
        suites = [r.render("junit").split("\n", 1)[1] for _, r in reports]
        named = [
            x.replace('name="rollout-audit"', f'name="rollout-audit {_xml(str(p[0]))}"', 1)
            for (p, _), x in zip(reports, suites)
        ]
        return '<?xml version="1.0" encoding="utf-8"?>\n<testsuites>\n' + "\n".join(named) + "\n</testsuites>"
    if fmt == "github":
        return "\n".join(x for x in (r.render(fmt) for _, r in reports) if x)
    if fmt == "concise":  # no headers: every line stays one finding, or one log's verdict after its path
        bodies = (
            render_concise(
                r, strict=kw["strict"], quiet=kw["quiet"], label=f"{printable(p[0])}: ", errors=kw.get("errors", True)
            )
            for p, r in reports
        )
        return "\n".join(b for b in bodies if b)
    parts = []
    for p, r in reports:
        body = r.render(fmt, **kw)
        if body:
            parts.append(f"== {printable(p[0])} ==\n{body}")
    return "\n\n".join(parts)


def _xml(s: str) -> str:
    """`s` as an XML attribute value (printable, quotes escaped)."""
    from xml.sax.saxutils import escape

    return escape(printable(s), {'"': "&quot;"})


def render_json(rep: Report, **_: object) -> str:
    """The report as JSON (`Report.to_dict`): findings, not run, partially run, crashes, summary."""
    return json_text(rep.to_dict())


register_format("text", render_text)
register_format("concise", render_concise)
register_format("json", render_json)
register_format("github", render_github)
register_format("junit", render_junit)
