"""The audit on a local Ray cluster (2 CPUs, started by the test) finds exactly what the local
audit finds: on the compliant fixture and on a generated log with injected faults, duplicated
ids across files and a reset key with two initial states, cut into shares of a few row groups."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

from click.testing import CliRunner  # noqa: E402

from rollout_audit.cli import main  # noqa: E402
from rollout_audit.contract.config import Config  # noqa: E402
from rollout_audit.reading.io import discover  # noqa: E402
from rollout_audit.running.distributed import RayExecutor  # noqa: E402
from rollout_audit.running.engine import run_audit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `benchmarks` lives at the repo root
from benchmarks.generate import generate  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    """A generated log with faults in 5% of trajectories, plus a shard written twice (S002
    across files) and ten episodes whose reset key gives another initial state (E802)."""
    out = tmp_path_factory.mktemp("ray") / "log"
    generate(150_000, out, fault_share=0.05, row_group=32, file_rows=64)
    shutil.copy(out / "part-00000.parquet", out / "part-00090.parquet")
    t = pq.read_table(out / "part-00001.parquet").slice(0, 10)
    t = t.set_column(0, "trajectory_id", pa.array([f"moved-{i}" for i in range(10)]))
    i = t.schema.get_field_index("initial_state_checksum")
    pq.write_table(t.set_column(i, "initial_state_checksum", pa.array(["f" * 64] * 10)), out / "part-00091.parquet")
    return out


def _same(local, remote) -> None:
    assert sorted(remote.findings.to_dicts(), key=json.dumps) == sorted(local.findings.to_dicts(), key=json.dumps)
    assert remote.summary == local.summary
    assert (remote.not_run, remote.partial, remote.crashes) == (local.not_run, local.partial, local.crashes)


def test_ray_audit_of_a_faulted_log_is_the_local_audit(cluster, faulted):
    disc = discover([faulted])
    local = run_audit(disc, Config())
    remote = run_audit(disc, Config(), executor=RayExecutor(rows_per_share=50, partitions=3))  # shares of 2 row groups
    _same(local, remote)
    codes = set(local.findings["code"])
    assert {"M101", "L202", "M103", "T302", "S002", "E802"} <= codes
    s002 = local.findings.filter(local.findings["code"] == "S002")
    assert (
        s002.height == pq.read_metadata(faulted / "part-00000.parquet").num_rows
        and s002["message"].str.contains("part-00090.parquet").all()
    )


def test_check_ray_on_the_compliant_fixture(cluster):
    args = ["check", str(ROOT / "fixtures/compliant"), "--format", "json"]
    local, remote = CliRunner().invoke(main, args), CliRunner().invoke(main, [*args, "--ray"])
    assert remote.exit_code == local.exit_code == 0, remote.output
    assert json.loads(remote.stdout) == json.loads(local.stdout)


def test_selected_checks_and_a_broken_file(cluster):
    path = ROOT / "fixtures/broken/corrupt_file"
    for sel in (None, ["S"]):
        _same(run_audit(discover([path]), select=sel), run_audit(discover([path]), select=sel, ray=True))
