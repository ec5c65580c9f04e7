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
