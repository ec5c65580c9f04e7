"""SkyRL adapter: the compliant fixture audits clean with the not-run list docs/frameworks/skyrl.md
predicts; provenance comes from the agent loop's engine calls, so SkyRL#758 (an appended EOS with
mask 1) and SkyRL#710 (template tokens in the mask) are M101, and without engine calls M101/M102 do
not run while L208 reports a whole turn of 0.0 placeholders; step-wise rows are segments of their episode (no S002); the trainer-side records give
U603/U607/U608 their evidence and each fires on a fault built from SkyRL's own records; a dump of
several steps is not S002; the fully-async hook's step is the policy version; the generator's
truncation flags are taken as context and the policy is named; the CLI paths agree."""

from __future__ import annotations

import json

import pytest
from adapterhelp import (
    CONTEXT,
    audit,
    cli,
    context_args,
    convert_then_check_equals_check_from,
    documented_not_run,
    fixture,
    missing_field_exits_2,
    records,
)

from rollout_audit.adapters import load
from rollout_audit.adapters.base import read_dump


def test_compliant_is_clean_and_not_run_as_documented():
    rep = audit("skyrl", "compliant")
    assert rep.findings.is_empty(), rep.render()
    assert set(rep.not_run) == documented_not_run("skyrl")


def test_appended_eos_the_engine_did_not_sample_is_m101(tmp_path):
    """SkyRL#758: the EOS SkyRL appends is not among the engine's ids, so its mask 1 is M101 (its 0.0
    placeholder log-prob is not a recorded one)."""
    found = convert_then_check_equals_check_from("skyrl", "eos_appended_logprob_zero", tmp_path)
    assert [(f[0], f[1]) for f in found] == [("M101", "3/search-4_1")]


def test_trained_chat_template_tokens_are_m101_from_the_engine_ids(tmp_path):
    """SkyRL#710: a loss mask of 1 over the assistant generation prompt and the newline after
    <|im_end|>; provenance from the engine's calls, not from that mask, makes it M101."""
    found = convert_then_check_equals_check_from("skyrl", "assistant_header_trained", tmp_path)
    assert [(f[0], f[1]) for f in found] == [("M101", "3/search-4_0"), ("M101", "3/search-4_1")]
    assert "loss_mask true on 8 non-policy token(s)" in found[0][4]


def test_without_engine_calls_provenance_is_not_recorded_and_m101_m102_do_not_run(tmp_path):
    dump = tmp_path / "dump.jsonl"
    recs = records("skyrl", "assistant_header_trained")
    dump.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "engine_calls"}) + "\n" for r in recs))
    res, rep = _check(dump)
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    why = {c["code"]: c["reason"] for c in rep["not_run"]} if isinstance(rep["not_run"], list) else rep["not_run"]
    assert {"M101", "M102"} <= set(why) and "engine_calls" in str(why["M101"])
    assert "token_source" not in load("skyrl").to_contract(recs_without(recs), **CONTEXT).column_names


def recs_without(recs):
    return [{k: v for k, v in r.items() if k != "engine_calls"} for r in recs]


def test_without_engine_calls_a_turn_of_placeholder_logprobs_is_l208(tmp_path):
    """A dump without the hook's engine calls whose second turn of `3/search-4_1` kept SkyRL's 0.0
    placeholder on all 8 trained tokens: visible on what the loss mask trains, without provenance."""
    found = convert_then_check_equals_check_from("skyrl", "logprobs_lost_no_calls", tmp_path)
    prompt = len(records("skyrl", "logprobs_lost_no_calls")[3]["prompt_token_ids"])
    assert [f[:4] for f in found] == [("L208", "3/search-4_1", 1, prompt + 24)]  # the second run of the mask
    assert found[0][4].startswith("8 trainable token(s) with behaviour log-prob exactly 0.0, every one of a turn")
    res, rep = _check(fixture("skyrl", "logprobs_lost_no_calls"))
    assert [f["code"] for f in rep["findings"]] == ["L208"] and res.exit_code == 0, res.output  # a warning
    recs = records("skyrl", "logprobs_lost_no_calls")
    recs[3]["rollout_logprobs"][31] = -0.25  # 7 of the turn's 8 at 0.0: confident tokens, not a lost span
    dump = tmp_path / "seven.jsonl"
    dump.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res, rep = _check(dump)
    assert res.exit_code == 0 and rep["findings"] == [], res.output


