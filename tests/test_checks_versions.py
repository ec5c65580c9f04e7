"""Policy-version checks P501-P504: each fires on its own fault, naming the trajectory and
turn, stays silent on a compliant log, and is not run without its inputs."""

from __future__ import annotations

import polars as pl
from checkhelp import EXCLUDED, drop_turn_field, loud, only
from conftest import write_log

import rollout_audit as ra
from rollout_audit.contract.config import Config


def set_version(tr: dict, v: int) -> None:
    for t in tr["turns"]:
        t["policy_version"] = v


def test_compliant_log_is_silent_with_statistics(records):
    rep = ra.audit(*records)
    assert not loud(rep) and "P504" not in rep.codes(), rep.render()
    for code in ("P501", "P502", "P503", "P504"):
        assert code not in rep.not_run and code in rep.summary["checks_run"]
    st = rep.summary["statistics"]
    assert st["P503"]["lag_histogram"] == {"0": sum(len(u["trajectory_ids"]) for u in records[1])}
    assert st["P504"]["versions_per_episode"] == {"1": len(records[0])}
    assert st["P504"]["multi_version_episodes"] == 0


# ---------------------------------------------------------------- P501


def test_p501_null_version_on_turns(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    tr["turns"][2]["policy_version"] = None
    tr["turns"][5]["policy_version"] = None
    f = only(ra.audit(trajs, ups), "P501")
    r = f.row(0, named=True)
    assert f.height == 1 and (r["trajectory_id"], r["turn"]) == (tr["trajectory_id"], 2)
    assert r["message"] == "policy_version is null on 2 of 6 turn(s) (turns 2, 5)"


def test_p501_not_run_without_the_field(records):
    trajs, ups = records
    drop_turn_field(trajs, "policy_version")
    rep = ra.audit(trajs, ups)
    for code in ("P501", "P502", "P503", "P504"):
        assert code in rep.not_run, code
    assert "turns.policy_version" in rep.not_run["P501"]
    assert not {"P501", "P502", "P503", "P504"} & rep.codes()


# ---------------------------------------------------------------- P502


def test_p502_version_decreases_inside_an_episode(records):
    trajs, ups = records
    tr = trajs[22]  # version 1, 6 turns, in update 1
    tr["turns"][3]["policy_version"] = 0
    tr["turns"][4]["policy_version"] = None  # a gap does not hide the next comparison
    ups[1]["max_policy_lag"] = 1  # the lag of 1 is allowed here: only the order is wrong
    rep = ra.audit(trajs, ups)
    assert loud(rep) == {"P501", "P502"}, rep.render()
    f = rep.findings.filter(pl.col("code") == "P502")
    r = f.row(0, named=True)
    assert f.height == 1 and (r["trajectory_id"], r["turn"]) == (tr["trajectory_id"], 3)
    assert r["message"] == "policy_version 0 follows version 1 of an earlier turn; expected non-decreasing versions"
    # and the P504 statistics see the two-version episode
    assert "P504" in rep.codes("info")


def test_p502_compares_within_an_episode_only(records):
    """An episode whose first turns carry no version is not compared with the episode before it."""
    trajs, ups = records
    first, second = trajs[22], trajs[23]
    for t in first["turns"]:
        t["policy_version"] = 5  # a newer version than any turn of the next episode
    second["turns"][0]["policy_version"] = None
    rep = ra.audit(trajs, ups)
    assert "P502" not in rep.codes(), rep.render()
    assert "P501" in rep.codes()  # the null is reported, as P501's


def test_p502_increasing_versions_are_fine(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    for t, v in zip(tr["turns"], (0, 0, 1, 1, 1, 2)):
        t["policy_version"] = v
    assert not loud(ra.audit(trajs, ups))


# ---------------------------------------------------------------- P503


def test_p503_stale_trajectory_in_an_update(records):
    trajs, ups = records
    tr = trajs[22]  # in update 1 (trainer_version 1, max_policy_lag 0)
    set_version(tr, 0)
    rep = ra.audit(trajs, ups)
    r = only(rep, "P503").row(0, named=True)
    assert r["trajectory_id"] == tr["trajectory_id"] and r["turn"] is None
    assert r["message"] == "update 1 (trainer_version 1) uses a trajectory sampled by version 0: lag 1 > bound 0"
    assert rep.summary["statistics"]["P503"]["lag_histogram"]["1"] == 1


def test_p503_negative_lag_is_reported_without_a_bound(records):
    trajs, ups = records
    tr = trajs[0]  # in update 0 (trainer_version 0)
    tr["turns"][-1]["policy_version"] = 1
    for u in ups:
        u["max_policy_lag"] = None
    rep = ra.audit(trajs, ups)
    r = only(rep, "P503").row(0, named=True)
    assert r["trajectory_id"] == tr["trajectory_id"]
    assert "sampled by version 1 (negative lag -1): the policy is newer than the trainer" in r["message"]
    assert "no lag bound declared" in rep.summary["statistics"]["P503"]["note"]


def test_p503_bound_from_configuration_when_updates_have_none(tmp_path, records):
    trajs, ups = records
    set_version(trajs[22], 0)
    for u in ups:
        del u["max_policy_lag"]
    rep = ra.audit(trajs, ups)
    assert not loud(rep)
    assert rep.summary["statistics"]["P503"]["note"].startswith("no lag bound declared")
    root = write_log(tmp_path / "log", trajs, ups, parts=2)
    f = only(ra.audit(root, config=Config(max_policy_lag=0)), "P503")
    assert f["trajectory_id"].to_list() == [trajs[22]["trajectory_id"]] and f["file"][0].endswith(".parquet")
    assert not loud(ra.audit(root, config=Config(max_policy_lag=1)))


def test_p503_update_bound_wins_over_configuration(records):
    trajs, ups = records
    set_version(trajs[22], 0)
    ups[1]["max_policy_lag"] = 2
    assert not loud(ra.audit(trajs, ups, config=Config(max_policy_lag=0)))


def test_p503_not_run_without_updates(records):
    trajs, _ = records
    rep = ra.audit(trajs)
    assert "no update records" in rep.not_run["P503"] and "P503" not in rep.codes()


# ---------------------------------------------------------------- P504


def test_p504_histogram_of_versions_per_episode(records):
    trajs, ups = records
    for t, v in zip(trajs[EXCLUDED]["turns"], (0, 0, 1, 1, 2, 2)):
        t["policy_version"] = v
    trajs[2]["turns"][-1]["policy_version"] = 1  # t000002, excluded too: versions 0, 0, 1
    rep = ra.audit(trajs, ups)
    assert not loud(rep)
    f = rep.findings.filter(pl.col("code") == "P504")
    r = f.row(0, named=True)
    assert f.height == 1 and r["severity"] == "info" and r["trajectory_id"] == trajs[EXCLUDED]["trajectory_id"]
    n = len(trajs)
    assert r["message"].startswith(
        f"2 of {n} episodes were sampled by several policy versions; "
        f"versions per episode {{1: {n - 2}, 2: 1, 3: 1}}; version span "
        f"{{0: {n - 2}, 1: 1, 2: 1}}"
    )
    st = rep.summary["statistics"]["P504"]
    assert st["versions_per_episode"] == {"1": n - 2, "2": 1, "3": 1} and st["multi_version_episodes"] == 2


# ---------------------------------------------------------------- P505: routing replay


def test_p505_routes_once_from_each_turns_version(records):
    from rollout_audit.faults import apply
    from rollout_audit.faults.versions import record_routes

    trajs, ups = records
    assert "P505" in ra.audit(trajs, ups).not_run  # no routes recorded: not run, never a finding
    for t in trajs:
        record_routes(t)
    assert not loud(ra.audit(trajs, ups))
    (dup, u2), touched = apply("routes_resumed_duplicated", trajs, ups)
    f = only(ra.audit(dup, u2), "P505")
    assert f["trajectory_id"].to_list() == touched and "entries for" in f["message"][0]
    (old, u2), touched = apply("routes_of_resumed_weights", trajs, ups)
    f = only(ra.audit(old, u2), "P505")
    assert f["trajectory_id"].unique().to_list() == touched and f["turn"][0] == 0
    assert "routes of another version" in f["message"][0]
    # a lost segment: the routes of the prompt's first token were never kept
    t = next(t for t in trajs if t["token_source"][0] != 2)
    t["routed_experts_version"][0] = None
    f = only(ra.audit(trajs, ups), "P505")
    assert (
        f["trajectory_id"].to_list() == [t["trajectory_id"]] and f["position"][0] == 0 and "no route" in f["message"][0]
    )


def test_p505_no_route_from_the_last_policy_token_on_is_not_a_lost_segment(records):
    """The engine never routes its last sampled token, nor tool output after the last generation (verl
    zero-fills and masks those rows): null there is no finding; null on the token before is."""
    from rollout_audit.faults.versions import record_routes

    trajs, ups = records
    for t in trajs:
        record_routes(t)
    t = next(t for t in trajs if t["token_source"].count(2) >= 2)
    last = max(i for i, s in enumerate(t["token_source"]) if s == 2)
    t["routed_experts_version"][last:] = [None] * (len(t["token_ids"]) - last)
    assert not loud(ra.audit(trajs, ups))
    t["routed_experts_version"][last - 1] = None
    f = only(ra.audit(trajs, ups), "P505")
    assert f["trajectory_id"].to_list() == [t["trajectory_id"]] and "no route" in f["message"][0]
