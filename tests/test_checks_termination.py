"""Termination checks T301-T309 (docs/contract.md, stop causes, lesson “Success, termination, truncation, and infrastructure failure”) against mutated synthetic logs."""

from __future__ import annotations

import pytest
from checkhelp import audit, only, positions, rows
from checkhelp import loud as blocking
from conftest import write_log

import rollout_audit as ra
from rollout_audit.contract.config import Config
from rollout_audit.faults.base import Ctx, insert_tokens, remove_tokens

T_CODES = {"T301", "T302", "T303", "T304", "T305"}


def pick(trajs, updates=None, *, stop=None, in_update=None, n=1, min_turns=1):
    """The first `n` trajectories matching the stop-reason set and update membership."""
    used = {i for u in updates or [] for i in u["trajectory_ids"]}
    out = [
        t
        for t in trajs
        if (stop is None or t["stop_reason"] in stop)
        and len(t["turns"]) >= min_turns
        and (in_update is None or (t["trajectory_id"] in used) == in_update)
    ]
    assert len(out) >= n
    return out[:n]


def to_infra(t, reason="env_error"):
    t.update(terminated=False, truncated=False, infra_error=True, stop_reason=reason)


def test_compliant_log_is_silent_and_every_check_runs(records):
    rep = audit(*records)
    assert rep.ok and not blocking(rep)
    assert not T_CODES & set(rep.not_run), rep.not_run


# ---------------------------------------------------------------- T301


def test_t301_no_flag_and_two_flags(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"success", "failure"})
    (b,) = pick(trajs, stop={"max_turns"})
    a["terminated"] = False  # no flag at all
    b["infra_error"] = True  # truncated and infra_error
    rep = audit(trajs, ups)
    assert blocking(rep) == {"T301"}
    f = rows(rep, "T301")
    assert sorted(f["trajectory_id"]) == sorted([a["trajectory_id"], b["trajectory_id"]])
    msg = dict(zip(f["trajectory_id"], f["message"]))
    assert msg[a["trajectory_id"]] == (
        "0 of terminated/truncated/infra_error are true, expected exactly 1 "
        "(terminated=false, truncated=false, infra_error=false)"
    )
    assert msg[b["trajectory_id"]] == (
        "2 of terminated/truncated/infra_error are true, expected exactly 1 "
        "(terminated=false, truncated=true, infra_error=true)"
    )


def test_t301_null_flag_counts_as_unset(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"max_turns"})
    a["truncated"] = None
    rep = audit(trajs, ups)
    assert rows(rep, "T301")["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert "truncated=null" in rows(rep, "T301")["message"][0]


# ---------------------------------------------------------------- T302


def test_t302_reason_of_another_flag(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"failure"})
    a["stop_reason"] = "max_turns"  # a collector limit recorded as a task failure
    rep = audit(trajs, ups)
    assert blocking(rep) == {"T302"}
    f = rows(rep, "T302")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert f["message"][0] == "stop_reason 'max_turns' belongs to truncated, but terminated is the flag set"


def test_t302_unknown_reason_and_extra_stop_reasons(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"failure"})
    a["stop_reason"] = "gave_up"
    rep = audit(trajs, ups)
    assert blocking(rep) == {"T302"}
    assert rows(rep, "T302")["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert "unknown stop_reason 'gave_up'" in rows(rep, "T302")["message"][0]
    # declared in configuration: accepted for its flag, rejected for another
    assert not blocking(audit(trajs, ups, extra_stop_reasons={"gave_up": "terminated"}))
    rep = audit(trajs, ups, extra_stop_reasons={"gave_up": "infra_error"})
    assert blocking(rep) == {"T302"}


def test_t302_leaves_multi_flag_rows_to_t301(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"max_turns"})
    a["terminated"] = True
    rep = audit(trajs, ups, select=["T"])
    assert rep.codes() == {"T301"}


# ---------------------------------------------------------------- T303


def test_t303_silent_on_a_clean_infra_error_episode(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"max_turns"}, in_update=False)  # reward null, in no update
    to_infra(a)
    rep = audit(trajs, ups)
    assert not blocking(rep)


