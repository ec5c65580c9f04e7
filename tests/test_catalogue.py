"""`explain` reads the catalogue's text (rollout_audit/running/catalogue.json), not the check modules:
a fresh process that explains every code and lists every family imports no check, no polars, numpy
or pyarrow, and prints what the registered rules themselves give (that the file is what the
generate command writes is tests/test_generated.py's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import rollout_audit.checks  # noqa: F401  (registers every rule in this process: explain describes them live)
from rollout_audit.cli.main import main
from rollout_audit.contract.registry import FAMILIES, registered

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import json, sys
from click.testing import CliRunner
from rollout_audit.cli.main import main
runs = [CliRunner().invoke(main, args) for args in json.loads(sys.argv[1])]
print(json.dumps({"out": [r.output for r in runs], "codes": [r.exit_code for r in runs], "modules": sorted(sys.modules)}))
"""


def _requests() -> list[list[str]]:
    return [["explain", "--list"], *(["explain", f] for f in FAMILIES), *(["explain", c] for c in registered())]


def test_explain_in_a_fresh_process_imports_no_check_and_prints_what_the_rules_give():
    requests = _requests()
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(requests)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.splitlines()[-1])
    assert set(got["codes"]) == {0}, got["out"]
    modules = set(got["modules"])
    assert not {m for m in modules if m.startswith("rollout_audit.checks")}
    assert not {m.split(".")[0] for m in modules} & {"polars", "numpy", "pyarrow", "pydantic"}
    live = [CliRunner().invoke(main, args).output for args in requests]
    assert got["out"] == live
    assert len(got["out"]) == 1 + len(FAMILIES) + len(registered()) and all(got["out"])


def test_an_unknown_code_is_refused_from_the_catalogue_too():
    res = subprocess.run(
        [sys.executable, "-m", "rollout_audit.cli", "explain", "Q123"], capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().endswith("unknown check code 'Q123'; see `rollout-audit explain --list`")
