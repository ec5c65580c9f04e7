"""Shared fixtures: compliant synthetic logs written with the library's own writer."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

# rollout_audit's writer and synth are imported where they are used, never here: the controller
# process of an xdist run loads this file and runs no test, so it imports neither polars nor the checks


@pytest.fixture(scope="session")
def clean_records():
    from rollout_audit.synth import make_log

    return make_log(n_tasks=4, group_size=4, n_versions=2, seed=0)


@pytest.fixture
def records(clean_records):
    """A fresh deep copy of a compliant (trajectories, updates) pair, to mutate."""
    return copy.deepcopy(clean_records)


def write_log(root, trajs, updates=None, parts: int = 1, validate: bool = False):
    """Write records under `root` (optionally split in hive partitions); returns root."""
    from rollout_audit import RolloutWriter

    root.mkdir(parents=True, exist_ok=True)
    size = -(-len(trajs) // parts)
    for i in range(parts):
        chunk = trajs[i * size : (i + 1) * size]
        if not chunk:
            continue
        sub = root / f"step={i}" if parts > 1 else root
        with RolloutWriter(sub / f"part-{i:04d}.parquet", validate=validate) as w:
            w.write(chunk)
    if updates:
        with RolloutWriter(root / "updates" / "updates.parquet", kind="updates", validate=validate) as w:
            w.write(updates)
    return root


# the headless Chromium the report's browser tests drive (the distribution's package), and why they
# skip without it
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NO_CHROMIUM = "headless Chromium is not installed (apt-get install chromium; .ci/run does)"


def generate_on_a_copy(tmp_path, script: str, module: str) -> subprocess.CompletedProcess:
    """`script` run in a fresh Python on a copy of the checkout's derived files (README, docs/,
    fixtures/, the checks' catalogue) under tmp_path/repo, with the module text `module` beside it: `python script COPY
    MODULE`, so that what the module registers (a check, a fault) never reaches this process or
    the committed files."""
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("README.md", "docs", "fixtures", "rollout_audit/running/catalogue.json"):
        src = ROOT / name
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, copy / name)
    (tmp_path / "module.py").write_text(textwrap.dedent(module))
    (tmp_path / "run.py").write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, str(tmp_path / "run.py"), str(copy), str(tmp_path / "module.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


# The suite's slow modules: real trainers (importing torch, trl or verl costs each worker seconds at
# collection), Ray, browsers, servers, training runs, campaigns and whole-catalogue sweeps. `python -m pytest -m "not slow"` is the fast tier for the inner loop
# (its measured cost is in the README); the README's command and CI run everything.
SLOW_MODULES = {
    "test_adapters_verifiers",
    "test_adapters_verl",
    "test_benchmarks_smoke",
    "test_campaign_round5",
    "test_campaign_round6",
    "test_capture_load",
    "test_capture_paths",
    "test_demo",
    "test_distributed",
    "test_executors",
    "test_faults",
    "test_fixtures",
    "test_framework_drift",
    "test_framework_pages",
    "test_frameworks_build",
    "test_frameworks_evidence",
    "test_frameworks_round4",
    "test_fuzz",
    "test_generated",
    "test_graduation",
    "test_hostile",
    "test_hostile_round4",
    "test_integration_rllm_backend",
    "test_integration_rllm_workflow",
    "test_integration_slime",
    "test_integration_trl",
    "test_integration_trl_record",
    "test_integration_trl_rloo",
    "test_integration_trl_server",
    "test_integration_verl_loop",
    "test_integration_verl_v1",
    "test_native",
    "test_new_check",
    "test_properties",
    "test_readme",
    "test_reference_agent",
    "test_replay_agent",
    "test_replay_hf",
    "test_report_browser",
    "test_report_html",
    "test_show",
    "test_storage",
    "test_streaming",
    "test_trl_records",
    "test_trust",
    "test_user_paths",
    "test_workflow",
}


# The native core (rollout_audit/frames/_native.c) in every process of the session: the installed
# one, else compiled once by the controller with the build hook's own command (a plain clone run
# with PYTHONPATH has none) and loaded by each worker from the path below. In-process audits then run
# the C code; a test that starts its own Python process gets what the package would import there.
NATIVE_ENV = "ROLLOUT_AUDIT_SUITE_NATIVE"
ROOT = Path(__file__).resolve().parent.parent
NATIVE_STATUS: list[str] = []


def compile_native(out_dir: Path) -> Path:
    """The extension compiled by hatch_build.compile_native into `out_dir` (RuntimeError without a compiler)."""
    spec = importlib.util.spec_from_file_location("hatch_build", ROOT / "hatch_build.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook.compile_native(ROOT, out_dir)


def load_native(path: Path):
    """The compiled extension at `path`, as the module `rollout_audit.frames._native`."""
    spec = importlib.util.spec_from_file_location("rollout_audit.frames._native", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _native_core(config) -> str:
    from rollout_audit.frames import native

    if os.environ.get("ROLLOUT_AUDIT_NO_NATIVE") == "1":
        return "pure-Python path (ROLLOUT_AUDIT_NO_NATIVE=1)"
    if native.ACTIVE is not None:
        return f"native core as installed ({Path(native.ACTIVE.__file__).name})"
    path = os.environ.get(NATIVE_ENV)
    if not path:  # the controller (or a run without workers) compiles it; workers inherit the path
        out = Path(tempfile.mkdtemp(prefix="rollout-audit-suite-native-"))
        config.add_cleanup(lambda: shutil.rmtree(out, ignore_errors=True))
        try:
            path = str(compile_native(out))
        except RuntimeError as exc:
            return f"pure-Python path: the native core is not installed and could not be built ({exc})"
        os.environ[NATIVE_ENV] = path
    native.ACTIVE = sys.modules["rollout_audit.frames._native"] = load_native(Path(path))
    return "native core compiled for this session (not installed: pip install -e . builds it)"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: part of the full suite only (deselect with -m 'not slow')")
    if _slow_deselected(config):
        # hypothesis' plugin imports hypothesis at the end of every run (a second of CPU) even when
        # no test used it; the property and fuzz tests that do are all slow
        config.pluginmanager.set_blocked("hypothesispytest")
    NATIVE_STATUS[:] = [_native_core(config)]


def pytest_report_header(config):
    return f"rollout-audit: {NATIVE_STATUS[0]}" if NATIVE_STATUS else None


def _slow_deselected(config) -> bool:
    """Whether `-m` deselects every test marked slow, whatever its other marks: then the slow
    modules are not even imported (collecting them imports torch, trl, Ray and the rest)."""
    expr = config.getoption("markexpr", "")
    if not expr:
        return False
    from _pytest.mark.expression import Expression

    try:
        compiled = Expression.compile(expr)
    except SyntaxError:  # pytest reports a bad expression itself
        return False
    others = sorted(set(re.findall(r"[A-Za-z_][\w.]*", expr)) - {"slow", "and", "or", "not"})
    if len(others) > 8:
        return False
    for bits in itertools.product((False, True), repeat=len(others)):
        marks = frozenset({"slow", *(m for m, on in zip(others, bits) if on)})
        if compiled.evaluate(marks.__contains__):
            return False
    return True


def pytest_ignore_collect(collection_path, config):
    if collection_path.suffix == ".py" and collection_path.stem in SLOW_MODULES and _slow_deselected(config):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
