"""slime adapter: the compliant fixture audits clean with the not-run list docs/frameworks/slime.md
predicts; an OpenRLHF-style episode cut at the response budget but COMPLETED is T306; partial
rollouts (several weight_versions per turn) audit clean; a removed sample is out of the loss; the
per-rollout denominators are recomputed (U601)."""

from __future__ import annotations

import json

import pytest
from adapterhelp import (
    CONTEXT,
    audit,
    convert_then_check_equals_check_from,
    documented_not_run,
    fixture,
    missing_field_exits_2,
)

import rollout_audit as ra
from rollout_audit.adapters import load
from rollout_audit.adapters.base import read_dump
from rollout_audit.adapters.slime import _versions
from rollout_audit.contract.config import Config

BUDGET = 76  # --rollout-max-response-len of the fixtures


def test_compliant_is_clean_and_not_run_as_documented():
    rep = audit("slime", "compliant", max_response_tokens=BUDGET)
    assert rep.findings.is_empty(), rep.render()
    assert set(rep.not_run) == documented_not_run("slime")


def test_cut_at_the_budget_but_completed_is_t306():
    rep = audit("slime", "openrlhf_cut_not_truncated", max_response_tokens=BUDGET)
    assert rep.findings.select("code", "trajectory_id").rows() == [("T306", "3")]


def test_convert_then_check_equals_check_from(tmp_path):
    config = tmp_path / "audit.toml"
    config.write_text(f"[tool.rollout-audit]\nmax_response_tokens = {BUDGET}\n")
    found = convert_then_check_equals_check_from("slime", "openrlhf_cut_not_truncated", tmp_path, "--config", config)
    assert [(f[0], f[1]) for f in found] == [("T306", "3")]


def test_missing_status_exits_2_naming_it(tmp_path):
    line = missing_field_exits_2("slime", "compliant", "status", tmp_path)
    assert "index 1" in line


@pytest.mark.parametrize(
    ("field", "value"), [("tokens", [[1]]), ("response_length", "x"), ("weight_versions", 5), ("loss_mask", "11")]
)
def test_malformed_field_exits_2_naming_it(tmp_path, field, value):
    missing_field_exits_2("slime", "compliant", field, tmp_path, value)


def _turns(case: str, **context: str) -> dict[str, list[dict]]:
    table = load("slime").to_contract(read_dump(fixture("slime", case)), **CONTEXT, **context)
    return {r["trajectory_id"]: r["turns"] for r in table.select(["trajectory_id", "turns"]).to_pylist()}


def test_partial_rollout_resumed_under_new_weights_is_a_turn_of_its_own():
    """A sample resumed at version 5 after 3 tokens of version 4: the resumed call is a turn of its own
    with its own version, so the episode is sampled by two versions (P504, info) and nothing else fires."""
    rep = audit("slime", "partial_rollout", max_response_tokens=BUDGET)
    assert rep.findings.select("code", "severity", "trajectory_id").rows() == [("P504", "info", "1")], rep.render()
    turns = _turns("partial_rollout")
    assert [t["policy_version"] for t in turns["1"]] == [4, 5] and [t["policy_version"] for t in turns["0"]] == [5]


def test_partial_rollout_with_the_stale_prefix_masked_keeps_it_as_policy_tokens():
    table = load("slime").to_contract(
        read_dump(fixture("slime", "partial_rollout_mask_offpolicy")), **CONTEXT, mask_offpolicy_in_partial_rollout="1"
    )
    rep = ra.audit_tables(table, config=Config(max_response_tokens=BUDGET))
    assert rep.codes("error") == set() and rep.codes() == {"M102", "P504"}  # the masked stale prefix, as slime masks it
    row = table.slice(1, 1).to_pylist()[0]
    resp = row["token_source"][-6:], row["loss_mask"][-6:]
    assert resp == ([2] * 6, [False] * 3 + [True] * 3)