@pytest.mark.parametrize("case", ["compliant", "eos_appended_logprob_zero", "assistant_header_trained"])
def test_without_engine_calls_l208_runs_and_a_lone_zero_is_not_reported(tmp_path, case):
    """Without provenance L208 runs; the compliant rows, SkyRL#758's one appended EOS at 0.0 and
    #710's template tokens inside a trained turn are no whole turn of placeholders: silent."""
    dump = tmp_path / "dump.jsonl"
    dump.write_text("".join(json.dumps(r) + "\n" for r in recs_without(records("skyrl", case))))
    res, rep = _check(dump)
    why = {c["code"]: c["reason"] for c in rep["not_run"]} if isinstance(rep["not_run"], list) else rep["not_run"]
    assert "L208" not in why and "M101" in why, why
    assert res.exit_code == 0 and rep["findings"] == [], res.output


def test_step_wise_rows_are_segments_of_their_episode_and_audit_clean():
    """generator.step_wise_trajectories=true: one row per turn sharing the trajectory id is one episode
    of segments (no S002), the outcome on its is_last_step row; the trainer's records give U603, U607
    and U608 their evidence."""
    res, rep = _check(fixture("skyrl", "step_wise"))
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    ran = {c["code"] for c in rep["checks"] if c.get("ran", True)} if "checks" in rep else None
    table = load("skyrl").to_contract(read_dump(fixture("skyrl", "step_wise")), **CONTEXT)
    rows = table.select(["trajectory_id", "split_from", "split_continues", "reward"]).to_pylist()
    assert rows[0] == {
        "trajectory_id": "5/gsm8k-17_0#0",
        "split_from": "5/gsm8k-17_0",
        "split_continues": True,
        "reward": None,
    }
    assert rows[1]["trajectory_id"] == "5/gsm8k-17_0#1" and rows[1]["split_continues"] is False
    upd = load("skyrl").updates(read_dump(fixture("skyrl", "step_wise")))
    u = upd.to_pylist()[0]
    assert u["trajectory_ids"] == table["trajectory_id"].to_pylist()
    assert u["stat_trajectory_ids"] == [
        t for t, c in zip(u["trajectory_ids"], table["split_continues"].to_pylist()) if not c
    ]
    assert ran is None or {"U603", "U607", "U608"} <= ran


def test_step_wise_rows_interleaved_get_another_episodes_advantage_u603():
    res, rep = _check(fixture("skyrl", "step_wise_interleaved"))
    assert res.exit_code == 1, res.output
    assert [(f["code"], f["trajectory_id"]) for f in rep["findings"]] == [
        ("U603", "5/search-4_1#0"),
        ("U603", "5/search-4_1#1"),
    ]


def test_step_wise_rows_without_a_last_step_are_refused_naming_the_dump(tmp_path):
    recs = records("skyrl", "step_wise")
    recs[1]["is_last_step"] = False
    dump = tmp_path / "steps.jsonl"
    dump.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = cli("check", "--from", "skyrl", dump, *context_args())
    assert res.exit_code == 2 and "Traceback" not in res.output
    line = res.stderr.strip().splitlines()[-1]
    assert f"{dump}:2" in line and "is_last_step" in line and "5/gsm8k-17_0" in line


