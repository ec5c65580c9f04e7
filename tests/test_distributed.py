"""The audit on a local Ray cluster (2 CPUs, started by the test) finds exactly what the local
audit finds, with the same statistics: on the compliant fixture, on every broken fixture, and on
a generated log with injected faults, duplicated ids across files and a reset key with two
initial states, cut into shares of a few row groups and the log checks into partitions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

import faultgroups  # noqa: E402
from adapterhelp import IDENTITY, fixture  # noqa: E402
from click.testing import CliRunner  # noqa: E402

import rollout_audit as ra  # noqa: E402
from rollout_audit.adapters import openai  # noqa: E402
from rollout_audit.adapters.base import read_dump  # noqa: E402
from rollout_audit.cli import main  # noqa: E402
from rollout_audit.contract.config import Config  # noqa: E402
from rollout_audit.reading.batches import shares  # noqa: E402
from rollout_audit.reading.io import discover  # noqa: E402
from rollout_audit.running import distributed  # noqa: E402
from rollout_audit.running.distributed import RayExecutor  # noqa: E402
from rollout_audit.running.engine import memory_discovery, run_audit  # noqa: E402
from rollout_audit.running.runner import Runner  # noqa: E402
from rollout_audit.synth import make_log  # noqa: E402

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


def test_check_on_a_local_cluster_prints_what_it_prints_without_ray():
    """`check --ray PATH` (`--ray` alone, before the path) in a process of its own starts a local
    Ray cluster: Ray's startup lines (its token notice, "Started a local Ray instance", INFO lines)
    reach neither stream; stdout holds what `check PATH` prints without Ray, and stderr nothing.
    (First in this file: no other cluster is up yet.)"""
    path = str(ROOT / "fixtures/broken/first_visit_paid_twice")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local cluster of its own, never a named one
    res = subprocess.run(
        [sys.executable, "-m", "rollout_audit.cli", "check", "--ray", path],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    local = CliRunner().invoke(main, ["check", path])
    assert res.returncode == local.exit_code == 1, res.stderr
    assert res.stderr == ""
    assert res.stdout == local.stdout and res.stdout.startswith("R408 [error]")


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
    assert {"M101", "L202", "M103", "T302", "S002", "E802", "U601"} <= codes
    s002 = local.findings.filter(local.findings["code"] == "S002")
    assert (
        s002.height == pq.read_metadata(faulted / "part-00000.parquet").num_rows
        and s002["message"].str.contains("part-00090.parquet").all()
    )


def test_the_driver_holds_references_per_task_not_per_piece(cluster, faulted):
    """The driver's object references, counted in Ray's reference table of this process at its
    fullest, grow by a few per partition (its tasks) and per share (their two returns), never
    by shares × partitions: the pieces go from the share tasks to the partitions' stores."""

    def peak(rows_per_share: int, parts: int) -> tuple[int, int]:
        ex = RayExecutor(rows_per_share=rows_per_share, partitions=parts)
        run_audit(discover([faulted]), Config(), executor=ex)
        assert ex.peak_refs is not None
        return len(shares(discover([faulted]).of_kind("trajectories"), rows_per_share)), ex.peak_refs

    few, at_2 = peak(64, 2)
    many, at_16 = peak(1, 16)
    _, few_at_16 = peak(64, 16)
    assert many > few >= 4
    assert few_at_16 - at_2 <= 8 * (16 - 2)  # a task per key, per routing and per update partition
    # a share task's two returns and its arguments, with room for references Ray has not yet
    # released when the table is read (the count at its fullest depends on timing); the old
    # all-to-all added 3 + 5 × 16 per share
    assert at_16 - few_at_16 <= 8 * (many - few)
    assert at_16 < many * 16  # the old all-to-all held (3 + 5 × 16) per share, plus 16² for the routing


