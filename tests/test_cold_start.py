"""A fresh process imports only what its request needs: `import rollout_audit`, `--version`, `--help`,
`explain CODE` and a plain `check` (text output) never import pandas, pandera, rich, torch, ray,
transformers, a trainer framework or the recorder proxy's asyncio. Asserted on the modules a fresh
interpreter holds after the request, never on a timing.

pandas is the one pyarrow would bring in by itself: it imports it (when it is installed) the first
time it converts Arrow to numpy or a Python value to Arrow (`Array.to_numpy`, `pa.scalar`,
`pa.array`, `pc.fill_null(a, 0)`), so the audit converts through `rollout_audit.reading.arrays`.

A plain `check` of a log that comes with no configuration (the defaults) imports no pydantic either
(the configuration's pydantic model is built when a value is validated), no HTTP client (a replay
over HTTP and JUnit's XML escaping bring it) and no statistics (a replay's bias interval)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_audit.dev.house import HEAVY

ROOT = Path(__file__).resolve().parents[1]
# What a plain `check` on the defaults leaves out beyond HEAVY (top-level modules)
NOT_ON_THE_DEFAULTS = {"pydantic", "pydantic_core", "annotated_types", "http", "xml", "statistics"}


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


def test_plain_check_on_the_defaults_loads_no_pydantic_nor_http(tmp_path):
    for part in ("trajectories", "updates"):  # the compliant log without the pyproject.toml it comes with
        shutil.copytree(ROOT / "fixtures" / "compliant" / part, tmp_path / part)
    modules, out = _fresh(["check", str(tmp_path)])
    assert "configuration: defaults" in out and "ok: 0 errors" in out
    assert not modules & (set(HEAVY) | NOT_ON_THE_DEFAULTS)


_CONFIG_PROBE = """
import json, pickle, sys
from rollout_audit.contract.config import Config
cfg = Config().model_copy(update={"preview": True}).with_source("defaults")
before = sorted(m.split(".")[0] for m in sys.modules)
try:
    cfg.loop_length = 1
    refused = False
except ValueError:
    refused = True
cfg.atol = 0
print(json.dumps({"before": before, "refused": refused, "atol": repr(cfg.atol), "set": sorted(cfg.model_fields_set),
                  "same": pickle.loads(pickle.dumps(cfg)) == cfg, "source": cfg.source,
                  "after": sorted(m.split(".")[0] for m in sys.modules)}))
"""


def test_the_configuration_validates_through_pydantic_once_a_value_is_given():
    res = subprocess.run([sys.executable, "-c", _CONFIG_PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    got = json.loads(res.stdout)
    assert "pydantic" not in got["before"] and "pydantic" in got["after"]  # the defaults and a copy need none
    assert got["refused"] and got["atol"] == "0.0"  # an assignment is validated, TOML's integer made a float
    assert got["set"] == ["atol", "preview"] and got["same"] and got["source"] == "defaults"


@pytest.mark.slow  # a fresh interpreter each; import and a plain check stay in the fast tier
def test_the_lazy_command_is_still_listed_run_and_suggested():
    from click.testing import CliRunner

    from rollout_audit.cli.main import main

    runner = CliRunner()
    assert "capture" in runner.invoke(main, ["--help"]).output
    assert "--upstream" in runner.invoke(main, ["capture", "--help"]).output
    typo = runner.invoke(main, ["captur"])
    assert typo.exit_code == 2 and "capture" in typo.output
