"""The audit report: findings as a polars DataFrame, checks not run, a summary, and the
output formats (text, json, github, junit). The JSON shape is a stable interface."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

import polars as pl

from .registry import SEVERITY_ORDER, Rule
from .runner import FINDING_SCHEMA, Runner

__all__ = ["FINDING_SCHEMA", "FORMATS", "Report", "build_report"]
FORMATS = ("text", "json", "github", "junit")


@dataclass
class Report:
    """Result of an audit. `findings` has one row per finding (columns of FINDING_SCHEMA)."""

    findings: pl.DataFrame
    not_run: dict[str, str]
    summary: dict
    rules: dict[str, Rule] = field(default_factory=dict, repr=False)
    partial: dict[str, str] = field(default_factory=dict)  # code -> "ran on 812 of 1000 trajectories; ..."
    crashes: list[dict] = field(default_factory=list)  # checks that raised: code, error, file, rows
    unusable: str | None = None  # why no trajectory row could be audited (exit 2)

    @property
    def complete(self) -> bool:
        """True when every selected check that had its inputs ran to the end (no crash) and
        some input was usable: only then can "ok" be trusted."""
        return not self.crashes and self.unusable is None

    @property
    def ok(self) -> bool:
        """True when no error finding blocks training."""
        return self.count("error") == 0

    def count(self, severity: str) -> int:
        return int((self.findings["severity"] == severity).sum())

    def codes(self, severity: str | None = None) -> set[str]:
        f = self.findings if severity is None else self.findings.filter(pl.col("severity") == severity)
        return set(f["code"].to_list())

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
            "summary": self.summary,
        }

    def render(self, fmt: str = "text", *, limit: int | None = 20, color: bool = False) -> str:
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=1, default=str)
        if fmt == "github":
            return render_github(self)
        if fmt == "junit":
            return render_junit(self)
        return render_text(self, limit=limit)


def _sort(findings: pl.DataFrame) -> pl.DataFrame:
    return (
        findings.with_columns(pl.col("severity").replace_strict(SEVERITY_ORDER, return_dtype=pl.Int8).alias("_s"))
        .sort(
            ["_s", "code", "file", "trajectory_id", "turn", "position", "message"], nulls_last=True, maintain_order=True
        )
        .drop("_s")
    )


def build_report(runner: Runner, *, rows: int, tokens: int, stats: dict, cfg, unusable: str | None = None) -> Report:
    """The report of a finished run: sorted findings, not-run and partial coverage, crashes."""
    findings = _sort(runner.findings_frame())
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
    }
    return Report(findings, not_run, summary, runner.rules, partial, crashes, unusable)


def _where(r: dict) -> str:
    parts = []
    if r["file"]:
        parts.append(r["file"])
    if r["trajectory_id"] is not None:
        parts.append(f"trajectory {r['trajectory_id']}")
    if r["turn"] is not None:
        parts.append(f"turn {r['turn']}")
    if r["position"] is not None:
        parts.append(f"position {r['position']}")
    return ", ".join(parts)


def render_text(rep: Report, limit: int | None = 20) -> str:
    """Findings grouped by code, a bounded sample each, then not-run checks and a summary line."""
    out = []
    for (code,), grp in rep.findings.group_by("code", maintain_order=True):
        sev = grp["severity"][0]
        name = rep.rules[code].name if code in rep.rules else ""
        out.append(f"{code} [{sev}] {name}: {grp.height} finding{'s' * (grp.height != 1)}")
        shown = grp if limit is None else grp.head(limit)
        for r in shown.iter_rows(named=True):
            where = _where(r)
            out.append(f"  {where}: {r['message']}" if where else f"  {r['message']}")
        if limit is not None and grp.height > limit:
            out.append(f"  ... {grp.height - limit} more (use --show-all or --format json)")
    if rep.unusable is not None:
        out.append(f"error: nothing to audit: {rep.unusable}")
        return "\n".join(out)
    if rep.not_run:
        out.append("not run:")
        for code, why in sorted(rep.not_run.items()):
            out.append(f"  {code}: {why}")
    if rep.partial:
        out.append("partially run:")
        for code, why in sorted(rep.partial.items()):
            out.append(f"  {code}: {why}")
    for c in rep.crashes:
        where = ", ".join(x for x in (c["file"], c["rows"] and f"rows {c['rows']}") if x)
        out.append(
            f"error: check {c['code']} crashed{' on ' + where if where else ''}: {c['error']}"
            + (f" ({c['times']} times)" if c["times"] > 1 else "")
        )
    s = rep.summary
    by = s["by_severity"]
    verdict = "INCOMPLETE" if rep.crashes else "FAIL" if by["error"] else "ok"
    out.append(
        f"{verdict}: {_n(by['error'], 'error')}, {_n(by['warning'], 'warning')}, {by['info']} info; "
        f"{_n(len(s['checks_run']), 'check')} run, {len(rep.partial)} partially run, "
        f"{len(rep.not_run)} not run"
        + (f", {len(s['checks_crashed'])} crashed" if rep.crashes else "")
        + f"; {_n(s['rows_read'], 'trajectory', 'trajectories')}, {_n(s['tokens_read'], 'token')} read"
    )
    return "\n".join(out)


def _n(k: int, one: str, many: str | None = None) -> str:
    """'1 error', '2 errors'."""
    return f"{k} {one if k == 1 else (many or one + 's')}"


def render_github(rep: Report) -> str:
    """GitHub Actions workflow commands, one annotation per finding."""
    level = {"error": "error", "warning": "warning", "info": "notice"}
    lines = []
    for r in rep.findings.iter_rows(named=True):
        msg = f"{r['code']} {r['message']}"
        loc = ", ".join(p for p in _where({**r, "file": None}).split(", ") if p)
        if loc:
            msg += f" ({loc})"
        msg = msg.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        f = f" file={r['file']}," if r["file"] else " "
        lines.append(f"::{level[r['severity']]}{f}title={r['code']}::{msg}".replace(", title", ",title"))
    for c in rep.crashes:
        lines.append(
            f"::error title={c['code']} crashed::"
            + f"{c['file'] or ''} {c['rows'] or ''}: {c['error']}".replace("%", "%25")
            .replace("\r", "%0D")
            .replace("\n", "%0A")
        )
    for code, why in sorted(rep.not_run.items()):
        lines.append(f"::notice title={code} not run::{why}")
    return "\n".join(lines)


def render_junit(rep: Report) -> str:
    """JUnit XML: one test case per check code; error findings fail it, not-run skips it."""
    cases = []
    failures = skipped = 0
    for code, rule in sorted(rep.rules.items()):
        grp = rep.findings.filter(pl.col("code") == code)
        body = ""
        crashed = [c for c in rep.crashes if c["code"] == code]
        if crashed:
            body = f"<error message={quoteattr(crashed[0]['error'])}/>"
            failures += 1
        elif code in rep.not_run:
            body = f"<skipped message={quoteattr(rep.not_run[code])}/>"
            skipped += 1
        elif grp.height and rule.severity == "error":
            text = "\n".join(f"{_where(r)}: {r['message']}" for r in grp.head(200).iter_rows(named=True))
            body = f"<failure message={quoteattr(f'{grp.height} findings')}>{escape(text)}</failure>"
            failures += 1
        elif grp.height:
            text = "\n".join(f"{_where(r)}: {r['message']}" for r in grp.head(200).iter_rows(named=True))
            body = f"<system-out>{escape(text)}</system-out>"
        cases.append(f'  <testcase classname="rollout-audit" name={quoteattr(f"{code} {rule.name}")}>{body}</testcase>')
    head = (
        f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="rollout-audit" tests="{len(cases)}" '
        f'failures="{failures}" skipped="{skipped}">'
    )
    return "\n".join([head, *cases, "</testsuite>"])