def test_update_records_in_row_groups_of_several_files(cluster, faulted, tmp_path, monkeypatch):
    """Update records read by tasks (two files of row groups of 5 records, runs of about 8
    records per task), with a file left out between them (a required column missing) and a
    record naming a trajectory not in the log: the Ray audit finds what the local one does."""
    log = tmp_path / "log"
    shutil.copytree(faulted, log)
    one = pq.read_table(log / "updates" / "updates.parquet")
    (log / "updates" / "updates.parquet").unlink()
    rec = one.to_pylist()[0]
    lists = [c for c, v in rec.items() if isinstance(v, list)]
    cut = [round(k * len(rec["trajectory_ids"]) / 24) for k in range(25)]
    recs = [{**rec, "update_step": k, **{c: rec[c][cut[k] : cut[k + 1]] for c in lists}} for k in range(24)]
    recs[20]["trajectory_ids"] = [*recs[20]["trajectory_ids"], "nobody"]
    pq.write_table(pa.Table.from_pylist(recs[:12], schema=one.schema), log / "updates" / "a.parquet", row_group_size=5)
    pq.write_table(one.drop_columns(["trainer_version"]), log / "updates" / "b.parquet")
    pq.write_table(pa.Table.from_pylist(recs[12:], schema=one.schema), log / "updates" / "c.parquet", row_group_size=5)
    assert pq.read_metadata(log / "updates" / "a.parquet").num_row_groups == 3
    monkeypatch.setattr(distributed, "UPDATES_PER_TASK", 8)
    local = run_audit(discover([log]), Config())
    _same(local, run_audit(discover([log]), Config(), executor=RayExecutor(rows_per_share=50, partitions=3, stores=2)))
    codes = set(local.findings["code"])
    assert {"U601", "U605", "S005"} <= codes, codes


def test_check_ray_on_the_compliant_fixture(cluster):
    args = ["check", str(ROOT / "fixtures/compliant"), "--format", "json"]
    local, remote = CliRunner().invoke(main, args), CliRunner().invoke(main, [*args, "--ray"])
    assert remote.exit_code == local.exit_code == 0, remote.output
    assert json.loads(remote.stdout) == json.loads(local.stdout)


def test_selected_checks_and_a_broken_file(cluster):
    path = ROOT / "fixtures/broken/corrupt_file"
    for sel in (None, ["S"]):
        _same(run_audit(discover([path]), select=sel), run_audit(discover([path]), select=sel, ray=True))


@pytest.fixture(scope="module")
def base():
    return make_log(n_tasks=4, group_size=4, n_versions=2, seed=0)


@pytest.mark.parametrize("group", faultgroups.RECORD_GROUPS, ids=faultgroups.group_id)
def test_every_named_fault_audits_alike_on_ray(cluster, base, tmp_path, group):
    """Every named fault but the truncated file (which `test_selected_checks_and_a_broken_file`
    audits), several to a log as tests/faultgroups.py composes them, in three files: each fault
    caught on its own trajectories, and the same findings, statistics and coverage on Ray with
    the log checks cut into three partitions (by key, and the update checks by update record)
    and shares of one row group."""
    trajs, touched = faultgroups.write_group(tmp_path / "log", group, *base, parts=3)
    cfg = faultgroups.config(group)
    local = run_audit(discover([tmp_path / "log"]), cfg)
    assert not faultgroups.problems(group, local.findings, trajs, touched)
    _same(local, run_audit(discover([tmp_path / "log"]), cfg, executor=RayExecutor(rows_per_share=1, partitions=3)))


def test_a_split_episode_trained_in_two_updates_of_two_partitions(cluster):
    """A continuing segment is trained with its episode's reward, which the last segment carries:
    with the two segments named by updates of different partitions, the update checks still
    read it there (else U606 would call the continuing segment's null reward excluded)."""
    table = openai.to_contract(read_dump(fixture("openai", "retokenized")), **dict(kv.split("=") for kv in IDENTITY))
    assert table.column("split_continues").to_pylist() == [True, False] and table.column("reward")[0].as_py() is None
    updates = [
        {
            "update_step": k,
            "trainer_version": 0,
            "trajectory_ids": [t],
            "reduction": "trajectory",
            "loss_denominator": 1.0,
        }
        for k, t in enumerate(table.column("trajectory_id").to_pylist())
    ]
    local = ra.audit(table, updates)
    _same(local, run_audit(memory_discovery(table, updates), executor=RayExecutor(partitions=2)))
    assert {"U601", "U606", "T303"} <= set(local.summary["checks_run"]) and "U606" not in local.codes()


def test_only_checks_that_need_the_whole_log_stay_on_the_driver():
    """Every default log check is partitioned but S005 (it reads no summary), the replay checks (they
    sample the whole log, and only when replay is on) and U610 (an update's batch spans partitions)."""
    kept = sorted(r.code for r in Runner(Config()).log_rules if not r.partition)
    assert kept == ["L205", "L206", "L207", "L209", "L211", "S005", "U610"]
