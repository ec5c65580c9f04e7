"""Reward and credit checks R401-R410 (lessons on credit assignment (“What one outcome reward provides” to “Potential-based reward shaping”)) against mutated synthetic logs.

Each mutation breaks one identity and keeps the others: after changing shaping or potentials
the tests re-derive td_residual and discounted_return from the recorded values (`rederive`),
so that only the intended relation is false.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from checkhelp import audit, rows
from checkhelp import loud as blocking

import rollout_audit as ra

R_CODES = {f"R4{i:02d}" for i in range(1, 11)}


def pick(trajs, *, stop=None, min_turns=1, n=1):
    out = [t for t in trajs if (stop is None or t["stop_reason"] in stop) and len(t["turns"]) >= min_turns]
    assert len(out) >= n
    return out[:n]


def rederive(t):
    """Recompute td_residual and discounted_return from the recorded rewards, shaping and values."""
    g, turns = t["gamma"], t["turns"]
    for i, tr in enumerate(turns):
        v_next = turns[i + 1]["value"] if i + 1 < len(turns) else t["final_value"]
        tr["td_residual"] = tr["reward"] + tr.get("shaping", 0.0) + g * v_next - tr["value"]
    t["discounted_return"] = sum(g**i * (tr["reward"] + tr.get("shaping", 0.0)) for i, tr in enumerate(turns))


def drop_turn_fields(trajs, *names):
    for t in trajs:
        for tr in t["turns"]:
            for n in names:
                del tr[n]


def test_compliant_log_is_silent_and_every_check_runs(records):
    rep = audit(*records, first_visit_components=["outcome"])
    assert rep.ok and not blocking(rep)
    assert not R_CODES & set(rep.not_run), rep.not_run


# ---------------------------------------------------------------- R401


def test_r401_components_do_not_sum(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=3)
    a["turns"][1]["reward_components"] = [("outcome", 0.0), ("progress", 0.25)]
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R401"}
    f = rows(rep, "R401")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]] and f["turn"].to_list() == [1]
    assert f["message"][0] == "reward_components (outcome, progress) sum to 0.25, expected the turn reward 0"


def test_r401_nan_component_and_tolerance(records):
    trajs, ups = records
    a, b = pick(trajs, min_turns=2, n=2)
    a["turns"][0]["reward_components"] = [("outcome", float("nan"))]
    b["turns"][0]["reward_components"] = [("outcome", 0.0), ("progress", 5e-5)]  # within atol 1e-4
    rep = audit(trajs, ups)
    assert rows(rep, "R401")["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert "sum to NaN" in rows(rep, "R401")["message"][0]


def test_r401_not_run_without_components(records):
    trajs, ups = records
    drop_turn_fields(trajs, "reward_components")
    rep = audit(trajs, ups)
    assert "turns.reward_components" in rep.not_run["R401"] and "R408" in rep.not_run
    assert not blocking(rep)


# ---------------------------------------------------------------- R402 R403 R404 R405


def test_r402_shaping_not_a_potential_difference(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=3)
    g = a["gamma"]
    # +x on turn 0 and -x/γ on turn 1: every turn but those two is a potential difference
    # and the discounted sum still telescopes (R404 silent).
    a["turns"][0]["shaping"] += 0.1
    a["turns"][1]["shaping"] -= 0.1 / g
    rederive(a)
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R402"}
    f = rows(rep, "R402")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]] * 2 and f["turn"].to_list() == [0, 1]
    assert "expected γΦ(s_t+1) − Φ(s_t) = 0.99·" in f["message"][0]


def test_r402_gamma_defaults_to_one_when_absent(records):
    trajs, ups = records
    for t in trajs:
        del t["gamma"]
    rep = audit(trajs, ups, select=["R402"])
    assert rep.codes() == {"R402"}  # synth shapes with γ = 0.99; without a gamma column the audit assumes 1.0
    assert "R402" not in rep.not_run


def test_r403_potential_chain_broken(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=3)
    g = a["gamma"]
    tr = a["turns"][2]
    tr["potential_before"] += 0.2  # Φ(s_2) recorded twice, differently
    tr["shaping"] = g * tr["potential_after"] - tr["potential_before"]  # R402 still holds
    rederive(a)
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R403", "R404"}  # a broken chain cannot telescope
    f = rows(rep, "R403")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]] and f["turn"].to_list() == [2]
    assert "differs from potential_after" in f["message"][0] and "of turn 1" in f["message"][0]
    assert rows(rep, "R404")["trajectory_id"].to_list() == [a["trajectory_id"]]


def test_r404_drift_below_per_turn_tolerance_accumulates(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=5)
    for tr in a["turns"]:
        tr["shaping"] += 9e-5  # each turn within atol = 1e-4, the sum is not
    rederive(a)
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R404"}
    f = rows(rep, "R404")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]] and f["turn"].to_list() == [None]
    assert f"over {len(a['turns'])} turns" in f["message"][0]


def test_r405_terminal_potential_non_zero(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"success", "failure"}, min_turns=2)
    (b,) = pick(trajs, stop={"max_turns"})
    g = a["gamma"]
    last = a["turns"][-1]
    last["potential_after"] = 0.5  # a proper potential difference, but a paid terminal bonus
    last["shaping"] = g * 0.5 - last["potential_before"]
    rederive(a)
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R405"}
    f = rows(rep, "R405")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert f["turn"].to_list() == [len(a["turns"]) - 1]
    assert b["turns"][-1]["potential_after"] != 0  # truncated episodes keep their potential


def test_shaping_checks_not_run_without_potentials(records):
    trajs, ups = records
    drop_turn_fields(trajs, "potential_before", "potential_after")
    rep = audit(trajs, ups)
    for code in ("R402", "R403", "R404", "R405"):
        assert "potential" in rep.not_run[code], code
    assert not blocking(rep)


# ---------------------------------------------------------------- R406


def test_r406_recorded_td_residual_differs(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=3)
    a["turns"][1]["td_residual"] += 0.3
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R406"}
    f = rows(rep, "R406")  # the turn, not also the sum
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]] and f["turn"].to_list() == [1]
    assert f["message"][0].startswith("td_residual ")


def test_r406_terminal_value_zeroed_on_a_truncated_episode(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"max_turns"})
    assert a["final_value"] != 0
    a["final_value"] = 0.0  # the producer's δ bootstrapped from V(h_T), the log says 0
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R406"}
    f = rows(rep, "R406")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert f["turn"].to_list() == [len(a["turns"]) - 1]


def test_r406_sum_reported_when_no_single_turn_explains_it(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=5)
    for tr in a["turns"]:
        tr["td_residual"] += 9e-5
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R406"}
    f = rows(rep, "R406")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]] and f["turn"].to_list() == [None]
    assert f["message"][0].startswith("Σ γ^t td_residual_t")


def test_r406_not_run_without_values(records):
    trajs, ups = records
    drop_turn_fields(trajs, "value")
    rep = audit(trajs, ups)
    assert "turns.value" in rep.not_run["R406"]
    assert not blocking(rep)


# ---------------------------------------------------------------- R407


def test_r407_discounted_return_differs(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=2)
    a["discounted_return"] = sum(tr["reward"] + tr["shaping"] for tr in a["turns"])  # γ forgotten
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R407"}
    f = rows(rep, "R407")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]]
    assert "expected Σ γ^t (reward_t + shaping_t)" in f["message"][0]


def test_r407_shaping_counts_as_zero_when_absent(records):
    trajs, ups = records
    for t in trajs:
        for tr in t["turns"]:
            del tr["shaping"]
        rederive(t)  # R406 also takes shaping as 0 when absent
    rep = audit(trajs, ups)
    assert "R407" not in rep.not_run and not blocking(rep)


def test_r407_reads_gamma_when_selected_alone(records):
    rep = audit(*records, select=["R407"])
    assert not rep.codes()


def test_r407_not_run_without_the_column(records):
    trajs, ups = records
    for t in trajs:
        del t["discounted_return"]
    rep = audit(trajs, ups)
    assert "discounted_return" in rep.not_run["R407"]
    assert not blocking(rep)


# ---------------------------------------------------------------- R408


def test_r408_first_visit_component_paid_twice(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=4)
    for i in (1, 3):  # paid twice; a step cost keeps the turn reward unchanged
        a["turns"][i]["reward_components"] = [
            ("outcome", a["turns"][i]["reward"]),
            ("key_picked", 0.1),
            ("step_cost", -0.1),
        ]
    rep = audit(trajs, ups, first_visit_components=["key_picked"])
    assert blocking(rep) == {"R408"}
    f = rows(rep, "R408")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]] and f["turn"].to_list() == [3]
    assert f["message"][0] == "first-visit component 'key_picked' paid on 2 turns (1, 3), expected at most once"
    # not configured as first-visit: nothing to say
    assert not blocking(audit(trajs, ups, first_visit_components=["other"]))
    assert not blocking(audit(trajs, ups))


# ---------------------------------------------------------------- R409


def test_r409_loop_of_the_same_action(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=5)
    same = json.dumps({"action": "inspect"})
    for tr in a["turns"][1:5]:
        tr["parsed_action"] = same
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R409"} and rep.codes("warning") == {"R409"} and rep.ok
    f = rows(rep, "R409")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]] and f["turn"].to_list() == [1]
    assert f["message"][0] == f"action {same} repeated 4 times in a row (turns 1–4); loop_length is 4"
    assert not blocking(audit(trajs, ups, loop_length=5))


def test_r409_null_action_breaks_the_run(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=5)
    same = json.dumps({"action": "inspect"})
    for tr in a["turns"][:5]:
        tr["parsed_action"] = same
    a["turns"][2]["parsed_action"] = None
    assert not blocking(audit(trajs, ups))


def test_r409_not_run_without_parsed_action(records):
    trajs, ups = records
    drop_turn_fields(trajs, "parsed_action")
    rep = audit(trajs, ups)
    assert "turns.parsed_action" in rep.not_run["R409"]


# ---------------------------------------------------------------- R410


def test_r410_monotone_success_below_failure(records):
    trajs, ups = records
    task = "task1"
    s = next(t for t in trajs if t["task_id"] == task and t["stop_reason"] == "success")
    f = next(t for t in trajs if t["task_id"] == task and t["stop_reason"] == "failure")
    s["verifier_success"], f["verifier_success"] = False, True  # verdicts swapped, rewards kept
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R410"}
    got = dict(zip(*rows(rep, "R410").select("trajectory_id", "message").to_dict(as_series=False).values()))
    assert set(got) == {s["trajectory_id"], f["trajectory_id"]}
    assert got[f["trajectory_id"]].startswith(f"verified success scores 0, below verified failure {s['trajectory_id']}")
    assert got[s["trajectory_id"]].startswith(f"verified failure scores 1, above verified success {f['trajectory_id']}")


def test_r410_binary_rule(records):
    trajs, ups = records
    assert not blocking(audit(trajs, ups, reward_rule="binary"))
    s = next(t for t in trajs if t["stop_reason"] == "success")
    s["verifier_success"] = False  # monotone: a failure scoring like the successes is allowed
    assert "R410" not in blocking(audit(trajs, ups))
    rep = audit(trajs, ups, reward_rule="binary")
    assert blocking(rep) == {"R410"}
    assert rows(rep, "R410")["trajectory_id"].to_list() == [s["trajectory_id"]]
    assert "expected 0 (reward_rule 'binary')" in rows(rep, "R410")["message"][0]


def test_r410_ignores_excluded_episodes_and_needs_the_verdict(records):
    trajs, ups = records
    tr = next(t for t in trajs if t["truncated"])
    tr["verifier_success"] = True  # reward null: not compared
    assert "R410" not in blocking(audit(trajs, ups))
    for t in trajs:
        del t["verifier_success"]
    rep = audit(trajs, ups)
    assert "verifier_success" in rep.not_run["R410"]


@pytest.mark.parametrize("parts", [1, 3])
def test_r410_same_result_from_files(tmp_path, records, parts):
    from conftest import write_log

    trajs, ups = records
    s = next(t for t in trajs if t["task_id"] == "task2" and t["stop_reason"] == "success")
    f = next(t for t in trajs if t["task_id"] == "task2" and t["stop_reason"] == "failure")
    s["verifier_success"], f["verifier_success"] = False, True
    rep = ra.audit(write_log(tmp_path / "log", trajs, ups, parts=parts))
    assert blocking(rep) == {"R410"}
    assert sorted(rows(rep, "R410")["trajectory_id"]) == sorted([s["trajectory_id"], f["trajectory_id"]])
    assert all(x.endswith(".parquet") for x in rows(rep, "R410")["file"])


# ---------------------------------------------------------------- R411-R413 (contract 1.2 evidence)


def evidenced(records):
    from rollout_audit.synth import record_loss_evidence

    trajs, ups = records
    record_loss_evidence(trajs, ups)
    return trajs, ups


def rewarded(trajs):
    return next(t for t in trajs if t["reward"] and len(t["turns"]) >= 2)


def policy_positions(t):
    return [i for i, s in enumerate(t["token_source"]) if s == 2]


def returns_to_go(t, over):
    acc, out = 0.0, [0.0] * len(t["token_ids"])
    for i in reversed(over):
        acc += t["token_reward"][i] - t["token_kl"][i]
        out[i] = acc
    return out


def test_r411_r413_silent_on_compliant_evidence_and_not_run_without_it(records):
    rep = audit(*evidenced(records))
    assert not blocking(rep) and not {"R411", "R412", "R413"} & set(rep.not_run)
    plain = audit(*make_plain(records))
    assert {"R411", "R412", "R413"} <= set(plain.not_run)


def make_plain(records):
    trajs, ups = records
    return [{k: v for k, v in t.items() if not k.startswith("token_r") and k != "token_kl"} for t in trajs], ups


def test_r411_reward_on_the_token_after_the_last_action(records):
    trajs, ups = evidenced(records)
    t = rewarded(trajs)
    last = policy_positions(t)[-1]
    t["token_reward"][last], t["token_reward"][last + 1] = 0.0, t["reward"]
    t["token_returns"] = returns_to_go(t, range(len(t["token_ids"])))
    rep = audit(trajs, ups)
    f = rows(rep, "R411")
    assert blocking(rep) == {"R411", "R413"} and f["trajectory_id"].to_list() == [t["trajectory_id"]]
    assert f["position"][0] == last + 1 and "a template token the policy did not sample" in f["message"][0]


def test_r411_mid_turn_and_lost_rewards_and_a_list_of_another_length(records):
    trajs, ups = evidenced(records)
    t = rewarded(trajs)
    first_turn = [i for i in policy_positions(t) if t["token_turn"][i] == 0]
    t["token_reward"] = [0.0] * len(t["token_ids"])
    if len(first_turn) >= 2:
        t["token_reward"][first_turn[0]] = 0.5
    other = next(o for o in trajs if o["reward"] and o is not t)
    other["token_reward"] = [0.0] * len(other["token_ids"])
    third = next(o for o in trajs if o is not t and o is not other)
    third["token_reward"] = third["token_reward"][:-1]
    f = rows(audit(trajs, ups, select=["R411"]), "R411")
    msgs = dict(zip(f["trajectory_id"].to_list(), f["message"].to_list()))
    if len(first_turn) >= 2:
        assert "a policy token that is not the last of its turn" in msgs[t["trajectory_id"]]
    assert "placed on no token" in msgs[other["trajectory_id"]]
    assert "token_reward has" in msgs[third["trajectory_id"]] and "it is not read" in msgs[third["trajectory_id"]]


def test_r412_r413_kl_of_tool_tokens_accumulated_into_the_returns(records):
    trajs, ups = evidenced(records)
    t = rewarded(trajs)
    t["token_kl"] = [k if s == 2 else 0.02 for s, k in zip(t["token_source"], t["token_kl"])]
    t["token_returns"] = returns_to_go(t, range(len(t["token_ids"])))
    rep = audit(trajs, ups)
    assert blocking(rep) == {"R412", "R413"}
    assert "KL penalty on" in rows(rep, "R412")["message"][0]
    assert "the sum over every token" in rows(rep, "R413")["message"][0]


def test_r413_returns_restarted_at_each_turn(records):
    trajs, ups = evidenced(records)
    t = rewarded(trajs)
    pol = policy_positions(t)
    for k in set(t["token_turn"][i] for i in pol):
        part = returns_to_go(t, [i for i in pol if t["token_turn"][i] == k])
        for i in pol:
            if t["token_turn"][i] == k:
                t["token_returns"][i] = part[i]
    f = rows(audit(trajs, ups), "R413")
    assert f["trajectory_id"].to_list() == [t["trajectory_id"]] and "the sum over every token" not in f["message"][0]


# ---------------------------------------------------------------- exact messages, one trajectory among compliant ones


def flat(t, gamma, **fields):
    """Set the trajectory's gamma and every turn's `fields` (a compliant base to break one value of)."""
    t["gamma"] = gamma
    for tr in t["turns"]:
        tr.update(fields)


def message(trajs, ups, code):
    f = rows(audit(trajs, ups, select=[code]), code)
    return f.select("trajectory_id", "turn", "message").rows()


def test_r402_to_r405_messages(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"success", "failure"}, min_turns=3)
    tid = a["trajectory_id"]
    flat(a, 0.5, shaping=0.0, potential_before=0.0, potential_after=0.0)
    a["turns"][0]["shaping"] = 0.5
    assert message(trajs, ups, "R402") == [(tid, 0, "shaping 0.5, expected γΦ(s_t+1) − Φ(s_t) = 0.5·0 − 0 = 0")]
    n = len(a["turns"])
    expected = f"Σ γ^t shaping_t over {n} turns = 0.5, expected −Φ(s_0) + γ^T Φ(s_T) = 0"
    assert message(trajs, ups, "R404") == [(tid, None, expected)]
    a["turns"][0]["shaping"] = 0.0
    a["turns"][1]["potential_after"] = 1.0
    assert message(trajs, ups, "R403") == [(tid, 2, "potential_before 0 differs from potential_after 1 of turn 1")]
    a["turns"][-1]["potential_after"] = 0.25
    expected = "terminated episode ends with potential_after 0.25, expected 0 at a terminal state"
    assert message(trajs, ups, "R405") == [(tid, n - 1, expected)]


def test_r406_r407_messages(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=4)
    tid = a["trajectory_id"]
    flat(a, 1.0, reward=0.0, shaping=0.0, value=0.0, td_residual=0.0)
    a["final_value"] = 0.0
    a["turns"][1]["td_residual"] = 0.25
    expected = "td_residual 0.25, expected r' + γV(h_t+1) − V(h_t) = 0 + 1·0 − 0 = 0"
    assert message(trajs, ups, "R406") == [(tid, 1, expected)]
    flat(a, 0.5, reward=1.0, shaping=0.0)
    a["discounted_return"] = 9.0
    total = sum(0.5**i for i in range(len(a["turns"])))
    expected = f"discounted_return 9, expected Σ γ^t (reward_t + shaping_t) = {total}"
    assert message(trajs, ups, "R407") == [(tid, None, expected)]


def test_r406_sum_message(records):
    trajs, ups = records
    (a,) = pick(trajs, min_turns=4)
    flat(a, 1.0, reward=0.0, shaping=0.0, value=0.0, td_residual=0.0)
    a["final_value"] = 0.0
    for tr in a["turns"][:4]:
        tr["td_residual"] = 5e-5  # each within atol = 1e-4, the sum is not
    expected = "Σ γ^t td_residual_t = 0.0002, expected G_0 − V(h_0) + γ^T V(h_T) = 0"
    assert message(trajs, ups, "R406") == [(a["trajectory_id"], None, expected)]


# ---------------------------------------------------------------- R414: the overlong penalty


def test_r414_overlong_penalty_from_policy_tokens(records):
    from rollout_audit.faults import FAULTS, apply

    trajs, ups = records
    # the reference agent's budget (48): longer synthetic episodes fire T306 too, so only R414 is run
    cfg = {**FAULTS["overlong_penalty_counts_tool_tokens"].config, "select": ["R414"]}
    (t2, u2), touched = apply("overlong_penalty_counts_tool_tokens", trajs, ups)
    assert "R414" in audit(t2, u2).not_run  # the budget, buffer and factor are not configured
    f = rows(audit(t2, u2, **cfg), "R414")
    assert blocking(audit(t2, u2, **cfg)) == {"R414"} and f["trajectory_id"].to_list() == touched
    assert "policy tokens" in f["message"][0] and "expected" in f["message"][0]
    fixed = next(t for t in t2 if t["trajectory_id"] == touched[0])
    n = fixed["token_source"].count(2)
    cut, buf = cfg["max_response_tokens"], cfg["overlong_buffer"]
    fixed["overlong_penalty"] = min(0.0, -(n - (cut - buf)) / buf)
    assert not blocking(audit(t2, u2, **cfg))
    assert "R414" in audit(trajs, ups, **cfg).not_run  # no penalty recorded


# ---------------------------------------------------------------- R415 (preview)


def test_r415_terminated_episode_with_a_non_zero_final_value(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"success", "failure"}, min_turns=2)
    (b,) = pick([t for t in trajs if t["truncated"] and t["final_value"]], n=1)
    a["final_value"] = 0.5
    rederive(a)  # the TD residuals bootstrap from the wrong V(h_T) consistently: R406 stays silent
    rep = audit(trajs, ups, preview=True)
    assert blocking(rep) == {"R415"}
    f = rows(rep, "R415")
    assert f["trajectory_id"].to_list() == [a["trajectory_id"]]  # truncated episodes keep theirs
    assert f["message"][0] == (
        f"terminated episode (stop_reason {a['stop_reason']}) has final_value 0.5, expected 0: "
        "a terminal state has no value to bootstrap from"
    )
    assert b["final_value"] != 0


def test_r415_nan_is_reported_null_is_not_compared(records):
    trajs, ups = records
    a, c = pick(trajs, stop={"success", "failure"}, n=2)
    a["final_value"], c["final_value"] = float("nan"), None
    rep = audit(trajs, ups, preview=True, select=["R415"])
    assert rows(rep, "R415")["trajectory_id"].to_list() == [a["trajectory_id"]]


def test_r415_runs_only_in_preview_and_not_without_final_value(records):
    trajs, ups = records
    (a,) = pick(trajs, stop={"success"})
    a["final_value"] = 0.5
    assert "R415" not in audit(trajs, ups).codes()
    for t in trajs:
        del t["final_value"]
    assert "final_value" in audit(trajs, ups, preview=True).not_run["R415"]


# ---------------------------------------------------------------- R416: GAE over the trainable tokens


def gae_log(records):
    """The synthetic log with a compliant critic's evidence (contract 1.4): values on every token, λ 0.95,
    GAE's targets over the trainable tokens."""
    from rollout_audit.synth import record_gae_evidence, record_loss_evidence

    trajs, ups = records
    record_loss_evidence(trajs, ups)
    record_gae_evidence(trajs)
    return trajs, ups


