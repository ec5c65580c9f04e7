"""Smoke test of the benchmark generator: a tiny generated log is clean for the audit, and
its injected faults are found (no timing assertions)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` lives at the repo root

import rollout_audit
from benchmarks.generate import FAULTS, NOT_GENERATED, TRAINER_LOGPROBS, generate
from benchmarks.run import naive_audit
from rollout_audit.checks import all_rules
from rollout_audit.contract import schema as S


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "200k"
    generate(200_000, out, row_group=128, file_rows=256)
    return out


def test_generated_log_has_the_full_contract(clean):
    info = json.loads((clean / "_generated.json").read_text())
    assert info["tokens"] > 150_000 and len(info["files"]) >= 2
    for name in info["files"]:
        pf = pq.ParquetFile(clean / name)
        meta = pf.schema_arrow.metadata
        assert meta[S.META_VERSION] == S.CONTRACT_VERSION.encode() and meta[S.META_KIND] == b"trajectories"
        assert pf.metadata.num_row_groups >= 1
        # every column, but those of what a generated run has none of (split episodes, loss exclusions), and a
        # trainer's recomputation of the log-probs (outside the contract: read only when compare_logprobs names it)
        contract = [c.name for c in S.columns("trajectories") if c.name not in NOT_GENERATED]
        assert pf.schema_arrow.names == [*contract, TRAINER_LOGPROBS]
        turn_fields = [f.name for f in pf.schema_arrow.field("turns").type.value_type]
        assert turn_fields == [c.name for c in S.columns("turn")]
    upd = pq.ParquetFile(clean / "updates" / "updates.parquet")
    assert upd.schema_arrow.metadata[S.META_KIND] == b"updates"
    # the v1 contract, every column, the contract 1.2 loss evidence and what the 1.4 loss function did
    later = ["numerator_tokens", "stat_trajectory_ids", "reducer_mode", "reducer_divisor", "ratio_anchor"]
    assert upd.schema_arrow.names == [*S.arrow_schema("updates").names, *later, "ratio_correction", "ratio_clipping"]
    t = pq.read_table(clean / info["files"][0])
    assert t.column("truncated").to_numpy().any()
    assert t.column("reward").null_count > 0


def test_clean_log_raises_nothing(clean):
    rep = rollout_audit.audit(clean)
    assert rep.count("error") == 0 and rep.count("warning") == 0, rep.render(limit=5)
    assert rep.findings.filter(rep.findings["severity"] != "info").height == 0
    # every column and turn field a check needs is present (a check may still need a replayer), but
    # for the checks of what a generated run has none of (M111: no episode is split)
    unsplit = {c for c, r in rollout_audit.all_rules().items() if set(r.requires) & NOT_GENERATED}
    assert not [c for c, why in rep.not_run.items() if "absent" in why and c not in unsplit], rep.not_run
    assert rep.summary["rows_read"] == json.loads((clean / "_generated.json").read_text())["trajectories"]


def test_naive_loop_agrees_on_clean_log(clean):
    rows = pq.read_table(next(clean.glob("part-*.parquet"))).to_pylist()
    found = naive_audit(rows)
    assert set(found) <= {"G701_degenerate_groups"}, found


def test_injected_faults_are_found(tmp_path):
    out = tmp_path / "faulty"
    info = generate(200_000, out, fault_share=0.05, row_group=128, file_rows=256)
    faulted = info["faults"]
    assert set(faulted.values()) == {name for name, _ in FAULTS.values()}
    rep = rollout_audit.audit(out)
    f = rep.findings
    registered = set(all_rules())
    for name, code in info["fault_codes"].items():
        if code not in registered:
            continue
        want = {tid for tid, kind in faulted.items() if kind == name}
        got = set(f.filter(f["code"] == code)["trajectory_id"].to_list())
        assert want <= got, f"{code} ({name}) missed {sorted(want - got)[:5]}"
    # zero false positives: every trajectory-level error or warning is on a faulted trajectory
    bad = f.filter(f["severity"] != "info")
    on_traj = bad.filter(bad["trajectory_id"].is_not_null())
    assert set(on_traj["trajectory_id"].to_list()) <= set(faulted), on_traj.head(5)
    assert set(bad.filter(bad["trajectory_id"].is_null())["code"].to_list()) <= {"U601"}


def test_the_floor_reads_the_columns_the_audit_reads(clean):
    """The benchmark's floor reads exactly the columns the default audit plans to read."""
    from benchmarks.run import audited_columns

    cols = audited_columns()
    assert {"token_ids", "token_source", "loss_mask", "turns"} <= set(cols)
    assert set(cols) <= {c.name for c in S.columns("trajectories")}


