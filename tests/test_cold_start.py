"""A fresh process imports only what its request needs: `import rollout_audit`, `--help`, `explain CODE`
and a plain `check` (text output) never import pandera, rich, torch, ray, transformers, a trainer
framework or the recorder proxy's asyncio. Asserted on the modules a fresh interpreter holds after
the request, never on a timing.

pandas is left out of the `check` assertion: pyarrow imports it itself (when it is installed) the
first time it converts an Arrow array to numpy or a Python value to Arrow (`Array.to_numpy`,
`pa.scalar`, `pa.array`), which every audit does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ["pandera", "rich", "torch", "ray", "transformers", "verl", "trl", "verifiers", "openai", "vllm", "asyncio"]

_PROBE = """
import contextlib, io, json, sys
args = json.loads(sys.argv[1])
out = io.StringIO()
if args is None:
    import rollout_audit
else:
    from rollout_audit.cli.main import main
    with contextlib.redirect_stdout(out):
        try:
            main(args)
        except SystemExit as e:
            code = e.code
print(json.dumps({"modules": sorted({m.split(".")[0] for m in sys.modules}), "out": out.getvalue()}))
"""


def _fresh(args: list[str] | None) -> tuple[set[str], str]:
    """The top-level modules a fresh interpreter holds after running `args` (None: `import rollout_audit`)."""
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.splitlines()[-1])
    return set(got["modules"]), got["out"]


@pytest.mark.parametrize("args", [None, ["explain", "U602"]], ids=["import", "explain"])
def test_import_and_explain_load_no_heavy_module(args):
    modules, _ = _fresh(args)
    assert not modules & {*HEAVY, "pandas"}


@pytest.mark.slow  # a fresh interpreter each; import and a plain check stay in the fast tier
def test_help_loads_no_heavy_module_beyond_the_command_it_lists():
    modules, out = _fresh(["--help"])
    assert "capture" in out  # listing the recorder proxy imports it, and with it asyncio
    assert not modules & ({*HEAVY, "pandas"} - {"asyncio"})


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