def test_discounted_to_go_is_the_backward_recursion_per_segment():
    """The doubling scan against the recursion it vectorises, on segments of 1 to 300 elements with
    factors in [0, 1] (0 ends a segment), and a NaN in one segment that stays there."""
    from rollout_audit.checks.rewards import discounted_to_go

    rng = np.random.default_rng(3)
    lens = rng.integers(1, 300, 40)
    x, c = rng.normal(size=lens.sum()), rng.uniform(0.0, 1.0, lens.sum())
    ends = np.cumsum(lens) - 1
    c[ends] = 0.0
    x[ends[5]] = np.nan  # the last element of segment 6: the recursion carries it over that segment only
    expected, acc = np.empty_like(x), 0.0
    for i in reversed(range(x.size)):
        acc = x[i] + c[i] * acc
        expected[i] = acc
    got = discounted_to_go(x, c)
    seg = np.r_[ends[4] + 1 : ends[5] + 1]
    assert np.isnan(got[seg]).all() and not np.isnan(np.delete(got, seg)).any()
    keep = ~np.isnan(expected)
    assert np.allclose(got[keep], expected[keep], rtol=1e-9, atol=1e-12)


def test_r416_is_silent_on_a_compliant_critic_and_names_the_masked_value_it_bootstrapped_from(records):
    from rollout_audit.synth import gae_value_targets

    trajs, ups = gae_log(records)
    assert not blocking(audit(trajs, ups, preview=True))
    t = next(t for t in trajs if t["token_source"].count(3) and len(t["turns"]) >= 2)
    t["token_value_targets"] = gae_value_targets(t, every_position=True)
    rep = audit(trajs, ups, preview=True)
    assert blocking(rep) == {"R416"}
    (f,) = rows(rep, "R416").iter_rows(named=True)
    mask = t["loss_mask"]
    last = max(i for i in range(len(mask) - 1) if mask[i] and not mask[i + 1])  # before the last masked span
    nxt = next((i for i in range(last + 1, len(mask)) if mask[i]), None)
    assert (f["trajectory_id"], f["position"], f["turn"]) == (t["trajectory_id"], last, t["token_turn"][last])
    boot = (
        f"V = {t['token_values'][nxt]:g} of the next trainable token, position {nxt}"
        if nxt is not None
        else f"V = {t['final_value'] or 0:g} after the last trainable token"
    )
    assert f"(it bootstraps from {boot})" in f["message"], f["message"]
    src = {3: "observation", 4: "template"}[t["token_source"][last + 1]]
    assert f["message"].endswith(
        f"it is GAE over every position, which bootstraps from V = {t['token_values'][last + 1]:g} at position "
        f"{last + 1}, a masked {src} token"
    ), f["message"]


