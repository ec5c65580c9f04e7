"""Helpers shared by the adapter tests: the committed framework fixtures, auditing them after
conversion, the not-run list a framework's doc page predicts, and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner, Result

import rollout_audit as ra
from rollout_audit.adapters import load
from rollout_audit.adapters.base import read_dump
from rollout_audit.cli import main
from rollout_audit.config import Config

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "frameworks"
# what these trainers do not record, as a user passes it (`--context KEY=VALUE`)
CONTEXT = {
    "environment_id": "search-qa",
    "environment_version": "2026-08",
    "verifier_version": "em-v1",
    "reset_seed": "0",
    "temperature": "1.0",
    "top_p": "1.0",
}


def fixture(name: str, case: str) -> Path:
    return FIXTURES / name / f"{case}.jsonl"


def audit(name: str, case: str, **cfg) -> ra.Report:
    """Audit a committed fixture after conversion, with the context above."""
    table = load(name).to_contract(read_dump(fixture(name, case)), **CONTEXT)
    return ra.audit_tables(table, config=Config(**cfg))


def documented_not_run(name: str) -> set[str]:
    """The codes docs/frameworks/<name>.md lists under its "Not run" heading."""
    text = (ROOT / "docs" / "frameworks" / f"{name}.md").read_text()
    section = text.split("## Not run", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([A-Z]\d{3})`", section))


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def context_args() -> list[str]:
    return [x for k, v in CONTEXT.items() for x in ("--context", f"{k}={v}")]


def findings(result: Result) -> list[tuple]:
    """(code, trajectory, turn, position, message) of a `--format json` run, file left out."""
    rep = json.loads(result.stdout)
    return sorted((f["code"], f["trajectory_id"], f["turn"], f["position"], f["message"]) for f in rep["findings"])


def convert_then_check_equals_check_from(name: str, case: str, tmp_path: Path, *options: str) -> list[tuple]:
    """Findings of `convert` then `check`, asserted equal to those of `check --from` (both with
    `options`); returned."""
    src, out = fixture(name, case), tmp_path / "log"
    converted = cli("convert", "--from", name, src, out, *context_args())
    assert converted.exit_code == 0, converted.output
    direct = cli("check", "--from", name, src, *context_args(), "--format", "json", *options)
    after = cli("check", out, "--format", "json", *options)
    assert (direct.exit_code, findings(direct)) == (after.exit_code, findings(after)), (direct.output, after.output)
    return findings(direct)


_MISSING = object()


def missing_field_exits_2(name: str, case: str, field: str, tmp_path: Path, value: object = _MISSING) -> str:
    """`check --from` on the fixture with `field` of its second record removed (or set to `value`):
    exit 2 and one line on stderr naming the field, no traceback; returns that line."""
    recs = read_dump(fixture(name, case))
    if value is _MISSING:
        del recs[1][field]
    else:
        recs[1][field] = value
    bad = tmp_path / "dump.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = cli("check", "--from", name, bad, *context_args())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "internal error" not in lines[0], result.stderr
    return lines[0]
