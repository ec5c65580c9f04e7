"""The audit report: findings as a polars DataFrame, checks not run, a summary, and the
output formats (text, json, github, junit). The JSON shape is a stable interface."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

import polars as pl

from ..contract.registry import SEVERITY_ORDER, Rule
from ..running.runner import FINDING_SCHEMA, Runner

__all__ = ["FINDING_ORDER", "FINDING_SCHEMA", "FORMATS", "Report", "build_report", "sort_findings"]
# Characters a log string must not bring to a terminal, a CI log or an XML file: C0/C1 controls
# (escape sequences, newlines that start a forged `::error` line), DEL, bidirectional overrides,
# line/paragraph separators, surrogates and the non-characters U+FFFE/U+FFFF (illegal in XML).
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
MAX_CHARS = 500  # a finding's message, file or trajectory id is cut to this many characters


def printable(value: object) -> str:
    """`value` as text safe to print: unprintable characters shown as escapes (`\\x1b`)."""
    return _UNPRINTABLE.sub(_escape_char, str(value))


def _escape_char(m: re.Match) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def _truncate(name: str, limit: int = MAX_CHARS) -> pl.Expr:
    """A string column cut to `limit` characters, with the full length stated when cut."""
    c = pl.col(name)
    n = c.str.len_chars()
    cut = pl.concat_str(
        [c.str.slice(0, limit), pl.lit(f"… (cut to {limit} of "), n.cast(pl.String), pl.lit(" characters)")]
    )
    return pl.when(n > limit).then(cut).otherwise(c).alias(name)


FORMATS = ("text", "concise", "json", "github", "junit")
# The one order of findings in every output (text, concise, JSON, GitHub, JUnit, HTML): severity,
# then these columns, nulls last; rows equal on all of them keep the order the checks found them in.
FINDING_ORDER = ("code", "file", "trajectory_id", "turn", "position", "message")


@dataclass(repr=False)
class Report:
    """Result of an audit. `findings` has one row per finding (columns of FINDING_SCHEMA)."""

    findings: pl.DataFrame
    not_run: dict[str, str]
    summary: dict
    rules: dict[str, Rule] = field(default_factory=dict, repr=False)
    partial: dict[str, str] = field(default_factory=dict)  # code -> "ran on 812 of 1000 trajectories; ..."
    crashes: list[dict] = field(default_factory=list)  # checks that raised: code, error, file, rows
    unusable: str | None = None  # why no trajectory row could be audited (exit 2)
    # what the user asked for that did not happen (a check named by its code, a replay): exit 2
    unfulfilled: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True when every selected check that had its inputs ran to the end (no crash), some
        input was usable, some check ran, and everything the user asked for happened: only then
        can "ok" be trusted."""
        return not self.crashes and self.unusable is None and not self.unfulfilled and bool(self.summary["checks_run"])

    @property
    def ok(self) -> bool:
        """True exactly when the exit code is 0: the audit completed and no error finding blocks training."""
        return self.exit_code() == 0

    def count(self, severity: str) -> int:
        return int((self.findings["severity"] == severity).sum())

    def codes(self, severity: str | None = None) -> set[str]:
        f = self.findings if severity is None else self.findings.filter(pl.col("severity") == severity)
        return set(f["code"].to_list())

    def __repr__(self) -> str:
        return f"<Report {verdict_line(self)}>"

    def exit_code(self, strict: bool = False) -> int:
        """0 clean, 1 findings that block training, 2 the audit could not be completed."""
        if not self.complete:
            return 2
        if self.count("error") or (strict and self.count("warning")):
            return 1
        return 0

    def to_dict(self, limit: int | None = None) -> dict:
        f = self.findings if limit is None else self.findings.group_by("code", maintain_order=True).head(limit)
        return {
            "findings": f.to_dicts(),
            "not_run": [{"code": c, "reason": r} for c, r in sorted(self.not_run.items())],
            "partially_run": [{"code": c, "coverage": r} for c, r in sorted(self.partial.items())],
            "check_errors": self.crashes,
            "unusable": self.unusable,
            "unfulfilled": [{"code": c, "reason": r} for c, r in sorted(self.unfulfilled.items())],
            "summary": self.summary,
        }

    def render(
        self,
        fmt: str = "text",
        *,
        limit: int | None = 20,
        color: bool = False,
        strict: bool = False,
        quiet: bool = False,
    ) -> str:
        """The report in `fmt`. `quiet` (text, concise): findings only, nothing when there are none;
        `strict` makes warnings fail the verdict line as they fail the exit code."""
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=1, default=str)
        if fmt == "github":
            return render_github(self)
        if fmt == "junit":
            return render_junit(self)
        if fmt == "concise":
            return render_concise(self, strict=strict, quiet=quiet)
        return render_text(self, limit=limit, color=color, strict=strict, quiet=quiet)