def test_r416_on_rolls_own_example(records):
    """alibaba/ROLL#447's triggering example: response_mask [1, 1, 0], rewards [0, 1, 0], values
    [0, 0, 100], γ 1, λ 0.95. ROLL's returns [5.7, 6.0] bootstrap from the masked 100; GAE over the
    trainable tokens gives [0.95, 1.0]."""
    trajs, ups = gae_log(records)
    t = trajs[0]
    n = len(t["token_ids"])
    mask = [False] * (n - 3) + [True, True, False]
    t.update(
        loss_mask=mask,
        token_source=t["token_source"][:-3] + [2, 2, 4],
        behavior_logprobs=t["behavior_logprobs"][:-3] + [-0.5, -0.5, None],
        token_reward=[0.0] * (n - 2) + [1.0, 0.0],
        token_kl=[0.0] * n,
        token_values=[0.0] * (n - 1) + [100.0],
        gamma=1.0,
        gae_lambda=0.95,
        final_value=None,
    )
    t["token_value_targets"] = [0.0] * (n - 3) + [0.95, 1.0, 0.0]
    assert rows(audit(trajs, ups, preview=True, select=["R416"]), "R416").is_empty()
    t["token_value_targets"] = [0.0] * (n - 3) + [5.7, 6.0, 0.0]
    (f,) = rows(audit(trajs, ups, preview=True, select=["R416"]), "R416").iter_rows(named=True)
    assert f["position"] == n - 2
    assert f["message"] == (
        "token_value_targets differ from GAE over the trainable tokens (γ 1, λ 0.95) on 2 token(s); the last is 6, "
        "expected 1 (it bootstraps from V = 0 after the last trainable token); it is GAE over every position, "
        f"which bootstraps from V = 100 at position {n - 1}, a masked template token"
    )


