"""The audit report: findings as a polars DataFrame, checks not run, a summary, and the
output formats (text, json, github, junit). The JSON shape is a stable interface."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

import polars as pl

from .registry import SEVERITY_ORDER, Rule

FINDING_SCHEMA = {
    "code": pl.String,
    "severity": pl.String,
    "message": pl.String,
    "file": pl.String,
    "trajectory_id": pl.String,
    "turn": pl.Int64,
    "position": pl.Int64,
}
FORMATS = ("text", "json", "github", "junit")


@dataclass
class Report:
    """Result of an audit. `findings` has one row per finding (columns of FINDING_SCHEMA)."""

    findings: pl.DataFrame
    not_run: dict[str, str]
    summary: dict
    rules: dict[str, Rule] = field(default_factory=dict, repr=False)

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
        if self.count("error") or (strict and self.count("warning")):
            return 1
        return 0

    def to_dict(self, limit: int | None = None) -> dict:
        f = self.findings if limit is None else self.findings.group_by("code", maintain_order=True).head(limit)
        return {
            "findings": f.to_dicts(),
            "not_run": [{"code": c, "reason": r} for c, r in sorted(self.not_run.items())],
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


def build_report(
    findings: pl.DataFrame, not_run: dict[str, str], *, rows: int, tokens: int, stats: dict, cfg, rules: dict[str, Rule]
) -> Report:
    findings = _sort(findings)
    per_code = findings.group_by("code", "severity").len().sort("code").to_dicts()
    summary = {
        "rows_read": rows,
        "tokens_read": tokens,
        "counts": {d["code"]: d["len"] for d in per_code},
        "by_severity": {s: int((findings["severity"] == s).sum()) for s in SEVERITY_ORDER},
        "checks_run": sorted(c for c in rules if c not in not_run or not_run[c].startswith("partly")),
        "checks_not_run": sorted(not_run),
        "statistics": stats,
    }
    return Report(findings, not_run, summary, rules)


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
    if rep.not_run:
        out.append("not run:")
        for code, why in sorted(rep.not_run.items()):
            out.append(f"  {code}: {why}")
    s = rep.summary
    by = s["by_severity"]
    verdict = "FAIL" if by["error"] else "ok"
    out.append(
        f"{verdict}: {by['error']} errors, {by['warning']} warnings, {by['info']} info; "
        f"{len(s['checks_run'])} checks run, {len(rep.not_run)} not run; "
        f"{s['rows_read']} trajectories, {s['tokens_read']} tokens read"
    )
    return "\n".join(out)


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
        if code in rep.not_run and not rep.not_run[code].startswith("partly"):
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
