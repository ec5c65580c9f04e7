"""The streaming engine (small batches, several files, read-ahead thread) finds exactly what the
in-memory path (the whole log in one batch) finds, on every named fault of the synthetic log;
S001's fast domain pass never hides a finding pandera would make."""

from __future__ import annotations

import math

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_audit.checks import structure
from rollout_audit.config import Config
from rollout_audit.engine import memory_discovery, run_audit
from rollout_audit.faults import FAULTS, apply, write_records
from rollout_audit.io import discover
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


@pytest.mark.parametrize("name", sorted(n for n, f in FAULTS.items() if not f.file_level))
def test_streaming_equals_in_memory(name, base, tmp_path):
    (trajs, ups), _ = apply(name, *base, seed=0)
    write_records(tmp_path / "log", trajs, ups, parts=3)
    cfg = Config.from_mapping(FAULTS[name].config)
    ref, small, mem = _three_ways(tmp_path / "log", cfg)  # `small` also runs two batches at once
    assert ref.height > 0
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


# one fault per family, plus duplicate ids across files (batches then not merged) and the
# prefix hashes of M105/M107 over merged batches
_SMALL_FILE_FAULTS = (
    "tool_tokens_trained",
    "positive_logprob",
    "stop_reason_contradicts_flag",
    "potential_chain_broken",
    "duplicate_shard_row",
    "missing_loss_mask",
    "loss_over_whole_transcript",
    "policy_version_decreasing",
    "reset_not_reproducible",
    "advantages_on_degenerate_group",
    "template_reapplied_drops_separator",
    "turn_separator_dropped",
)


@pytest.mark.parametrize("name", _SMALL_FILE_FAULTS)
def test_one_file_per_trajectory_finds_what_one_file_finds(name, base, tmp_path):
    """Small files share batches (the engine merges them): the findings are those of the same
    rows in one file, and each finding names the file that holds its trajectory."""
    (trajs, ups), _ = apply(name, *base, seed=0)
    write_records(tmp_path / "one", trajs, ups)
    write_records(tmp_path / "many", trajs, ups, parts=len(trajs))
    cfg = Config.from_mapping(FAULTS[name].config)
    one = run_audit(discover([tmp_path / "one"]), cfg)
    many = run_audit(discover([tmp_path / "many"]), cfg)
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