def test_r416_float32_targets_stay_clean_and_a_null_value_leaves_the_row_uncompared(records):
    from rollout_audit.synth import gae_value_targets

    """Targets stored in float32 (as a trainer computes them) over a long trajectory at γ = λ = 1 are
    within the tolerance; a trainable token without a value makes its row uncompared, not a finding."""
    trajs, ups = gae_log(records)
    for t in trajs:
        t["gamma"], t["gae_lambda"] = 1.0, 1.0
        t["token_values"] = [v * 50 for v in t["token_values"]]
        t["token_value_targets"] = [float(np.float32(x)) for x in gae_value_targets(t)]
    assert rows(audit(trajs, ups, preview=True, select=["R416"]), "R416").is_empty()
    t = trajs[1]
    t["token_value_targets"] = [x + 1.0 for x in t["token_value_targets"]]
    t["token_values"][t["loss_mask"].index(True)] = None
    assert rows(audit(trajs, ups, preview=True, select=["R416"]), "R416").is_empty()


def test_r416_runs_by_default_and_not_without_values(records):
    trajs, ups = gae_log(records)
    trajs[0]["token_value_targets"] = [x + 1.0 for x in trajs[0]["token_value_targets"]]
    assert "R416" in audit(trajs, ups).codes()
    for t in trajs:
        del t["token_values"]
    assert "token_values" in audit(trajs, ups).not_run["R416"]