def test_long_shape_is_clean_with_required_columns_only(tmp_path):
    """The second benchmark shape: many turns, long observations, no optional columns."""
    info = generate(400_000, tmp_path / "long", shape="long")
    pf = pq.ParquetFile(tmp_path / "long" / info["files"][0])
    optional = {c.name for t in ("trajectories", "turn") for c in S.columns(t) if c.requirement == "O"}
    turn_fields = {f.name for f in pf.schema_arrow.field("turns").type.value_type}
    assert not (optional - {"group_id"}) & (set(pf.schema_arrow.names) | turn_fields)
    assert info["tokens"] / info["trajectories"] > 10_000  # ~40 turns of ~470 tokens
    rep = rollout_audit.audit(str(tmp_path / "long"))
    assert rep.ok and not rep.findings.height, rep.render()
    assert {"M105", "R406"} <= set(rep.not_run)  # their turn fields are not written


def test_the_capture_benchmark_records_every_call_it_times():
    pytest.importorskip("aiohttp")
    from benchmarks.capture import main

    got = main(["--calls", "8", "--sessions", "4", "--latency-calls", "4", "--repeat", "1", "--tokens", "4"])
    assert got["exchanges_recorded"] == 1 + 2 * (8 + 4)  # the warm-up, then each kind's timed calls
    assert got["session_files"] == 1 + 2 * (4 + 1)
    for kind in ("whole", "streamed"):
        assert got[kind]["recorded_calls_per_s"] > 0 and got[kind]["direct_median_ms"] > 0
    assert got["rss_peak_mb"] >= got["rss_start_mb"] > 0


def test_the_table_pairs_each_audit_with_the_floor_of_its_round():
    """Ratios are taken per round (an audit against the floor read just before it), then the
    median: a round slowed by other load moves its floor and its audit together."""
    from benchmarks.run import timing_row

    tm = {
        "floor": [1.0, 4.0, 2.0],
        "audit": [1.5, 8.0, 2.6],
        "one thread": [2.0, 10.0, 4.0],
        "floor cpu": [2.0, 2.0, 2.0],
        "audit cpu": [3.0, 3.2, 3.4],
        "one thread cpu": [2.0, 2.5, 3.0],
        "floor load": [1.0, 7.5, 2.0],
        "audit load": [1.2, 8.0, 2.0],
        "one thread load": [1.1, 3.0, 2.0],
    }
    row = timing_row(tm)
    assert row["floor s"] == 2.0 and row["audit s"] == 2.6
    assert row["audit/floor"] == pytest.approx(1.5)  # of 1.5, 2.0, 1.3 (not 2.6 / 2.0)
    assert row["one-thread/floor"] == pytest.approx(2.0)  # of 2.0, 2.5, 2.0
    assert row["CPU audit/floor"] == pytest.approx(1.6)
    assert row["cores floor"] == pytest.approx(1.0)  # of 2.0, 0.5, 1.0
    assert row["cores audit"] == pytest.approx(3.4 / 2.6)  # of 2.0, 0.4, 1.31
    assert row["load"] == "1.0–8.0"