def sort_findings(findings: pl.DataFrame) -> pl.DataFrame:
    """Findings in the report's one order: severity (error first), then FINDING_ORDER, nulls last."""
    return (
        findings.with_columns(pl.col("severity").replace_strict(SEVERITY_ORDER, return_dtype=pl.Int8).alias("_s"))
        .sort(["_s", *FINDING_ORDER], nulls_last=True, maintain_order=True)
        .drop("_s")
    )


def build_report(runner: Runner, *, rows: int, tokens: int, stats: dict, cfg, unusable: str | None = None) -> Report:
    """The report of a finished run: sorted findings, not-run and partial coverage, crashes."""
    findings = sort_findings(runner.findings_frame()).with_columns(
        _truncate("message"), _truncate("file"), _truncate("trajectory_id")
    )
    not_run, partial = runner.not_run(), runner.partial(rows)
    crashes = [{**c.to_dict(), "times": runner.crash_counts[c.code]} for c in runner.crashes]
    per_code = findings.group_by("code", "severity").len().sort("code").to_dicts()
    summary = {
        "rows_read": rows,
        "tokens_read": tokens,
        "counts": {d["code"]: d["len"] for d in per_code},
        "by_severity": {s: int((findings["severity"] == s).sum()) for s in SEVERITY_ORDER},
        "checks_run": sorted(c for c in runner.rules if c not in not_run and c not in runner.crash_counts),
        "checks_partially_run": sorted(partial),
        "checks_not_run": sorted(not_run),
        "checks_crashed": sorted(runner.crash_counts),
        "statistics": stats,
        "configuration": cfg.source,
    }
    unfulfilled = runner.unfulfilled() if unusable is None else {}
    return Report(findings, not_run, summary, runner.rules, partial, crashes, unusable, unfulfilled)


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
    rep: Report, limit: int | None = 20, *, color: bool = False, strict: bool = False, quiet: bool = False
) -> str:
    """Findings grouped by code, a bounded sample each, then not-run checks and a summary line.
    `quiet`: the findings alone (nothing when there are none). `color`: ANSI styles (rich)."""
    out: list[list[tuple[str, str | None]]] = []  # lines of (text, style) segments
    for (code,), grp in rep.findings.group_by("code", maintain_order=True):
        sev = grp["severity"][0]
        name = rep.rules[code].name if code in rep.rules else ""
        out.append([(f"{code} [{sev}]", _STYLE[sev]), (f" {name}: {_n(grp.height, 'finding')}", None)])
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
        out += [[(line, None)] for line in _coda(rep)]
        if rep.unusable is None and rep.summary.get("configuration"):
            out.append([(f"configuration: {printable(rep.summary['configuration'])}", None)])
        if rep.unusable is None:
            v = verdict(rep, strict)
            line = verdict_line(rep, strict)
            out.append([(v, _STYLE["ok"] if v == "ok" else _STYLE["error"]), (line[len(v) :], None)])
    return _join(out, color)