# ---------------------------------------------------------------- R417 (preview): step rewards overwritten


def raw_rewards(trajs):
    for t in trajs:
        for tr in t["turns"]:
            tr["raw_reward"] = tr["reward"]


def test_r417_step_reward_replaced_by_the_normalised_terminal_reward(records):
    trajs, ups = records
    raw_rewards(trajs)
    assert not blocking(audit(trajs, ups, preview=True))
    (t,) = pick(trajs, stop={"success"}, min_turns=3)
    t["turns"][1]["raw_reward"] = 0.25
    t["turns"][1]["reward_components"] = [("outcome", 0.0), ("progress", 0.25)]  # R401 sums to the raw reward
    for tr in t["turns"]:
        tr["reward"] = 0.5
    rederive(t)
    rep = audit(trajs, ups, preview=True)
    assert blocking(rep) == {"R417"}, rep.render()
    (f,) = rows(rep, "R417").iter_rows(named=True)
    assert (f["trajectory_id"], f["turn"]) == (t["trajectory_id"], 1)
    assert f["message"] == (
        f"every one of the {len(t['turns'])} turns trains reward 0.5, the last turn's; 1 turn(s) lose a step "
        "reward, the first this one: raw reward 0.25 (not 0, nor the raw terminal reward 1 discounted back to it)"
    )


