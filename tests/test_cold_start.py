"""A fresh process imports only what its request needs: `import rollout_audit`, `--version`, `--help`,
`explain CODE` and a plain `check` (text output) never import pandas, pandera, rich, torch, ray,
transformers, a trainer framework or the recorder proxy's asyncio. Asserted on the modules a fresh
interpreter holds after the request, never on a timing.

pandas is the one pyarrow would bring in by itself: it imports it (when it is installed) the first
time it converts Arrow to numpy or a Python value to Arrow (`Array.to_numpy`, `pa.scalar`,
`pa.array`, `pc.fill_null(a, 0)`), so the audit converts through `rollout_audit.reading.arrays`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_audit.dev.house import HEAVY

ROOT = Path(__file__).resolve().parents[1]


_PROBE = """
import contextlib, io, json, sys
args = json.loads(sys.argv[1])
out, code = io.StringIO(), 0
if args is None:
    import rollout_audit
else:
    from rollout_audit.cli.main import main
    with contextlib.redirect_stdout(out):
        try:
            main(args)
        except SystemExit as e:
            code = e.code
print(json.dumps({"modules": sorted({m.split(".")[0] for m in sys.modules}), "out": out.getvalue(), "code": code}))
"""


def _fresh(args: list[str] | None) -> tuple[set[str], str]:
    """The top-level modules a fresh interpreter holds after running `args` (None: `import rollout_audit`)
    to exit 0, and what it printed."""
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["code"] in (0, None), got
    return set(got["modules"]), got["out"]


@pytest.mark.parametrize("args", [None, ["--version"], ["explain", "U602"]], ids=["import", "version", "explain"])
def test_import_version_and_explain_load_no_heavy_module(args):
    modules, out = _fresh(args)
    assert args is None or out.strip()  # the command answered, so the set below is the whole path's
    assert not modules & set(HEAVY)


@pytest.mark.slow  # a fresh interpreter each; import and a plain check stay in the fast tier
def test_help_loads_no_heavy_module_beyond_the_command_it_lists():
    modules, out = _fresh(["--help"])
    assert "capture" in out  # listing the recorder proxy imports it, and with it asyncio
    assert not modules & (set(HEAVY) - {"asyncio"})


def test_plain_check_loads_no_heavy_module():
    modules, out = _fresh(["check", "fixtures/compliant"])
    assert "ok: 0 errors" in out  # the audit ran to its verdict, so the set below is the whole path's
    assert {"polars", "pyarrow", "numpy"} <= modules
    assert not modules & set(HEAVY)


@pytest.mark.slow  # a fresh interpreter each; import and a plain check stay in the fast tier
def test_the_lazy_command_is_still_listed_run_and_suggested():
    from click.testing import CliRunner

    from rollout_audit.cli.main import main

    runner = CliRunner()
    assert "capture" in runner.invoke(main, ["--help"]).output
    assert "--upstream" in runner.invoke(main, ["capture", "--help"]).output
    typo = runner.invoke(main, ["captur"])
    assert typo.exit_code == 2 and "capture" in typo.output