def test_t303_infra_error_with_a_reward(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"max_turns"}, in_update=False)
    to_infra(a, "tool_error")
    a["reward"] = 0.0  # infrastructure failure scored as a task failure
    rep = audit(trajs, ups)
    assert blocking(rep) == {"T303"}
    f = rows(rep, "T303")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert f["message"][0] == "infra_error episode carries reward 0 (expected null)"


def test_t303_infra_error_used_in_an_update(tmp_path, records):
    trajs, ups = records
    (a,) = pick(trajs, ups, stop={"failure"}, in_update=True)
    to_infra(a)
    a["reward"] = None
    steps = [u["update_step"] for u in ups if a["trajectory_id"] in u["trajectory_ids"]]
    # U606 (another family) also covers use in an update; restrict to this family.
    rep = ra.audit(write_log(tmp_path / "log", trajs, ups, parts=2), select=["T"])
    assert rep.codes() == {"T303"}
    f = rows(rep, "T303")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert f["message"][0] == f"infra_error episode is used in update(s) {', '.join(map(str, steps))}"
    assert f["file"][0].endswith(".parquet")


def test_t303_reward_part_runs_without_updates(records):
    trajs, _ = records
    a, b = pick(trajs, stop={"failure"}, n=2)
    to_infra(a)
    to_infra(b)
    b["reward"] = None
    rep = audit(trajs, None, select=["T"])
    assert rep.codes() == {"T303"}
    assert rows(rep, "T303")["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert "T303" not in rep.not_run


# ---------------------------------------------------------------- T304


def test_t304_exclude_policy_wants_a_null_reward(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"max_turns"}, in_update=False)
    a["reward"] = 0.0  # truncated episode scored as a failure
    rep = audit(trajs, ups)
    assert blocking(rep) == {"T304"}
    f = rows(rep, "T304")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert f["message"][0] == (
        "truncated episode (stop_reason max_turns) has reward 0, expected null (truncation policy 'exclude')"
    )


def test_t304_bootstrap_needs_final_value_and_penalize_accepts(records):
    trajs, ups = records
    a, b = pick(trajs, stop={"max_turns"}, in_update=False, n=2)
    a["reward"] = 0.0
    b["reward"] = 0.0
    b["final_value"] = None
    rep = audit(trajs, ups, truncation="bootstrap")
    assert blocking(rep) == {"T304"}
    assert rows(rep, "T304")["trajectory_id"].to_list() == [b["trajectory_id"]]
    assert rows(rep, "T304")["message"][0] == (
        "truncated episode (stop_reason max_turns) has reward 0 but no final_value to bootstrap from "
        "(truncation policy 'bootstrap')"
    )
    assert not blocking(audit(trajs, ups, truncation="penalize", select=["T"]))


def test_t304_silent_when_truncated_rewards_are_null(records):
    trajs, ups = records
    assert any(t["truncated"] for t in trajs)
    for policy in ("exclude", "bootstrap", "penalize"):
        assert not blocking(audit(trajs, ups, truncation=policy, select=["T304"]))


# ---------------------------------------------------------------- T305


@pytest.mark.parametrize("reason", ["length", "abort"])
def test_t305_length_cut_recorded_as_terminated(records, reason):
    trajs, ups = records
    (a,) = pick(trajs, stop={"failure"}, min_turns=2)
    a["turns"][-1]["finish_reason"] = reason
    rep = audit(trajs, ups)
    assert blocking(rep) == {"T305"}
    f = rows(rep, "T305")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert f["turn"].to_list() == [len(a["turns"]) - 1]
    assert f["message"][0] == (
        f"last turn ended with finish_reason '{reason}' but the episode is recorded as terminated "
        "(stop_reason failure); expected truncated or infra_error"
    )


def test_t305_silent_on_earlier_turns_and_truncated_episodes(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"failure"}, min_turns=2)
    (b,) = pick(trajs, stop={"max_turns"})
    a["turns"][0]["finish_reason"] = "length"  # not the last turn
    b["turns"][-1]["finish_reason"] = "length"  # honestly recorded as truncated
    assert not blocking(audit(trajs, ups))


def test_t305_not_run_without_finish_reason(records):
    trajs, ups = records
    for t in trajs:
        for tr in t["turns"]:
            del tr["finish_reason"]
    rep = audit(trajs, ups)
    assert "T305" in rep.not_run and "turns.finish_reason" in rep.not_run["T305"]
    assert not blocking(rep)