@pytest.mark.parametrize(
    ("calls", "turns", "expected"),
    [
        (["3", "3", "3"], 3, [3, 3, 3]),  # one call per turn
        (["3", "4"], 1, [3]),  # a resumed single turn: its first call
        (["3", "3", "4"], 2, [3, 3]),  # turn 1 began at call 1 (3) or call 2 (4): the oldest, 3
        (["3", "4", "4"], 2, [3, 4]),  # either way turn 1's first call has version 4
        (["5"], 3, [5, 5, 5]),  # one version in all
        (["3", "4"], 3, [3, 3, 3]),  # fewer calls than turns: the oldest of them
        (["v1"], 1, [None]),  # not an integer: nothing to order
    ],
)
def test_versions_per_call_are_placed_on_turns_or_the_oldest_candidate(calls, turns, expected):
    assert _versions({"weight_versions": calls}, turns, "record") == expected


def test_removed_sample_is_out_of_the_loss_and_audits_without_error():
    """The removed sample is declared out of the loss but in its group's statistics (loss_excluded), so
    its untrained policy tokens raise no M102 and nothing else fires."""
    rep = audit("slime", "removed_sample", max_response_tokens=BUDGET)
    assert rep.codes("error") == set() and "M102" not in rep.codes(), rep.render()
    table = load("slime").to_contract(read_dump(fixture("slime", "removed_sample")), **CONTEXT)
    cols = ["trajectory_id", "loss_mask", "token_source", "loss_excluded"]
    rows = {r["trajectory_id"]: r for r in table.select(cols).to_pylist()}
    assert not any(rows["2"]["loss_mask"]) and 2 in rows["2"]["token_source"] and rows["2"]["loss_excluded"]
    assert not any(r["loss_excluded"] for k, r in rows.items() if k != "2")


def test_rollout_denominators_are_recomputed_from_the_rollout_ids(tmp_path):
    config = tmp_path / "audit.toml"
    config.write_text(f"max_response_tokens = {BUDGET}\n")
    ok = convert_then_check_equals_check_from("slime", "removed_sample", tmp_path / "a", "--config", config)
    assert "U601" not in {f[0] for f in ok}
    found = convert_then_check_equals_check_from(
        "slime", "removed_sample_in_denominator", tmp_path / "b", "--config", config
    )
    assert [f for f in found if f[0] == "U601"] == [
        (
            "U601",
            None,
            None,
            None,
            "update 5 (reduction token): loss_denominator 44 recorded, expected 22 = Σ trainable tokens over "
            "2 trajectories (recorded/expected = 2)",
        )
    ]


def _cli_check(case: str, *extra: str) -> tuple[int, dict]:
    from adapterhelp import cli, context_args

    res = cli("check", "--from", "slime", fixture("slime", case), *context_args(), *extra, "--format", "json")
    return res.exit_code, json.loads(res.stdout)


def _codes(rep: dict) -> list[tuple[str, str | None]]:
    return [(f["code"], f["trajectory_id"]) for f in rep["findings"] if f["severity"] == "error"]


def test_an_ambiguous_resumed_turn_gets_the_oldest_candidate_version_not_p501():
    """weight_versions ["4", "4", "5", "5"] for three turns and no engine_calls: turn 1 began at version 4 or 5;
    4 is recorded (it never understates staleness), where the version used to be nulled (P501)."""
    code, rep = _cli_check("partial_rollout_multi_turn")
    assert code == 0 and _codes(rep) == [], rep["findings"]
    assert [t["policy_version"] for t in _turns("partial_rollout_multi_turn")["2"]] == [4, 4, 5]


def test_without_engine_calls_provenance_is_not_recorded_and_m101_m102_do_not_run():
    code, rep = _cli_check("partial_rollout_multi_turn")
    why = {c["code"]: c["reason"] for c in rep["not_run"]}
    assert "engine_calls" in why["M101"] and "engine_calls" in why["M102"]
    table = load("slime").to_contract(read_dump(fixture("slime", "partial_rollout_multi_turn")), **CONTEXT)
    assert "token_source" not in table.column_names


