"""The streaming engine (small batches, several files, read-ahead thread) finds exactly what the
in-memory path (the whole log in one batch) finds, on every named fault of the synthetic log;
S001's fast domain pass never hides a finding pandera would make."""

from __future__ import annotations

import math

import faultgroups
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rollout_audit.checks import structure
from rollout_audit.contract.config import Config
from rollout_audit.faults import FAULTS, write_records
from rollout_audit.reading.io import discover
from rollout_audit.running.engine import memory_discovery, run_audit
from rollout_audit.synth import make_log


@pytest.fixture(scope="module")
def base():
    return make_log(n_tasks=4, group_size=4, n_versions=2, seed=0)


def _norm(rep) -> pl.DataFrame:
    """Findings without file names (in memory, every row comes from `<memory>`; S002 lists
    the files a duplicate id appears in)."""
    f = rep.findings.drop("file").with_columns(pl.col("message").str.replace(r" \(in [^)]*\)$", ""))
    return f.sort(f.columns, nulls_last=True)


def _three_ways(root, cfg: Config | None = None) -> list[pl.DataFrame]:
    disc = discover([root])
    files = disc.of_kind("trajectories")
    traj = pa.concat_tables([pq.read_table(f.path) for f in files], promote_options="default")
    ups = [pq.read_table(f.path) for f in disc.of_kind("updates")]
    reps = [
        run_audit(disc, cfg),  # row-group batches, read ahead on a thread
        run_audit(disc, cfg, batch_rows=3, workers=2),  # small batches, two checked at once
        run_audit(memory_discovery(traj, ups[0] if ups else None), cfg, batch_rows=10**9),
    ]
    return [_norm(r) for r in reps]


def _shows_every_fault(group: tuple[str, ...], findings: pl.DataFrame) -> None:
    """The group's log raises each of its faults' codes (no fault of the group hides another)."""
    missed = {n: sorted(FAULTS[n].codes - set(findings["code"])) for n in group}
    assert not any(missed.values()), missed


@pytest.mark.parametrize("group", faultgroups.RECORD_GROUPS, ids=faultgroups.group_id)
def test_streaming_equals_in_memory(group, base, tmp_path):
    """Every named fault but the truncated file, several to a log (tests/faultgroups.py), split in
    three partitions: each fault's codes on the trajectories it touched and every finding explained
    by a fault expecting it (tests/test_faults.py covers the group with the truncated file), and
    the same findings however the log is batched."""
    trajs, touched = faultgroups.write_group(tmp_path / "log", group, *base, parts=3)
    ref, small, mem = _three_ways(tmp_path / "log", faultgroups.config(group))  # `small` also runs two batches at once
    assert not faultgroups.problems(group, ref, trajs, touched)
    assert ref.equals(small), (ref, small)
    # file-level findings (schema problems, no trajectory) come once per file: three files
    # on disk, one table in memory
    per_file = lambda f: pl.concat(
        [
            f.filter(pl.col("trajectory_id").is_not_null()),
            f.filter(pl.col("trajectory_id").is_null()).unique(maintain_order=True),
        ]
    )
    assert per_file(ref).equals(per_file(mem)), (ref, mem)


def test_fast_domain_pass_hides_nothing(base, tmp_path, monkeypatch):
    trajs, ups = base
    trajs = [dict(t, turns=[dict(x) for x in t["turns"]]) for t in trajs]
    trajs[0]["gamma"] = 1.5
    trajs[1]["wall_clock_s"] = -2.0
    trajs[2]["discounted_return"] = math.nan
    trajs[3]["turns"][1]["top_p"] = 0.0
    trajs[4]["turns"][0]["value"] = math.inf
    trajs[5]["turns"][2]["policy_version"] = -1
    write_records(tmp_path / "log", trajs, ups, parts=2)
    fast = _three_ways(tmp_path / "log")
    monkeypatch.setattr(structure, "_suspect", lambda df, domain: True)  # pandera on every frame
    slow = _three_ways(tmp_path / "log")
    s001 = fast[0].filter(pl.col("code") == "S001")
    assert s001.height >= 6, s001
    for a, b in zip(fast, slow):
        assert a.equals(b)


@pytest.mark.parametrize("group", faultgroups.RECORD_GROUPS, ids=faultgroups.group_id)
def test_one_file_per_trajectory_finds_what_one_file_finds(group, base, tmp_path):
    """Small files share batches (the engine merges them): the findings are those of the same
    rows in one file, and each finding names the file that holds its trajectory. Every named
    fault but the truncated file, with duplicate ids across files (S002) and the prefix hashes of
    M105/M107 over merged batches among them."""
    trajs, _ = faultgroups.write_group(tmp_path / "one", group, *base)
    faultgroups.write_group(tmp_path / "many", group, *base, parts=len(trajs))
    cfg = faultgroups.config(group)
    one = run_audit(discover([tmp_path / "one"]), cfg)
    many = run_audit(discover([tmp_path / "many"]), cfg)
    _shows_every_fault(group, one.findings)
    per_file = lambda r: _norm(r).unique(maintain_order=True)  # file-level findings: once per file
    assert per_file(one).equals(per_file(many)), (per_file(one), per_file(many))
    holder = {
        i: str(p)
        for p in (tmp_path / "many" / "trajectories").rglob("*.parquet")
        for i in pq.read_table(p)["trajectory_id"].to_pylist()
    }
    in_traj_file = (pl.col("trajectory_id").is_not_null()) & pl.col("file").str.contains("trajectories")
    located = many.findings.filter(in_traj_file)
    assert located.height == one.findings.filter(in_traj_file).height
    for tid, file in located.select("trajectory_id", "file").iter_rows():
        assert file == holder[tid], (tid, file)


