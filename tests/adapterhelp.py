"""What the adapter tests share: the CLI as a user runs it (`check --from`, `convert`), the JSON report,
the not-run list a framework's doc page predicts, and a record with a required field removed."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from rollout_audit.cli import main

ROOT = Path(__file__).resolve().parents[1]
IDENTITY = ["environment_id=doors", "environment_version=v1", "verifier_version=v1", "reset_seed=0"]


def fixture(name: str, case: str) -> Path:
    return ROOT / "fixtures" / "frameworks" / name / f"{case}.jsonl"


def cli(*args: Any) -> Any:
    """The CLI's result (exit_code, stdout in .output, .stderr)."""
    return CliRunner().invoke(main, [str(a) for a in args])


def opts(context: list[str]) -> list[str]:
    return [x for kv in context for x in ("--context", kv)]


def report(paths: list[Any], name: str | None, context: list[str]) -> dict:
    """The JSON report of `check` (converting with --from NAME when given)."""
    frm = ["--from", name, *opts(context)] if name else []
    res = cli("check", *paths, *frm, "--format", "json")
    assert res.exit_code in (0, 1), res.output + res.stderr
    return json.loads(res.output)


def findings(rep: dict) -> list[tuple[str, str | None, int | None]]:
    """(code, trajectory, turn) of each finding, sorted."""
    return sorted((f["code"], f["trajectory_id"], f["turn"]) for f in rep["findings"])


def documented_not_run(name: str) -> set[str]:
    """The codes the framework's doc page lists under "Checks not run"."""
    text = (ROOT / "docs" / "frameworks" / f"{name}.md").read_text()
    section = text.split("## Checks not run", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- `([A-Z]\d{3})`", section, flags=re.M))


def same_after_convert(name: str, case: str, context: list[str], tmp: Path) -> None:
    """`convert` then `check` gives the findings and not-run list of `check --from`."""
    out = tmp / "log"
    res = cli("convert", "--from", name, fixture(name, case), out, *opts(context))
    assert res.exit_code == 0, res.output + res.stderr
    direct, converted = report([fixture(name, case)], name, context), report([out], None, [])
    assert findings(direct) == findings(converted)
    assert direct["not_run"] == converted["not_run"]


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