def test_a_mask_that_trains_what_the_engine_did_not_sample_is_m101():
    recs = [json.loads(x) for x in fixture("slime", "compliant").read_text().splitlines()]
    recs[3]["loss_mask"] = [1] * len(recs[3]["loss_mask"])  # tool output in the loss
    table = load("slime").to_contract(recs, **CONTEXT)
    rep = ra.audit_tables(table, config=Config(max_response_tokens=BUDGET))
    assert rep.findings.select("code", "trajectory_id").rows() == [("M101", "3")]


def test_train_data_record_gives_the_update_checks_their_evidence():
    """The extended train data record (normalised rewards, loss masks, arguments): U603, U607 and U608
    run on slime's own values and hold on a compliant batch."""
    code, rep = _cli_check("removed_sample")
    assert code == 0 and _codes(rep) == [], rep["findings"]
    not_run = {c["code"] for c in rep["not_run"]}
    assert not {"U603", "U604", "U607", "U608"} & not_run
    upd = load("slime").updates(read_dump(fixture("slime", "removed_sample"))).to_pylist()
    assert {u["advantage_estimator"] for u in upd} == {"grpo"}
    assert next(u for u in upd if "2" in u["trajectory_ids"])["numerator_tokens"] == [0, 22]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("removed_sample_trained", {("U607", "2"), ("U601", None)}),
        ("failed_in_statistics", {("U608", "1")}),
        ("group_norm_over_batch", {("U603", t) for t in "01234"}),
        ("returns_kl_unmasked", {("R413", "2"), ("R413", "3")}),
    ],
)
def test_trainer_side_faults_fire_from_slimes_own_records(case, expected):
    code, rep = _cli_check(case)
    assert code == 1 and expected <= set(_codes(rep)), rep["findings"]


def test_actor_record_places_slimes_token_terms_and_audits_clean():
    """reinforce_plus_plus at gamma 1: the KL penalty on the loss-mask tokens, the reward on the last
    one, the returns as the actor computed them; R411-R413 run and hold."""
    code, rep = _cli_check("reinforce_plus_plus")
    assert code == 0 and _codes(rep) == [], rep["findings"]
    assert not {"R411", "R412", "R413"} & {c["code"] for c in rep["not_run"]}
    row = load("slime").to_contract(read_dump(fixture("slime", "reinforce_plus_plus")), **CONTEXT).to_pylist()[3]
    assert row["token_reward"][-1] == row["reward"] and sum(row["token_reward"]) == row["reward"]
    masked = [k for k, m in zip(row["token_kl"], row["loss_mask"]) if not m]
    assert not any(masked)


def test_the_masked_stale_prefix_of_a_resumed_sample_is_m102_through_the_cli(tmp_path):
    """--mask-offpolicy-in-partial-rollout zeroes the mask of tokens the engine did sample: the engine
    calls show it, so M102 warns on that prefix with no context key."""
    code, rep = _cli_check("partial_rollout_mask_offpolicy", "--config", str(_budget_config(tmp_path)))
    assert code == 0 and _codes(rep) == []
    found = sorted((f["code"], f["trajectory_id"]) for f in rep["findings"])
    assert found == [("M102", "1"), ("M102", "2"), ("P504", "1")]  # P504: info, two versions sampled sample 1


def _budget_config(tmp_path):
    path = tmp_path / "audit.toml"
    path.write_text(f"max_response_tokens = {BUDGET}\n")
    return path


@pytest.mark.parametrize(
    "case", ["compliant", "partial_rollout", "partial_rollout_multi_turn", "removed_sample", "reinforce_plus_plus"]
)
def test_every_compliant_fixture_on_the_page_audits_clean_with_its_command(case, tmp_path):
    """docs/frameworks/slime.md's command (`check --from slime DUMP --context ...`, the response budget
    configured) on each fixture it calls compliant: exit 0, no error or warning (a resumed sample
    sampled by two versions is P504, an info)."""
    code, rep = _cli_check(case, "--config", str(_budget_config(tmp_path)))
    assert code == 0 and {f["code"] for f in rep["findings"]} <= {"P504"}, rep["findings"]
    assert all(f["severity"] == "info" for f in rep["findings"])


