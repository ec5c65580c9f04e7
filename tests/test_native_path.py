"""The fast tier runs the native core: the session loads it (tests/conftest.py: as installed, or
compiled for the session when a C compiler is there) and a fault log of each of its passes audits
alike with and without it. tests/test_native.py (full suite) holds the core to the pure-Python path
on generated batches and on every named fault."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sysconfig
from pathlib import Path

import faultgroups
import pytest

from rollout_audit.faults import FAULTS
from rollout_audit.frames import native
from rollout_audit.reading.io import discover
from rollout_audit.running.engine import run_audit
from rollout_audit.synth import make_log

# one fault log per pass of the core: the context digests and token counts (M106/M107), the
# reward-to-go (R405/R406), the reward placement and KL terms (R411/R413), the routes (P505)
PASSES = ("M107", "R406", "R411", "P505")
GROUPS = [next(g for g in faultgroups.GROUPS if any(code in FAULTS[n].codes for n in g)) for code in PASSES]


def _compiler() -> str | None:
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    return shutil.which(cc[0])


def test_the_session_runs_the_compiled_core() -> None:
    if os.environ.get("ROLLOUT_AUDIT_NO_NATIVE") == "1":
        pytest.skip("ROLLOUT_AUDIT_NO_NATIVE=1 asks for the pure-Python path")
    if native.ACTIVE is None and _compiler() is None:
        pytest.skip("no C compiler: the native core is neither installed nor buildable here")
    assert native.ACTIVE is not None and Path(native.ACTIVE.__file__).is_file()
    assert native.ACTIVE.__name__ == "rollout_audit.frames._native"


def _findings(result) -> tuple:
    return sorted(result.findings.to_dicts(), key=json.dumps), result.summary, result.not_run


@pytest.mark.parametrize("group", GROUPS, ids=faultgroups.group_id)
def test_a_fault_log_audits_alike_with_and_without_the_core(tmp_path, monkeypatch, group) -> None:
    if native.ACTIVE is None:
        pytest.skip("the native core is not loaded in this session (see the report header)")
    faultgroups.write_group(tmp_path / "log", group, *make_log(n_tasks=4, group_size=4, n_versions=2, seed=0))
    cfg = faultgroups.config(group)
    with_core = run_audit(discover([tmp_path / "log"]), cfg, batch_rows=5)
    assert with_core.findings.height, "the fault log has findings for the core to compute"
    monkeypatch.setattr(native, "ACTIVE", None)
    assert _findings(run_audit(discover([tmp_path / "log"]), cfg, batch_rows=5)) == _findings(with_core)
