"""Helpers shared by the adapter tests: the committed framework fixtures, auditing them after
conversion, the not-run list a framework's doc page predicts, the CLI as a user runs it
(`check --from`, `convert`), and records with a required field removed."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

import rollout_audit as ra
from rollout_audit.adapters import load
from rollout_audit.adapters.base import read_dump
from rollout_audit.cli import main
from rollout_audit.contract.config import Config

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
    """A case's dump: its JSON Lines file, or its directory for a dump of binary files (prime-rl)."""
    lines, folder = FIXTURES / name / f"{case}.jsonl", FIXTURES / name / case
    return folder if folder.is_dir() and not lines.exists() else lines


def audit(name: str, case: str, **cfg) -> ra.Report:
    """Audit a committed fixture after conversion, with the context above."""
    table = load(name).to_contract(read_dump(fixture(name, case)), **CONTEXT)
    return ra.audit_tables(table, config=Config(**cfg))


def documented_not_run(name: str) -> set[str]:
    """The codes docs/frameworks/<name>.md lists under its "Not run …" or "Checks not run" heading."""
    text = (ROOT / "docs" / "frameworks" / f"{name}.md").read_text()
    section = re.split(r"^## (?:Checks not run|Not run)", text, maxsplit=1, flags=re.M)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([A-Z]\d{3})`", section))


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def context_args() -> list[str]:
    return [x for k, v in CONTEXT.items() for x in ("--context", f"{k}={v}")]


def findings(result: Result) -> list[tuple]:
    """(code, trajectory, turn, position, message) of a `--format json` run, file left out."""
    rep = json.loads(result.stdout)
    return sorted((f["code"], f["trajectory_id"], f["turn"], f["position"], f["message"]) for f in rep["findings"])


def convert_then_check_equals_check_from(
    name: str, case: str, tmp_path: Path, *options: str, context: list[str] | None = None
) -> list[tuple]:
    """Findings of `convert` then `check`, asserted equal to those of `check --from` (both with
    `options`), with the same not-run list; returned. `context`: KEY=VALUE pairs (default CONTEXT)."""
    src, out = fixture(name, case), tmp_path / "log"
    ctx = context_args() if context is None else opts(context)
    converted = cli("convert", "--from", name, src, out, *ctx)
    assert converted.exit_code == 0, converted.output + converted.stderr
    direct = cli("check", "--from", name, src, *ctx, "--format", "json", *options)
    after = cli("check", out, "--format", "json", *with_users_word(options, converted, tmp_path))
    assert (direct.exit_code, findings(direct)) == (after.exit_code, findings(after)), (direct.output, after.output)
    assert json.loads(direct.stdout)["not_run"] == json.loads(after.stdout)["not_run"]
    return findings(direct)


def users_word(converted: Result, tmp: Path) -> list[str]:
    """What the user states to audit a converted log as `check --from` audits the dump: the adapter
    vouched for the required columns its trainer does not record (`not_recorded = [...]`) and for
    the loss denominators (`denominator_not_recorded = true`), which the log cannot say of itself;
    a `--config` with what `convert` said on stderr."""
    lines = re.findall(r"(not_recorded = \[[^]]*\]|denominator_not_recorded = true)", converted.stderr)
    if not lines:
        return []
    mine = tmp / "users-word.toml"
    mine.write_text("[tool.rollout-audit]\n" + "\n".join(dict.fromkeys(lines)) + "\n")
    return ["--config", str(mine)]


def with_users_word(options: tuple[str, ...], converted: Result, tmp: Path) -> list[str]:
    """`options` with what `convert` asked the user to state (`users_word`), added to the `--config`
    file the options name (its settings last in it) or as a `--config` of its own."""
    word = users_word(converted, tmp)
    if not word or "--config" not in options:
        return [*options, *word]
    out = list(options)
    i = out.index("--config") + 1
    both = tmp / "users-config.toml"
    both.write_text(Path(out[i]).read_text() + "\n" + Path(word[1]).read_text().split("\n", 1)[1])
    out[i] = str(both)
    return out


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


def one_line(result: Result) -> str:
    """The one line on stderr of a run that could not complete (exit 2, no traceback)."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output and "internal error" not in result.stderr, result.stderr
    return lines[0]


# ---------------------------------------------------------------- JSON reports of the CLI

IDENTITY = ["environment_id=doors", "environment_version=v1", "verifier_version=v1", "reset_seed=0"]


def opts(context: list[str]) -> list[str]:
    return [x for kv in context for x in ("--context", kv)]


def report(paths: list[Any], name: str | None, context: list[str]) -> dict:
    """The JSON report of `check` (converting with --from NAME when given)."""
    frm = ["--from", name, *opts(context)] if name else []
    res = cli("check", *paths, *frm, "--format", "json")
    assert res.exit_code in (0, 1), res.output + res.stderr
    return json.loads(res.stdout)


def finding_keys(rep: dict) -> list[tuple[str, str | None, int | None]]:
    """(code, trajectory, turn) of each finding, sorted."""
    return sorted((f["code"], f["trajectory_id"], f["turn"]) for f in rep["findings"])


def same_after_convert(name: str, case: str, context: list[str], tmp: Path) -> None:
    """`convert` then `check` gives the findings and not-run list of `check --from`."""
    convert_then_check_equals_check_from(name, case, tmp, context=context)


def without(record: dict, path: list[Any]) -> dict:
    """A deep copy of `record` with the field at `path` (keys and indices) removed."""
    rec = copy.deepcopy(record)
    node = rec
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return rec


def fails_naming(name: str, records: list[dict], field: str, tmp: Path) -> None:
    """`check --from` on the records exits 2 with one line naming the field (or saying `field`
    when it is not an identifier), no traceback."""
    src = tmp / "dump.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    res = cli("check", src, "--from", name)
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and (f"'{field}'" if field.isidentifier() else field) in lines[0], (
        res.output + res.stderr
    )
    assert "Traceback" not in res.output + res.stderr


def records(name: str, case: str) -> list[dict]:
    return [json.loads(x) for x in fixture(name, case).read_text().splitlines()]