@pytest.mark.parametrize(
    ("case", "field", "value"),
    [
        ("compliant", "metadata", {"engine_calls": 5}),
        ("compliant", "metadata", {"engine_calls": [{"response_length": 999, "tokens": [1]}]}),
        ("compliant", "metadata", {"engine_calls": [{"response_length": 0}]}),
    ],
)
def test_a_malformed_engine_call_exits_2_naming_it(case, field, value, tmp_path):
    missing_field_exits_2("slime", case, field, tmp_path, value)


@pytest.mark.parametrize(("field", "value"), [("kl", "x"), ("returns", [[1.0]]), ("sample_indices", [99, 1, 2, 3])])
def test_a_malformed_actor_record_exits_2_naming_it(field, value, tmp_path):
    from adapterhelp import cli, context_args

    recs = read_dump(fixture("slime", "reinforce_plus_plus"))
    recs[-1][field] = value
    bad = tmp_path / "dump.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = cli("check", "--from", "slime", bad, *context_args())
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    line = res.stderr.strip().splitlines()[-1]
    assert "actor record" in line and "internal error" not in line, line


# ---------------------------------------------------------------- routing replay (contract 1.3)


def _not_run(rep: dict) -> set[str]:
    return {c["code"] for c in rep["not_run"]}


def test_routed_experts_of_a_compliant_moe_run_audit_clean_with_p505_run():
    code, rep = _cli_check("compliant_moe")
    assert code == 0 and rep["findings"] == [] and "P505" not in _not_run(rep), rep
    row = load("slime").to_contract(read_dump(fixture("slime", "compliant_moe")), **CONTEXT).to_pylist()[2]
    rec = read_dump(fixture("slime", "compliant_moe"))[2]
    assert len(row["routed_experts_version"]) == len(row["token_ids"]) and row["routed_experts_version"][-1] is None
    assert row["routed_experts_version"][:-1] == [5] * (len(row["token_ids"]) - 1)
    from rollout_audit.adapters.routes import digest, expert_array

    assert row["routed_experts_sha256"] == digest(expert_array(rec["rollout_routed_experts"], "r", "w"))


def test_a_partial_rollout_keeping_the_older_routes_is_not_p505():
    """Resumed at version 5 from the rows the sample held: version 4's routes stay before its tokens."""
    code, rep = _cli_check("partial_rollout_moe")
    assert code == 0 and "P505" not in _not_run(rep) and [f["code"] for f in rep["findings"]] == ["P504"]
    row = load("slime").to_contract(read_dump(fixture("slime", "partial_rollout_moe")), **CONTEXT).to_pylist()[1]
    assert set(row["routed_experts_version"][:-1]) == {4, 5}


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("routes_resumed_duplicated", "62 entries for 33 tokens"),  # appended: more rows than tokens
        ("routes_of_resumed_weights", "routes of version 5, turn sampled at 4"),  # replaced from row 0
    ],
)
def test_routes_lost_or_duplicated_on_resume_are_p505_through_the_cli(case, words):
    code, rep = _cli_check(case)
    assert code == 1 and _codes(rep) == [("P505", "1"), ("P505", "2")], rep["findings"]
    assert all(words in f["message"] for f in rep["findings"] if f["code"] == "P505")


def test_routes_without_the_hooks_fields_give_the_digest_and_p505_not_run(tmp_path):
    recs = read_dump(fixture("slime", "compliant_moe"))
    for r in recs:
        for c in r["metadata"]["engine_calls"]:
            del c["routed_experts_len"]
    path = tmp_path / "dump.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    from adapterhelp import cli, context_args

    res = cli("check", "--from", "slime", path, *context_args(), "--format", "json")
    rep = json.loads(res.stdout)
    assert res.exit_code == 0 and rep["findings"] == [] and "P505" in _not_run(rep)
    table = load("slime").to_contract(read_dump(path), **CONTEXT)
    assert "routed_experts_sha256" in table.column_names and "routed_experts_version" not in table.column_names


