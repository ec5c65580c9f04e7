"""Log-probability checks L201-L204 and L212: each fires on its own fault, naming the trajectory,
turn and position, stays silent on a compliant log, and is not run without its inputs."""

from __future__ import annotations

import math

import polars as pl
from checkhelp import EXCLUDED, drop_turn_field, loud, only, positions

import rollout_audit as ra
from rollout_audit.contract.config import Config


def test_compliant_log_is_silent(records):
    rep = ra.audit(*records)
    assert not loud(rep), rep.render()
    for code in ("L201", "L202", "L203", "L204"):
        assert code not in rep.not_run and code in rep.summary["checks_run"]


# ---------------------------------------------------------------- L201


def test_l201_reports_each_kind_of_invalid_logprob(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    p = positions(tr, 2)
    assert len(p) >= 5
    tr["behavior_logprobs"][p[1]] = None
    tr["behavior_logprobs"][p[2]] = math.nan
    tr["behavior_logprobs"][p[3]] = -math.inf
    tr["behavior_logprobs"][p[4]] = 0.25
    f = only(ra.audit(trajs, ups), "L201")  # the turns with a bad token are not also L202
    r = f.row(0, named=True)
    assert f.height == 1 and r["trajectory_id"] == tr["trajectory_id"]
    assert r["position"] == p[1] and r["turn"] == tr["token_turn"][p[1]]
    assert r["message"].startswith(
        "4 loss-mask token(s) without a valid behaviour log-prob (missing 1, NaN 1, infinite 1, positive 1)"
    )


def test_l201_ignores_tokens_outside_the_loss(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    p = positions(tr, 2, turn=1)[0]
    tr["loss_mask"][p] = False
    tr["num_trainable_tokens"] -= 1
    tr["behavior_logprobs"][p] = math.nan
    # the turn's recorded logprob (the true sum) is not compared: not all its tokens are valid
    assert loud(ra.audit(trajs, ups)) == {"M102"}


# ---------------------------------------------------------------- L202


def test_l202_turn_logprob_differs_from_token_sum(records):
    trajs, ups = records
    tr = trajs[5]
    true = tr["turns"][2]["logprob"]
    tr["turns"][2]["logprob"] = true - 0.5
    r = only(ra.audit(trajs, ups), "L202").row(0, named=True)
    assert (r["trajectory_id"], r["turn"], r["position"]) == (tr["trajectory_id"], 2, positions(tr, 2, 2)[0])
    assert "|diff| 0.5" in r["message"]


def test_l202_tolerance_and_nan(records):
    trajs, ups = records
    tr = trajs[5]
    tr["turns"][0]["logprob"] += 0.5e-3  # within logprob_atol = 1e-3
    tr["turns"][1]["logprob"] = None  # nothing recorded: not compared
    assert not loud(ra.audit(trajs, ups))
    tr["turns"][2]["logprob"] = math.nan  # a NaN sum is flagged, not waved through (S001 also says NaN)
    rep = ra.audit(trajs, ups)
    assert loud(rep) == {"L202", "S001"}
    assert rep.findings.filter(pl.col("code") == "L202")["turn"].to_list() == [2]
    tr["turns"][2]["logprob"] = -100.0
    f = only(ra.audit(trajs, ups, config=Config(logprob_atol=1e-5)), "L202").sort("turn")
    assert f["turn"].to_list() == [0, 2]


def test_l202_not_run_without_turn_logprob(records):
    trajs, ups = records
    drop_turn_field(trajs, "logprob")
    rep = ra.audit(trajs, ups)
    assert "turns.logprob" in rep.not_run["L202"] and not loud(rep)


# ---------------------------------------------------------------- L203


def test_l203_logprob_on_non_policy_tokens(records):
    trajs, ups = records
    tr = trajs[5]
    obs = positions(tr, 3, turn=1)
    for q in obs:
        tr["behavior_logprobs"][q] = -0.7  # teacher-forced log-probs over the tool output
    tr["behavior_logprobs"][0] = -2.0  # and over the system prompt
    r = only(ra.audit(trajs, ups), "L203").row(0, named=True)
    assert r["trajectory_id"] == tr["trajectory_id"] and r["position"] == 0 and r["turn"] is None
    assert f"recorded on {len(obs) + 1} non-policy token(s) (system 1, observation {len(obs)})" in r["message"]


def test_l203_not_run_without_logprobs(records):
    trajs, ups = records
    for tr in trajs:
        del tr["behavior_logprobs"]
    rep = ra.audit(trajs, ups)
    assert {"L201", "L203"} <= set(rep.not_run) and "behavior_logprobs" in rep.not_run["L203"]
    assert not rep.codes() & {"L201", "L202", "L203"}


# ---------------------------------------------------------------- L204


def test_l204_missing_decoding_parameters(records):
    trajs, ups = records
    tr = trajs[22]
    tr["turns"][1]["temperature"] = None
    tr["turns"][4]["temperature"] = None  # missing; a NaN temperature is S001 (not a finite value)
    tr["turns"][4]["top_p"] = None
    rep = ra.audit(trajs, ups)
    f = only(rep, "L204")
    r = f.row(0, named=True)
    assert f.height == 1 and r["severity"] == "warning" and rep.ok
    assert r["trajectory_id"] == tr["trajectory_id"] and r["turn"] == 1
    assert r["message"] == (
        "temperature missing on 2 of 6 turn(s) (turns 1, 4); top_p missing on 1 of 6 turn(s) (turns 4)"
    )


def test_l204_not_run_when_a_column_is_absent(records):
    trajs, ups = records
    drop_turn_field(trajs, "top_p")
    rep = ra.audit(trajs, ups)
    assert "turns.top_p" in rep.not_run["L204"] and "L204" not in rep.codes()


# ---------------------------------------------------------------- L212


def _l212(trajs, ups, **cfg):
    return ra.audit(trajs, ups, config=Config(**cfg))


def test_l212_a_turn_sampled_at_another_temperature_than_the_trainers(records):
    trajs, ups = records
    ran = trajs[0]["turns"][0]["temperature"]
    assert not loud(_l212(trajs, ups, trainer_temperature=ran))  # every turn at the trainer's: silent
    tr = trajs[22]
    tr["turns"][2]["temperature"] = ran + 0.3  # a proxy rewrote two requests of this episode
    tr["turns"][4]["temperature"] = ran + 0.3
    f = only(_l212(trajs, ups, trainer_temperature=ran), "L212")
    r = f.row(0, named=True)
    assert f.height == 1 and r["severity"] == "error"
    assert r["trajectory_id"] == tr["trajectory_id"] and r["turn"] == 2
    assert r["message"] == (
        f"sampled at temperature {round(ran + 0.3, 6)} on 2 of 6 turn(s), the trainer recomputes at "
        f"trainer_temperature = {ran}"
    )


def test_l212_not_run_without_the_trainers_temperature(records):
    rep = _l212(*records)
    assert "trainer_temperature" in rep.not_run["L212"] and "L212" not in rep.codes()
    assert "L212" in ra.audit(*records, config=Config(trainer_temperature=1.0)).summary["checks_run"]  # stable


# ---------------------------------------------------------------- L208 (contract 1.1 placeholders)


def _placeholder(trajs, turn: int = 1) -> tuple[dict, int]:
    """Put a 0.0 log-prob on a trained policy token of `turn`, the turn's logprob following."""
    tr = trajs[EXCLUDED]
    p = positions(tr, 2, turn=turn)[0]
    tr["turns"][turn]["logprob"] -= tr["behavior_logprobs"][p]
    tr["behavior_logprobs"][p] = 0.0
    return tr, p


def test_l208_placeholder_on_a_trained_token_at_temperature_one(records):
    trajs, ups = records
    tr, p = _placeholder(trajs)
    r = only(ra.audit(trajs, ups), "L208").row(0, named=True)
    assert (r["trajectory_id"], r["position"], r["turn"]) == (tr["trajectory_id"], p, 1)
    assert r["message"].startswith("1 trainable policy token(s) with behaviour log-prob exactly 0.0")


def test_l208_silent_under_a_nucleus_greedy_or_outside_the_loss(records):
    trajs, ups = records
    tr, p = _placeholder(trajs)
    tr["turns"][1]["top_p"] = 0.9  # a nucleus of one token has probability 1
    assert "L208" not in ra.audit(trajs, ups).codes()
    tr["turns"][1]["top_p"], tr["turns"][1]["temperature"] = 1.0, 0.0  # greedy
    assert "L208" not in ra.audit(trajs, ups).codes()
    tr["turns"][1]["temperature"] = 1.0
    tr["loss_mask"][p] = False
    tr["num_trainable_tokens"] -= 1
    assert "L208" not in ra.audit(trajs, ups).codes()


def test_l208_without_provenance_reports_a_whole_turn_of_zeros_only(records, monkeypatch):
    """Without token_source: a turn whose trained log-probs are all 0.0 and at least
    PLACEHOLDER_TURN of them fires (the synthetic turns are short, so the bound is lowered to the
    turn's length); one non-zero token in the turn, a shorter turn, or a nucleus keeps it silent."""
    from rollout_audit.checks import logprobs

    trajs, ups = records
    tr = trajs[EXCLUDED]
    turn = positions(tr, 2, turn=0)
    for p in turn:
        tr["behavior_logprobs"][p] = 0.0
    tr["turns"][0].pop("logprob", None)
    for x in trajs:
        del x["token_source"]
    cfg = Config(not_recorded=["token_source"])
    monkeypatch.setattr(logprobs, "PLACEHOLDER_TURN", len(turn))
    rep = ra.audit(trajs, ups, config=cfg)  # records without token_source: S001 names the column
    assert loud(rep) == {"S001", "L208"}, rep.render()
    r = rep.findings.filter(pl.col("code") == "L208").row(0, named=True)
    assert (r["trajectory_id"], r["turn"], r["position"]) == (tr["trajectory_id"], 0, turn[0])
    assert r["message"].startswith(f"{len(turn)} trainable token(s) with behaviour log-prob exactly 0.0, every one")
    monkeypatch.setattr(logprobs, "PLACEHOLDER_TURN", len(turn) + 1)
    assert "L208" not in ra.audit(trajs, ups, config=cfg).codes()
    monkeypatch.setattr(logprobs, "PLACEHOLDER_TURN", len(turn))
    tr["turns"][0]["top_p"] = 0.9
    assert "L208" not in ra.audit(trajs, ups, config=cfg).codes()
    tr["turns"][0]["top_p"] = 1.0
    tr["behavior_logprobs"][turn[-1]] = -0.5
    assert "L208" not in ra.audit(trajs, ups, config=cfg).codes()
