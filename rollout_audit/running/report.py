"""The result of an audit: findings as a polars DataFrame, checks not run, a summary, crashes,
and the exit code they add up to. Output formats are registered by the reporting layer
(`register_format`); `Report.render` looks them up by name. The JSON shape is a stable interface."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from ..checks.replay import replay_summary
from ..contract.errors import UsageError
from ..contract.registry import SEVERITY_ORDER, Rule
from .runner import FINDING_SCHEMA, Runner

__all__ = ["FINDING_ORDER", "FINDING_SCHEMA", "MAX_CHARS", "Report", "build_report", "register_format", "sort_findings"]

MAX_CHARS = 500  # a finding's message, file or trajectory id is cut to this many characters
# The one order of findings in every output (text, concise, JSON, GitHub, JUnit, HTML): severity,
# then these columns, nulls last; rows equal on all of them keep the order the checks found them in.
FINDING_ORDER = ("code", "file", "trajectory_id", "turn", "position", "message")
# Output formats by name: format(report, **options) -> str (registered by rollout_audit.reporting)
_FORMATS: dict[str, Callable[..., str]] = {}


def register_format(name: str, render: Callable[..., str]) -> None:
    """Make `Report.render(name)` call `render(report, **options)`."""
    _FORMATS[name] = render


def formats() -> tuple[str, ...]:
    """The names of the registered output formats."""
    return tuple(_FORMATS)


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

    def render(self, fmt: str = "text", **options: object) -> str:
        """The report in the output format `fmt` (text, concise, json, github, junit, sarif: see
        rollout_audit.reporting.report for each one's options, e.g. `limit`, `strict`, `quiet`)."""
        if fmt not in _FORMATS:
            known = ", ".join(_FORMATS) or "none: import rollout_audit.reporting"
            raise UsageError(f"unknown report format {fmt!r} (registered: {known})")
        return _FORMATS[fmt](self, **options)


def verdict(rep: Report, strict: bool = False) -> str:
    """INCOMPLETE (exit 2), FAIL (exit 1) or ok (exit 0), as the exit code under `strict` says."""
    return {0: "ok", 1: "FAIL", 2: "INCOMPLETE"}[rep.exit_code(strict)]


def verdict_line(rep: Report, strict: bool = False) -> str:
    """'FAIL: 2 errors, 0 warnings, 0 info; 44 checks run, …; 128 trajectories, 9354 tokens read'."""
    s = rep.summary
    by = s["by_severity"]
    return (
        f"{verdict(rep, strict)}: {plural(by['error'], 'error')}, {plural(by['warning'], 'warning')}, {by['info']} info; "
        f"{plural(len(s['checks_run']), 'check')} run, {len(rep.partial)} partially run, "
        f"{len(rep.not_run)} not run"
        + (f", {len(s['checks_crashed'])} crashed" if rep.crashes else "")
        + f"; {plural(s['rows_read'], 'trajectory', 'trajectories')}, {plural(s['tokens_read'], 'token')} read"
        + (f" from {plural(s['dump_files'], 'dump file')}" if "dump_files" in s else "")
        + (f" ({len(s['dump_files_not_read'])} other files not read)" if s.get("dump_files_not_read") else "")
    )


def plural(k: int, one: str, many: str | None = None) -> str:
    """'1 error', '2 errors'."""
    return f"{k} {one if k == 1 else (many or one + 's')}"


def _truncate(name: str, limit: int = MAX_CHARS) -> pl.Expr:
    """A string column cut to `limit` characters, with the full length stated when cut."""
    c = pl.col(name)
    n = c.str.len_chars()
    cut = pl.concat_str(
        [c.str.slice(0, limit), pl.lit(f"… (cut to {limit} of "), n.cast(pl.String), pl.lit(" characters)")]
    )
    return pl.when(n > limit).then(cut).otherwise(c).alias(name)


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
    if unusable is not None:  # no column was read at all: the reason is why, not which columns are absent
        not_run = {c: f"nothing was audited: {unusable}" for c in not_run}
    # by code (each check's own in the order of its batches), whichever thread finished first
    ordered = sorted(runner.crashes, key=lambda c: c.code)
    crashes = [{**c.to_dict(), "times": runner.crash_counts[c.code]} for c in ordered]
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
        "checks_in_preview_not_selected": list(runner.preview_skipped),
        "statistics": stats,
        "configuration": cfg.source,
        "replay": replay_summary(stats),  # None: nothing was replayed (not asked, or could not run)
    }
    unfulfilled = runner.unfulfilled() if unusable is None else {}
    return Report(findings, not_run, summary, runner.rules, partial, crashes, unusable, unfulfilled)