def _coda(rep: Report) -> list[str]:
    """What follows the findings: why nothing was audited, or not-run, partial and crashed checks."""
    if rep.unusable is not None:
        conf = rep.summary.get("configuration")
        return [
            f"error: nothing to audit: {printable(rep.unusable)}"
            + (f" (configuration: {printable(conf)})" if conf else "")
        ]
    out = []
    if rep.not_run:
        out.append("not run:")
        out += [f"  {code}: {printable(why)}" for code, why in sorted(rep.not_run.items())]
    if rep.partial:
        out.append("partially run:")
        out += [f"  {code}: {printable(why)}" for code, why in sorted(rep.partial.items())]
    for c in rep.crashes:
        where = ", ".join(x for x in (c["file"], c["rows"] and f"rows {c['rows']}") if x)
        out.append(
            f"error: check {c['code']} crashed{' on ' + printable(where) if where else ''}: {printable(c['error'])}"
            + (f" ({c['times']} times)" if c["times"] > 1 else "")
        )
    out += [f"error: {line}" for line in _unfulfilled_lines(rep)]
    if not rep.summary["checks_run"] and not rep.crashes:
        out.append("error: no check ran: nothing was verified")
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
    con = Console(
        file=buf, force_terminal=True, color_system="standard", width=1 << 20, highlight=False, soft_wrap=True
    )
    for line in lines:
        con.print(Text.assemble(*((t, st or "") for t, st in line)), end="\n")  # Text: never parsed as markup
    return buf.getvalue().rstrip("\n")


def verdict(rep: Report, strict: bool = False) -> str:
    """INCOMPLETE (exit 2), FAIL (exit 1) or ok (exit 0), as the exit code under `strict` says."""
    return {0: "ok", 1: "FAIL", 2: "INCOMPLETE"}[rep.exit_code(strict)]


def verdict_line(rep: Report, strict: bool = False) -> str:
    """'FAIL: 2 errors, 0 warnings, 0 info; 44 checks run, …; 128 trajectories, 9354 tokens read'."""
    s = rep.summary
    by = s["by_severity"]
    return (
        f"{verdict(rep, strict)}: {_n(by['error'], 'error')}, {_n(by['warning'], 'warning')}, {by['info']} info; "
        f"{_n(len(s['checks_run']), 'check')} run, {len(rep.partial)} partially run, "
        f"{len(rep.not_run)} not run"
        + (f", {len(s['checks_crashed'])} crashed" if rep.crashes else "")
        + f"; {_n(s['rows_read'], 'trajectory', 'trajectories')}, {_n(s['tokens_read'], 'token')} read"
    )


def _n(k: int, one: str, many: str | None = None) -> str:
    """'1 error', '2 errors'."""
    return f"{k} {one if k == 1 else (many or one + 's')}"


def render_concise(rep: Report, *, strict: bool = False, quiet: bool = False, label: str = "") -> str:
    """One finding per line, `file:trajectory:turn:position: CODE message` (grep and editors);
    absent parts are empty, `:` in a trajectory id is escaped (`\\x3a`). Then the verdict line."""
    lines = []
    for r in rep.findings.iter_rows(named=True):
        tid = "" if r["trajectory_id"] is None else printable(r["trajectory_id"]).replace(":", "\\x3a")
        loc = [printable(r["file"] or ""), tid, *("" if r[k] is None else str(r[k]) for k in ("turn", "position"))]
        lines.append(f"{':'.join(loc)}: {r['code']} {printable(r['message'])}")
    if not quiet:  # `label` (several logs): the log's path before its verdict line
        lines += [label + x for x in _coda(rep) if x.startswith("error: ")]
        if rep.unusable is None:
            lines.append(label + verdict_line(rep, strict))
    return "\n".join(lines)


def render_github(rep: Report) -> str:
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
    for code, why in sorted(rep.not_run.items()):
        if code not in rep.unfulfilled:
            lines.append(f"::notice title={_gh_property(f'{code} not run')}::{_gh_data(printable(why))}")
    return "\n".join(lines)


def _gh_data(s: str) -> str:
    """A workflow command's message, escaped per the runner's rules (`%`, CR, LF)."""
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(s: str) -> str:
    """A workflow command's property value, escaped per the runner's rules (also `:` and `,`)."""
    return _gh_data(s).replace(":", "%3A").replace(",", "%2C")


def render_junit(rep: Report) -> str:
    """JUnit XML: one test case per check code; error findings fail it, not-run skips it."""
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
            body = f"<failure message={quoteattr(_n(grp.height, 'finding'))}>{escape(text)}</failure>"
            failures += 1
        elif grp.height:
            body = f"<system-out>{escape(text)}</system-out>"
        cases.append(f'  <testcase classname="rollout-audit" name={quoteattr(f"{code} {rule.name}")}>{body}</testcase>')
    head = (
        f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="rollout-audit" tests="{len(cases)}" '
        f'failures="{failures}" skipped="{skipped}">'
    )
    return "\n".join([head, *cases, "</testsuite>"])