def test_an_aborted_row_in_the_group_statistics_is_u608():
    """apply_overlong_filtering masks an aborted row out of the loss, but its reward stays in the
    group's GRPO statistics."""
    res, rep = _check(
        fixture("skyrl", "abort_in_group_statistics"), extra=("--context", "apply_overlong_filtering=true")
    )
    assert res.exit_code == 1
    assert ("U608", "3/gsm8k-17_1") in {(f["code"], f["trajectory_id"]) for f in rep["findings"]}


def test_trainer_records_audit_clean_and_run_the_update_checks():
    res, rep = _check(fixture("skyrl", "trainer"))
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    upd = load("skyrl").updates(read_dump(fixture("skyrl", "trainer")))
    u = upd.to_pylist()[0]
    assert u["advantage_estimator"] == "grpo" and len(u["advantages"]) == 4
    assert u["numerator_tokens"] == [sum(r["loss_masks"]) for r in records("skyrl", "compliant")]


def _check(*paths, extra=()):
    res = cli("check", "--from", "skyrl", *paths, *context_args(), *extra, "--format", "json")
    return res, json.loads(res.stdout)


def test_multi_step_dump_is_clean_with_the_step_in_the_identity():
    res, rep = _check(fixture("skyrl", "multi_step"), extra=("--context", "apply_overlong_filtering=true"))
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    ids = load("skyrl").to_contract(read_dump(fixture("skyrl", "multi_step")), **CONTEXT)["trajectory_id"]
    assert ids.to_pylist()[:2] == ["3/gsm8k-17_0", "3/gsm8k-17_1"] and "4/gsm8k-17_0" in ids.to_pylist()


def test_multi_step_dump_as_one_file_per_step_takes_the_step_from_the_file_name(tmp_path):
    """The documented hook writes rollout_dumps/skyrl-{step}.jsonl; records without global_step
    still get their step from the file name, so the directory audits without S002."""
    for rec in records("skyrl", "multi_step"):
        step = rec.pop("global_step")
        with (tmp_path / f"skyrl-{step}.jsonl").open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
    res, rep = _check(tmp_path, extra=("--context", "apply_overlong_filtering=true"))
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    assert rep["summary"]["trainer_settings"] == {"truncation": "penalize"}


def test_without_a_step_the_repeated_ids_are_s002(tmp_path):
    """What the step in the identity prevents: the same instance_id/repetition_id at two steps."""
    dump = tmp_path / "dump.jsonl"
    dump.write_text(
        "".join(
            json.dumps({k: v for k, v in r.items() if k != "global_step"}) + "\n"
            for r in records("skyrl", "multi_step")
        )
    )
    res, rep = _check(dump, extra=("--context", "apply_overlong_filtering=true"))
    assert res.exit_code == 1 and {f["code"] for f in rep["findings"]} == {"S002"}
    # the message names the dump, never the temporary Parquet file the conversion wrote
    assert all(f["message"].endswith(f"(in {dump})") for f in rep["findings"]), rep["findings"]


def test_fully_async_groups_take_the_scheduled_step_as_policy_version():
    table = load("skyrl").to_contract(read_dump(fixture("skyrl", "fully_async")), **CONTEXT)
    rows = table.select(["trajectory_id", "turns"]).to_pylist()
    assert [r["trajectory_id"] for r in rows] == ["7/gsm8k-17_0", "7/gsm8k-17_1", "9/gsm8k-17_0", "9/gsm8k-17_1"]
    assert {t["policy_version"] for r in rows[2:] for t in r["turns"]} == {9}
    res, rep = _check(fixture("skyrl", "fully_async"))
    assert res.exit_code == 0 and rep["findings"] == [], res.output


def test_the_truncation_flags_are_named_in_the_policy():
    res, rep = _check(fixture("skyrl", "multi_step"), extra=("--context", "zero_reward_on_non_stop=true"))
    said = rep["summary"]["trainer_settings_said"]
    assert "zero_reward_on_non_stop=True" in said and "get reward 0" in said and "(as given)" in said
    assert "rollout-audit: note: SkyRL zero_reward_on_non_stop=True" in res.stderr