def test_r417_broadcasting_a_discounted_outcome_is_no_lost_step_reward(records):
    """AReaL's "broadcast" is right for an outcome-only rollout whose workflow discounted the outcome
    back over its turns: raw rewards γ^(T-1-t)·R, and the normalised value trained on every turn."""
    trajs, ups = records
    raw_rewards(trajs)
    (t,) = pick(trajs, stop={"success"}, min_turns=3)
    g, T = t["gamma"], len(t["turns"])
    for k, tr in enumerate(t["turns"]):
        tr["raw_reward"] = g ** (T - 1 - k)
        tr["reward_components"] = [("outcome", g ** (T - 1 - k))]
        tr["reward"] = 0.5
    rederive(t)
    assert not blocking(audit(trajs, ups, preview=True))


def test_r417_runs_only_in_preview_and_not_without_raw_rewards(records):
    trajs, ups = records
    assert "turns.raw_reward" in audit(trajs, ups, preview=True).not_run["R417"]
    assert "R417" not in audit(trajs, ups).not_run


def test_r401_sums_the_components_to_the_raw_reward_when_recorded(records):
    """A normalised turn reward beside the raw one it was paid: the components add up to the raw one."""
    trajs, ups = records
    raw_rewards(trajs)
    (t,) = pick(trajs, stop={"success"})
    t["turns"][-1]["reward"] = 0.7071
    rederive(t)
    assert "R401" not in audit(trajs, ups).codes()
    t["turns"][-1]["raw_reward"] = 0.9
    assert rows(audit(trajs, ups), "R401")["trajectory_id"].to_list() == [t["trajectory_id"]]