# ---------------------------------------------------------------- T306


def response_tokens(t) -> int:
    """Tokens from the first agent turn on."""
    return sum(1 for x in t["token_turn"] if x >= 0)


def test_t306_budget_filled_but_terminated(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"success", "failure"})
    limit = response_tokens(a)
    rep = audit(trajs, ups, max_response_tokens=limit)
    f = rows(rep, "T306")
    longer = {t["trajectory_id"] for t in trajs if t["terminated"] and response_tokens(t) >= limit}
    assert set(f["trajectory_id"]) == longer and a["trajectory_id"] in longer
    assert f"max_response_tokens = {limit}" in f.filter(f["trajectory_id"] == a["trajectory_id"])["message"][0]


def test_t306_silent_below_the_budget_and_on_truncated_episodes(records):
    trajs, ups = records
    assert "T306" not in audit(trajs, ups, max_response_tokens=max(map(response_tokens, trajs)) + 1).codes()
    shortest = min(response_tokens(t) for t in trajs)
    for t in trajs:
        t.update(terminated=False, truncated=True, infra_error=False, stop_reason="max_tokens", reward=None)
    assert "T306" not in audit(trajs, ups, max_response_tokens=shortest).codes()


def test_t306_not_run_without_a_budget(records):
    rep = audit(*records)
    assert "max_response_tokens" in rep.not_run["T306"]


# ---------------------------------------------------------------- T307


def paid_truncation(trajs):
    """A truncated episode of a task with a failure, paid the success reward 1.0."""
    failed = {t["task_id"] for t in trajs if t["stop_reason"] == "failure"}
    t = next(t for t in trajs if t["truncated"] and t["task_id"] in failed)
    t["reward"] = 1.0
    return t["trajectory_id"]


def test_t307_truncated_episode_paid_as_a_success_under_penalize(records):
    trajs, ups = records
    tid = paid_truncation(trajs)
    rep = audit(trajs, ups, truncation="penalize")
    f = rows(rep, "T307")
    assert f["trajectory_id"].to_list() == [tid] and "expected at most 0, the failure reward of task" in f["message"][0]
    assert (
        rows(audit(trajs, ups, truncation="penalize", truncation_penalty=-0.5), "T307")["message"]
        .str.contains("expected at most -0.5, the configured truncation_penalty")
        .all()
    )
    assert rows(audit(trajs, ups, truncation="penalize", truncation_penalty=1.0), "T307").is_empty()


def test_t307_silent_when_paid_the_penalty_and_under_other_policies(records):
    trajs, ups = records
    for t in trajs:
        if t["truncated"]:
            t["reward"] = 0.0
    rep = audit(trajs, ups, truncation="penalize")
    assert "T307" not in rep.codes() and "T307" not in rep.not_run
    paid_truncation(trajs)
    assert "T307" not in audit(trajs, ups, truncation="exclude").codes()  # T304 speaks there


def test_t307_not_run_when_nothing_bounds_the_reward(records):
    trajs, ups = records
    paid_truncation(trajs)
    for t in trajs:
        if t["stop_reason"] == "failure":
            t["stop_reason"] = "task_budget"
    rep = audit(trajs, ups, truncation="penalize")
    assert "needs truncation_penalty" in rep.not_run["T307"]


# ---------------------------------------------------------------- T308


def test_t308_truncated_episode_paid_an_outcome_under_bootstrap(records):
    trajs, ups = records
    tid = paid_truncation(trajs)
    (t,) = [t for t in trajs if t["trajectory_id"] == tid]
    assert t["final_value"] is not None and sum(x["reward"] for x in t["turns"]) < 1.0  # bootstraps, earned less
    f = rows(audit(trajs, ups, truncation="bootstrap"), "T308")
    assert f["trajectory_id"].to_list() == [tid]
    assert "has reward 1, more than its turns were paid" in f["message"][0], f["message"][0]
    for policy in ("exclude", "penalize"):  # T304 and T307 bound the reward there
        assert "T308" not in audit(trajs, ups, truncation=policy).codes()