def test_missing_loss_masks_exits_2_naming_it(tmp_path):
    line = missing_field_exits_2("skyrl", "compliant", "loss_masks", tmp_path)
    assert "3/gsm8k-17_1" in line


def test_convert_writes_next_to_the_dump_into_a_new_directory_only(tmp_path):
    dump = tmp_path / "skyrl.jsonl"
    dump.write_text(fixture("skyrl", "compliant").read_text())
    assert cli("convert", "--from", "skyrl", dump, tmp_path / "log", *context_args()).exit_code == 0
    again = cli("convert", "--from", "skyrl", dump, tmp_path / "log", *context_args())
    assert again.exit_code == 2 and "not empty" in again.stderr


def test_unknown_context_exits_2_naming_it():
    result = cli("check", "--from", "skyrl", fixture("skyrl", "compliant"), "--context", "seed=3")
    assert result.exit_code == 2 and "unknown context 'seed'" in result.stderr


def test_a_bad_flag_value_exits_2_naming_it():
    result = cli(
        "check", "--from", "skyrl", fixture("skyrl", "compliant"), "--context", "apply_overlong_filtering=maybe"
    )
    assert result.exit_code == 2 and "apply_overlong_filtering" in result.stderr


def test_an_overlong_filtered_sample_is_loss_excluded_and_a_trained_one_is_m109(tmp_path):
    """Under apply_overlong_filtering the sample that did not stop is out of the loss with its reward
    kept (contract 1.2 `loss_excluded`); a dump that still trains one of its tokens contradicts the
    flag it was run with, and M109 says so."""
    recs = records("skyrl", "multi_step")
    cut = next(i for i, r in enumerate(recs) if r["stop_reasons"] == "length")
    table = load("skyrl").to_contract(recs, **CONTEXT, apply_overlong_filtering=True)
    excluded = table["loss_excluded"].to_pylist()
    assert excluded[cut] is True and not any(excluded[:cut] + excluded[cut + 1 :])
    plain = load("skyrl").to_contract(recs, **CONTEXT)
    assert "loss_excluded" not in plain.column_names or not any(plain["loss_excluded"].to_pylist())

    recs[cut]["loss_masks"][0] = 1
    dump = tmp_path / "dump.jsonl"
    dump.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res, rep = _check(dump, extra=("--context", "apply_overlong_filtering=true"))
    assert res.exit_code == 1, res.output
    assert {f["code"] for f in rep["findings"] if f["severity"] == "error"} == {"M109"}


@pytest.mark.parametrize(
    ("case", "extra"),
    [
        ("compliant", ()),
        ("trainer", ()),
        ("multi_step", ("--context", "apply_overlong_filtering=true")),
        ("fully_async", ()),
        ("step_wise", ()),
        ("zero_variance_filtered", ()),
    ],
)
def test_every_compliant_fixture_on_the_page_audits_clean_with_its_command(case, extra):
    """docs/frameworks/skyrl.md's command (`check --from skyrl DUMP --context ...`) on each fixture it
    calls compliant: exit 0, no finding."""
    res, rep = _check(fixture("skyrl", case), extra=extra)
    assert res.exit_code == 0 and rep["findings"] == [], res.output


def test_rows_the_zero_variance_filter_took_out_of_the_loss_are_loss_excluded_not_u607():
    """trainer.algorithm.zero_variance_filter zeroes a flat group's masks after the sampler hook: the
    trainer's records show it, and those rows are recorded out of the loss (no false U607)."""
    table = load("skyrl").to_contract(read_dump(fixture("skyrl", "zero_variance_filtered")), **CONTEXT)
    rows = table.select(["trajectory_id", "loss_excluded", "loss_mask"]).to_pylist()
    assert [r["trajectory_id"] for r in rows if r["loss_excluded"]] == ["3/gsm8k-17_0", "3/gsm8k-17_1"]
    assert not any(rows[0]["loss_mask"])