@pytest.mark.parametrize("value", [[[1, 2]], [[[1, -1]]], "routes", [[[1, 2]], [[3]]]])
def test_malformed_routes_exit_2_naming_them(tmp_path, value):
    from adapterhelp import cli, context_args

    recs = read_dump(fixture("slime", "compliant_moe"))
    recs[1]["rollout_routed_experts"] = value
    path = tmp_path / "dump.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = cli("check", "--from", "slime", path, *context_args())
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "rollout_routed_experts" in lines[0], res.stderr


def test_ppo_gae_over_every_response_token_is_r416_and_masked_gae_is_clean():
    """--advantage-estimator ppo: the actor record's values and returns become token_values and
    token_value_targets with --gamma and --lambd. slime 624b824's GAE runs over every response token
    (radixark/miles#1827), so the multi-turn samples' last action before a tool output bootstraps from
    that output's value: R416 on samples 2 and 3, naming it; the single-turn ones (every token
    trainable) agree. GAE over the loss-mask tokens audits clean with R416 run."""
    code, rep = _cli_check("ppo_masked_gae", "--preview")
    assert code == 0 and _codes(rep) == [], rep["findings"]
    assert "R416" in rep["summary"]["checks_run"]
    code, rep = _cli_check("ppo_gae_over_every_position", "--preview")
    assert code == 1 and set(_codes(rep)) == {("R416", "2"), ("R416", "3")}, rep["findings"]
    f = next(f for f in rep["findings"] if f["trajectory_id"] == "3")
    assert (
        f["position"] == 58 and "bootstraps from V = 0.1271 at position 59, a masked observation token" in f["message"]
    )
    row = load("slime").to_contract(read_dump(fixture("slime", "ppo_masked_gae")), **CONTEXT).to_pylist()[3]
    assert (row["gamma"], row["gae_lambda"]) == (1.0, 0.95) and row["token_reward"][-1] == row["reward"]


def test_async_ratio_on_current_weights_is_u610_from_slimes_own_arguments():
    """train_async with slime's defaults (no --use-rollout-logprobs, no --use-tis, no --keep-old-actor):
    the samples sampled one version behind are named; the same batch under --use-tis is clean. The
    reducer's divisor is not in the record: U609 is not run, with slime's reason."""
    code, rep = _cli_check("async_ratio_on_current_weights", "--preview")
    assert code == 1 and sorted(_codes(rep)) == [("U610", "2"), ("U610", "3")], rep["findings"]
    why = {c["code"]: c["reason"] for c in rep["not_run"]}
    assert "U609" in why and "loss.py:1317" in why["U609"]
    code, rep = _cli_check("compliant_async_tis", "--preview")
    assert code == 0 and _codes(rep) == [], rep["findings"]
    upd = load("slime").updates(read_dump(fixture("slime", "compliant_async_tis"))).to_pylist()
    assert {(u["ratio_anchor"], u["ratio_correction"], u["ratio_correction_cap"], u["reducer_mode"]) for u in upd} == {
        ("current", "truncated_is", 2.0, "seq_mean_step")
    }


def test_loss_settings_follow_slimes_arguments():
    from rollout_audit.adapters.base import AdapterError
    from rollout_audit.adapters.slime import loss_settings

    assert loss_settings({}, "r") == {}
    assert loss_settings({"use_rollout_logprobs": True, "use_tis": False}, "r") == {
        "ratio_anchor": "behavior",
        "ratio_correction": "none",
    }
    assert loss_settings(
        {"use_rollout_logprobs": False, "keep_old_actor": True, "calculate_per_token_loss": True}, "r"
    ) == {
        "ratio_anchor": "proximal",
        "reducer_mode": "token_mean_step",
    }
    with pytest.raises(AdapterError, match="args.use_tis"):
        loss_settings({"use_tis": "yes"}, "record 3")
