"""Detection matrix: every named fault raises its codes, names its trajectories, and raises
no other error or warning; the compliant log raises none; the same when split in partitions
(there with several faults to a log, each finding explained by the fault that expects it)."""

from __future__ import annotations

import faultgroups
import polars as pl
import pytest

import rollout_audit as ra
from rollout_audit.faults import FAULTS, detect, read_records, write_records
from rollout_audit.synth import make_log

EVIDENCE = {"R411", "R412", "R413", "U607", "U608"}  # what the contract 1.2 loss evidence feeds


@pytest.fixture(scope="module")
def base():
    return make_log(n_tasks=4, group_size=4, n_versions=2, seed=0)


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_is_caught_exactly(name, base, tmp_path):
    row = detect(name, *base, tmp_path)
    assert row.ok, row.problem()  # names the fault and every check involved


def test_a_group_holds_faults_that_expect_disjoint_codes():
    for group in faultgroups.GROUPS:
        codes = [c for n in group for c in FAULTS[n].codes]
        assert len(codes) == len(set(codes)), group


@pytest.mark.parametrize(
    "group", [g for g in faultgroups.GROUPS if g not in faultgroups.RECORD_GROUPS], ids=faultgroups.group_id
)
def test_faults_are_caught_exactly_in_partitions(group, base, tmp_path):
    """Split in three partitions, several faults to a log (tests/faultgroups.py): each fault's
    codes on the trajectories it touched, and every finding explained by a fault expecting it.
    Here the group with the truncated file; tests/test_streaming.py audits the other groups'
    logs, split the same way, and asserts the same."""
    trajs, touched = faultgroups.write_group(tmp_path / "log", group, *base, parts=3)
    rep = ra.audit(tmp_path / "log", config=faultgroups.config(group))
    assert not faultgroups.problems(group, rep.findings, trajs, touched)


def test_compliant_log_is_clean_in_one_file_and_in_partitions(base, tmp_path):
    for parts in (1, 4):
        write_records(tmp_path / f"p{parts}", *base, parts=parts)
        rep = ra.audit(tmp_path / f"p{parts}")
        bad = rep.findings.filter(pl.col("severity") != "info")
        assert bad.is_empty(), bad
        # configuration needed (R408, T306), no template render (M107); replay is off by default;
        # no contract 1.2 loss evidence (R411-R413, U607, U608)
        # no contract 1.3 routes, loss streams or overlong penalty (P505, M110, R414), no recorded
        # nucleus (L210), no split's exposed token (M111); no contract 1.4 critic values, ratio anchor or
        # second log-prob column (R416, U610, L211); no trainer temperature (L212), no capture digest (M112)
        assert (
            set(rep.not_run)
            == {"R408", "T306", "M107", "L205", "L206", "L207", "L209", "P505", "M110", "R414", "L210", "M111"}
            | {"R416", "U610", "L211", "L212", "M112"}
            | EVIDENCE
        )


def test_every_error_and_warning_code_has_a_fault():
    """A check that replays the policy needs checkpoints, not a record rewrite: its faults are
    reference_agent.replay.REPLAY_FAULTS and benchmarks.tinylm.FAULT_NAMES, caught in
    tests/test_replay_agent.py and tests/test_replay_hf.py. Every other error or warning check
    has a named fault."""
    rules = ra.all_rules().values()
    codes = {r.code for r in rules if r.severity in ("error", "warning") and "replay" not in r.config}
    covered = set().union(*(f.codes for f in FAULTS.values()))
    assert not codes - covered, f"no fault raises {sorted(codes - covered)}: add one in rollout_audit/faults/"


def test_records_round_trip(base, tmp_path):
    write_records(tmp_path / "log", *base)
    trajs, ups = read_records(tmp_path / "log")
    assert [t["trajectory_id"] for t in trajs] == [t["trajectory_id"] for t in base[0]]
    assert trajs[0]["token_ids"] == base[0][0]["token_ids"]
    assert ups[0]["advantages"] == pytest.approx(base[1][0]["advantages"])


def test_a_fault_chooses_a_place_where_its_change_exceeds_the_tolerance(base):
    """A trained policy is near-certain on most turns (log-prob −0.002): scaling such a turn's
    log-prob by 0.7 moves it less than L202's tolerance. The fault picks a turn where it does not,
    and refuses, saying why, when the log has none."""
    from rollout_audit.faults import apply

    trajs, ups = base
    near_certain = [dict(t, turns=[dict(tr, logprob=-0.0018) for tr in t["turns"]]) for t in trajs]
    one = trajs[5]["trajectory_id"]
    for t in near_certain:
        if t["trajectory_id"] == one:
            t["turns"][-1]["logprob"] = -0.5
    (bt, bu), touched = apply("turn_logprob_from_base_softmax", near_certain, ups)
    assert touched == [one]
    changed = [(t["trajectory_id"], tr["logprob"]) for t in bt for tr in t["turns"] if tr["logprob"] != -0.0018]
    assert changed == [(one, pytest.approx(-0.35))]
    everywhere = [dict(t, turns=[dict(tr, logprob=-0.0018) for tr in t["turns"]]) for t in trajs]
    with pytest.raises(ValueError, match="no turn with a recorded log-prob of magnitude"):
        apply("turn_logprob_from_base_softmax", everywhere, ups)