def test_a_trainer_mask_that_trains_what_the_dump_masked_is_u607():
    res, rep = _check(fixture("skyrl", "trainer_mask_trains_more"))
    assert res.exit_code == 1
    assert [(f["code"], f["trajectory_id"]) for f in rep["findings"]] == [("U607", "3/search-4_1")]


@pytest.mark.parametrize(
    ("case", "field", "value"),
    [
        ("compliant", "engine_calls", "x"),
        ("compliant", "engine_calls", [{"prompt_token_ids": [1], "response_ids": [2]}]),  # ends before the response
        ("compliant", "engine_calls", [{"prompt_token_ids": [1]}]),
        ("step_wise", "is_last_step", "yes"),
    ],
)
def test_a_malformed_hook_field_exits_2_naming_it(case, field, value, tmp_path):
    missing_field_exits_2("skyrl", case, field, tmp_path, value)


# ---------------------------------------------------------------- contract 1.3: routes, overlong penalty

DAPO = ("--context", "max_generate_length=64", "--context", "overlong_buffer_len=32")
DAPO += ("--context", "overlong_buffer_penalty_factor=1.0")


def _not_run(rep: dict) -> set[str]:
    return {c["code"] for c in rep["not_run"]}


def test_routed_experts_of_a_compliant_moe_run_audit_clean_with_p505_run():
    res, rep = _check(fixture("skyrl", "compliant_moe"))
    assert res.exit_code == 0 and rep["findings"] == [] and "P505" not in _not_run(rep), res.output
    row = load("skyrl").to_contract(read_dump(fixture("skyrl", "compliant_moe")), **CONTEXT).to_pylist()[3]
    # the latest call's routes: every position but the last, at the batch's step; the trainer pads the last
    assert row["routed_experts_version"] == [3] * (len(row["token_ids"]) - 1) + [None]


@pytest.mark.parametrize("case", ["routes_appended_each_turn", "routes_lost_after_first_turn"])
def test_routes_appended_or_lost_across_turns_are_p505_through_the_cli(case):
    res, rep = _check(fixture("skyrl", case))
    found = [(f["code"], f["trajectory_id"]) for f in rep["findings"]]
    assert res.exit_code == 1 and found == [("P505", "3/search-4_0"), ("P505", "3/search-4_1")], res.output
    assert all("no route of their own position" in f["message"] for f in rep["findings"])


def test_the_dapo_trainers_penalty_is_recomputed_clean_on_single_turn_rows():
    res, rep = _check(fixture("skyrl", "compliant_dapo"), extra=DAPO)
    assert res.exit_code == 0 and rep["findings"] == [] and "R414" not in _not_run(rep), res.output
    res, rep = _check(fixture("skyrl", "compliant_dapo"))  # without the trainer's settings: not run
    assert res.exit_code == 0 and "R414" in _not_run(rep)


def test_a_penalty_counting_observation_tokens_is_r414():
    """The DAPO example measures len(response_ids), observations included (main_dapo.py:55, :58)."""
    res, rep = _check(fixture("skyrl", "dapo_penalty_counts_observations"), extra=DAPO)
    found = [(f["code"], f["trajectory_id"]) for f in rep["findings"]]
    assert res.exit_code == 1 and found == [("R414", "3/search-4_0"), ("R414", "3/search-4_1")], res.output
    assert "22 policy tokens" in rep["findings"][0]["message"]


def test_a_configured_overlong_setting_wins_over_the_context(tmp_path):
    config = tmp_path / "audit.toml"
    config.write_text("[tool.rollout-audit]\noverlong_buffer = 64\n")
    res, rep = _check(fixture("skyrl", "compliant_dapo"), extra=(*DAPO, "--config", str(config)))
    assert res.exit_code == 1 and {f["code"] for f in rep["findings"]} == {"R414"}, res.output