def test_t308_silent_when_a_truncated_episode_is_paid_what_its_turns_earned(records):
    trajs, ups = records
    for t in trajs:
        if t["truncated"]:
            t["turns"][0]["reward"] = 0.25  # a milestone reached before the cut is the episode's to keep
            t["reward"] = sum(x["reward"] for x in t["turns"]) - 0.125  # less than earned: a penalty, allowed
    rep = audit(trajs, ups, truncation="bootstrap", select=["T308"])
    assert "T308" not in rep.codes() and "T308" not in rep.not_run
    assert any(t["truncated"] and t["reward"] > 0 for t in trajs)  # compared, not skipped


def test_t308_not_run_under_bootstrap_without_turn_rewards(records):
    trajs, ups = records
    paid_truncation(trajs)
    for t in trajs:
        for x in t["turns"]:
            del x["reward"]
    assert "turns.reward" in audit(trajs, ups, truncation="bootstrap", select=["T308"]).not_run["T308"]
    assert "T308" not in audit(trajs, ups, select=["T308"]).not_run  # nothing to bound under exclude


# ---------------------------------------------------------------- T309

STOP_ID = 99  # an id the synthetic log uses nowhere: its engine's stop token


def stop_turns(trajs) -> dict[str, tuple[int, int]]:
    """Per trajectory with a turn the engine ended with finish_reason stop: that turn and the
    position of its last policy token."""
    return {
        t["trajectory_id"]: (k, positions(t, 2, k)[-1])
        for t in trajs
        for k, tr in enumerate(t["turns"])
        if tr["finish_reason"] == "stop"
    }


@pytest.fixture
def stopped(records):
    """The synthetic log as an engine that stops on STOP_ID writes it: every stop turn's last
    sampled token is the stop token (inserted with the fault helper, so the log stays compliant)."""
    trajs, ups = records
    ctx = Ctx(trajs, ups, seed=0)
    for t in trajs:
        if (end := stop_turns([t]).get(t["trajectory_id"])) is not None:
            insert_tokens(ctx, t, end[1] + 1, [STOP_ID], source=2, turn=end[0], logprobs=[-0.015625])
    return trajs, ups


def test_t309_stop_turn_whose_stop_token_was_stripped(stopped):
    trajs, ups = stopped
    ends = stop_turns(trajs)
    a = next(t for t in trajs if t["trajectory_id"] in ends)
    k, last = ends[a["trajectory_id"]]
    remove_tokens(Ctx(trajs, ups, seed=0), a, last)  # the worker strips it, record and counts alike
    f = only(audit(trajs, ups, preview=True, stop_token_ids=[STOP_ID]), "T309")
    assert f.select("trajectory_id", "turn", "position").rows() == [(a["trajectory_id"], k, last - 1)]
    assert f["message"][0] == (
        "the engine stopped this turn on a stop token (finish_reason stop), but its last policy token is id "
        f"{a['token_ids'][last - 1]}, not one of stop_token_ids [{STOP_ID}]"
    )


def test_t309_silent_when_every_stop_turn_ends_on_a_stop_token(stopped):
    trajs, ups = stopped
    rep = audit(trajs, ups, preview=True, stop_token_ids=[STOP_ID, 7])
    assert rep.ok and not blocking(rep) and "T309" not in rep.not_run
    assert any(tr["finish_reason"] == "tool_calls" for t in trajs for tr in t["turns"])  # end on any token
    a = next(t for t in trajs if t["trajectory_id"] in stop_turns(trajs))
    k, _ = stop_turns([a])[a["trajectory_id"]]
    for i in positions(a, 2, k):
        a["token_source"][i] = 4  # a stop turn without a policy token: nothing to compare
    assert "T309" not in audit(trajs, ups, preview=True, stop_token_ids=[STOP_ID]).codes()


def test_t309_fires_on_every_stop_turn_under_a_stop_list_they_do_not_end_on(stopped):
    trajs, ups = stopped
    f = rows(audit(trajs, ups, preview=True, stop_token_ids=[STOP_ID + 1]), "T309")
    assert sorted(f["trajectory_id"]) == sorted(stop_turns(trajs))


def test_t309_not_run_without_the_users_stop_list(stopped):
    rep = audit(*stopped, preview=True)
    assert "stop_token_ids" in rep.not_run["T309"]


@pytest.mark.parametrize("bad", [[-1], [2**31], [True], [1.5]])
def test_t309_stop_token_ids_are_token_ids(bad):
    with pytest.raises(ValueError, match="stop_token_ids"):
        Config(stop_token_ids=bad)
