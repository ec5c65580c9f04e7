"""Shared fixtures: compliant synthetic logs written with the library's own writer."""

from __future__ import annotations

import copy

import pytest

from rollout_audit import RolloutWriter
from rollout_audit.synth import make_log


@pytest.fixture(scope="session")
def clean_records():
    return make_log(n_tasks=4, group_size=4, n_versions=2, seed=0)


@pytest.fixture
def records(clean_records):
    """A fresh deep copy of a compliant (trajectories, updates) pair, to mutate."""
    return copy.deepcopy(clean_records)


def write_log(root, trajs, updates=None, parts: int = 1, validate: bool = False):
    """Write records under `root` (optionally split in hive partitions); returns root."""
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


# The suite's slow modules: real trainers, Ray, browsers, servers, training runs, campaigns and
# whole-catalogue sweeps. `python -m pytest -m "not slow"` is the fast tier for the inner loop
# (under a minute on 2 cores); the README's command and CI run everything.
SLOW_MODULES = {
    "test_adapters_verifiers",
    "test_adapters_verl",
    "test_benchmarks_smoke",
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
    "test_hostile",
    "test_hostile_round4",
    "test_integration_trl",
    "test_native",
    "test_new_check",
    "test_properties",
    "test_readme",
    "test_reference_agent",
    "test_replay_agent",
    "test_replay_hf",
    "test_report_browser",
    "test_report_html",
    "test_session",
    "test_show",
    "test_storage",
    "test_streaming",
    "test_trl_records",
    "test_trust",
    "test_user_paths",
    "test_workflow",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: part of the full suite only (deselect with -m 'not slow')")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
