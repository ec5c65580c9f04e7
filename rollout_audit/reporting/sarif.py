"""SARIF 2.1.0 output (OASIS Static Analysis Results Interchange Format), what code scanning
(GitHub, GitLab, VS Code's SARIF viewer) reads: one run per log, each check a rule of the
driver, each finding a result, checks not run, crashed or asked for and not done as the
invocation's notifications. Built as a dict and serialised once by `json_text`: every string a
log brings is escaped by the serialiser, never by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..contract.registry import RULES, Rule
from ..contract.version import __version__
from ..running.report import Report, register_format
from .report import MANY_LOGS, incomplete, json_text, printable

__all__ = ["SARIF_SCHEMA", "render_sarif", "render_sarif_logs", "sarif_log"]

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
# a finding's severity as a SARIF level (SARIF has no "info": its "note" is the informational level)
LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def artifact_uri(file: str) -> str:
    """A log file as a SARIF URI: relative to the working directory (percent-encoded, `/`
    separators) when it is inside it, else an absolute `file:` URI."""
    p = Path(file)
    if p.is_absolute():
        try:
            p = p.relative_to(Path.cwd())
        except ValueError:
            return p.as_uri()
    return quote(p.as_posix(), safe="/")


def logical_location(r: dict) -> dict | None:
    """Where in the log a finding is: `trajectory[ID]/turn[N]/token[P]`, as far as it is known."""
    parts = []
    for key, label in (("trajectory_id", "trajectory"), ("turn", "turn"), ("position", "token")):
        if r[key] is not None:
            parts.append(f"{label}[{printable(r[key])}]")
    if not parts:
        return None
    return {"name": parts[-1], "fullyQualifiedName": "/".join(parts), "kind": "element"}


def _rule(rule: Rule) -> dict:
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.name},
        "fullDescription": {"text": " ".join(rule.explanation.split("\n\n")[0].split())},
        "help": {"text": f"{rule.explanation}\n\n`rollout-audit explain {rule.code}`; docs/checks.md, {rule.code}."},
        "defaultConfiguration": {"level": LEVEL[rule.severity]},
        "properties": {"family": rule.family, "preview": rule.preview},
    }


def _notification(level: str, text: str, index: dict[str, int], code: str | None = None) -> dict:
    out: dict[str, Any] = {"level": level, "message": {"text": printable(text)}}
    if code is not None:
        out["descriptor"] = {"id": code}
        if code in index:
            out["associatedRule"] = {"id": code, "index": index[code]}
    return out


def sarif_run(rep: Report, strict: bool = False, path: str | None = None) -> dict:
    """One log's report as a SARIF `run`; `path`: the log's, naming the run (`automationDetails`)
    when one SARIF log holds several, so that code scanning keeps each log's results apart."""
    codes = sorted(set(rep.rules) | rep.codes())
    rules = [rep.rules.get(c) or RULES[c] for c in codes if c in rep.rules or c in RULES]
    index = {r.code: i for i, r in enumerate(rules)}
    results = []
    for r in rep.findings.iter_rows(named=True):
        res: dict[str, Any] = {
            "ruleId": r["code"],
            "level": LEVEL[r["severity"]],
            "message": {"text": printable(r["message"])},
        }
        if r["code"] in index:
            res["ruleIndex"] = index[r["code"]]
        loc: dict[str, Any] = {}
        if r["file"]:
            loc["physicalLocation"] = {"artifactLocation": {"uri": artifact_uri(r["file"])}}
        logical = logical_location(r)
        if logical is not None:
            loc["logicalLocations"] = [logical]
        if loc:
            res["locations"] = [loc]
        results.append(res)
    notes = []
    if rep.unusable is not None:
        notes.append(_notification("error", f"nothing to audit: {rep.unusable}", index))
    for c in rep.crashes:
        where = ", ".join(x for x in (c["file"], c["rows"] and f"rows {c['rows']}") if x)
        notes.append(
            _notification("error", f"crashed{' on ' + where if where else ''}: {c['error']}", index, c["code"])
        )
    for code, why in sorted(rep.unfulfilled.items()):
        notes.append(_notification("error", why, index, code))
    if rep.unusable is None and not rep.summary["checks_run"] and not rep.crashes:
        notes.append(_notification("error", "no check ran: nothing was verified", index))
    for code, why in sorted(rep.partial.items()):
        notes.append(_notification("warning", f"partially run: {why}", index, code))
    for code, why in sorted(rep.not_run.items()):
        if code not in rep.unfulfilled:
            notes.append(_notification("note", f"not run: {why}", index, code))
    for code in rep.summary.get("checks_in_preview_not_selected") or []:
        notes.append(_notification("note", "in preview, not selected (--preview runs it)", index, code))
    exit_code = rep.exit_code(strict)
    invocation: dict[str, Any] = {
        "executionSuccessful": rep.complete,
        "exitCode": exit_code,
        "workingDirectory": {"uri": Path.cwd().as_uri() + "/"},
    }
    if not rep.complete:
        invocation["exitCodeDescription"] = printable("; ".join(incomplete(rep)))
    if notes:
        invocation["toolExecutionNotifications"] = notes
    driver = {
        "name": "rollout-audit",
        "version": __version__,
        "semanticVersion": __version__,
        "rules": [_rule(r) for r in rules],
    }
    out = {
        "tool": {"driver": driver},
        "invocations": [invocation],
        "results": results,
        "columnKind": "unicodeCodePoints",
    }
    if path is not None:
        out["automationDetails"] = {"id": f"rollout-audit/{printable(path)}/"}
    return out


def sarif_log(reports: list[tuple[str | None, Report]], strict: bool = False) -> str:
    """Reports, each `(path of its log or None, report)`, as one SARIF log of one run each."""
    runs = [sarif_run(r, strict, path) for path, r in reports]
    return json_text({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": runs})


def render_sarif(rep: Report, *, strict: bool = False, **_: object) -> str:
    """The report as a SARIF 2.1.0 log of one run."""
    return sarif_log([(None, rep)], strict)


def render_sarif_logs(reports: list[tuple[list, Report]], *, strict: bool = False, **_: object) -> str:
    """Several logs, each `(paths, report)`, as one SARIF log: a run per log, named by its (first) path."""
    return sarif_log([(str(paths[0]), rep) for paths, rep in reports], strict)


register_format("sarif", render_sarif)
MANY_LOGS["sarif"] = render_sarif_logs