def test_batches_are_bounded_by_tokens_and_find_the_same(base, tmp_path, monkeypatch):
    """Long episodes in row groups sized for short ones: batches are cut by tokens too (memory
    follows tokens), and the findings do not depend on where the cuts fall."""
    from rollout_audit.reading import batches as pipeline
    from rollout_audit.running.runner import Runner, plan

    for group in faultgroups.RECORD_GROUPS[:3]:
        root = tmp_path / faultgroups.group_id(group)
        faultgroups.write_group(root, group, *base, parts=2)
        cfg = faultgroups.config(group)
        ref = _norm(run_audit(discover([root]), cfg))
        monkeypatch.setattr(pipeline, "BATCH_TOKENS", 150)
        files = discover([root]).of_kind("trajectories")
        parts = list(pipeline.batches(files, plan(Runner(cfg)).columns, 2048, [], cfg))
        sizes = [
            (p.table.num_rows, int(pc.sum(pc.list_value_length(p.table.column("token_source"))).as_py() or 0))
            for p in parts
        ]
        assert len(parts) > len(files) and all(k <= 150 or n == 1 for n, k in sizes), sizes
        assert ref.equals(_norm(run_audit(discover([root]), cfg))), group
        monkeypatch.setattr(pipeline, "BATCH_TOKENS", 1 << 21)


def test_row_groups_read_a_column_at_a_time_find_the_same(base, tmp_path, monkeypatch):
    """A large local row group is decoded one column at a time: the same table as a whole read
    (every column, the nested turns among them), and the same findings on named faults."""
    from rollout_audit.reading import io

    for group in faultgroups.RECORD_GROUPS[:3]:
        root = tmp_path / faultgroups.group_id(group)
        faultgroups.write_group(root, group, *base, parts=2)
        cfg = faultgroups.config(group)
        monkeypatch.setattr(io, "COLUMNWISE_BYTES", 1 << 40)  # every row group whole
        whole = _norm(run_audit(discover([root]), cfg))
        files = discover([root]).of_kind("trajectories")
        tables = [t for f in files for _, t in io.iter_batches(f, f.schema.names, 1 << 20)]
        monkeypatch.setattr(io, "COLUMNWISE_BYTES", 0)  # every row group a column at a time
        by_column = [t for f in files for _, t in io.iter_batches(f, f.schema.names, 1 << 20)]
        assert len(tables) == len(by_column) >= 2
        for a, b in zip(tables, by_column):
            assert a.schema.remove_metadata().equals(b.schema) and a.equals(
                b.replace_schema_metadata(a.schema.metadata)
            )
        assert whole.height and whole.equals(_norm(run_audit(discover([root]), cfg))), group


def test_three_hundred_tiny_files_find_what_one_file_finds(tmp_path):
    """One trajectory per file, through the CLI: small files are read as runs and sanitized
    together, and the findings are those of the same rows in one file, each naming the file
    that holds its trajectory."""
    import json
    import subprocess
    import sys

    from rollout_audit import RolloutWriter

    trajs, ups = make_log(n_tasks=75, group_size=4, n_versions=1, seed=5)
    trajs = [dict(t) for t in trajs]
    trajs[3]["num_trainable_tokens"] += 3  # M103
    trajs[150]["gamma"] = 1.5  # S001
    for name in ("one", "many"):
        with RolloutWriter(tmp_path / name / "updates" / "updates.parquet", kind="updates") as w:
            w.write(ups)
    with RolloutWriter(tmp_path / "one" / "trajectories" / "part-00000.parquet", validate=False) as w:
        w.write(trajs)
    table = pq.read_table(tmp_path / "one" / "trajectories" / "part-00000.parquet")
    (tmp_path / "many" / "trajectories").mkdir()
    for i in range(table.num_rows):  # the writer's schema and metadata, one row per file
        pq.write_table(table.slice(i, 1), tmp_path / "many" / "trajectories" / f"part-{i:05d}.parquet")

    def check(name: str) -> list[dict]:
        cmd = [sys.executable, "-m", "rollout_audit.cli", "check", str(tmp_path / name), "--format", "json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 1, r.stderr[-2000:]
        return json.loads(r.stdout)["findings"]

    from rollout_audit.reading.batches import batches

    files = discover([tmp_path / "many"]).of_kind("trajectories")
    (run,) = batches(files, ["trajectory_id", "token_ids"], 2048, [], Config())
    assert run.sources is not None and len(run.sources) == 300  # one run, sanitized once
    one, many = check("one"), check("many")
    key = lambda f: (
        f["code"],
        f["trajectory_id"] or "",
        f["turn"] or -1,
        f["position"] or -1,
        f["message"].split(" (in ")[0],
    )
    assert sorted(map(key, one)) == sorted(map(key, many))
    assert {"M103", "S001"} <= {f["code"] for f in one}
    holder = {t: f"part-{i:05d}.parquet" for i, t in enumerate(table["trajectory_id"].to_pylist())}
    for f in many:
        if f["trajectory_id"] and "trajectories" in f["file"]:
            assert f["file"].endswith(holder[f["trajectory_id"]]), f
