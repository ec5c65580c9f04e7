"""rLLM adapter: `Episode.to_dict()` dumps audit clean with the not-run list docs/frameworks/rllm.md
predicts; missing log-probs (rLLM's transform pads them with 0.0) are L201 on the trajectory; a run
with compact filtering audits clean once the filter is given as context, and says which policy it
assumed; update records from `Step.advantage` catch a GRPO group of one (U604); rewards an AgentFlow
normalised to zero while the verdicts vary are G703."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adapterhelp import (
    IDENTITY,
    cli,
    documented_not_run,
    fails_naming,
    finding_keys,
    fixture,
    opts,
    records,
    report,
    same_after_convert,
    users_word,
    without,
)

from rollout_audit.adapters import load
from rollout_audit.adapters.base import read_dump

CONTEXT = [*IDENTITY, "temperature=0.7", "top_p=1.0"]
FILTERING = [*CONTEXT, "compact_filtering=true"]


def test_compliant_audits_clean_with_the_documented_not_run_list() -> None:
    rep = report([fixture("rllm", "compliant")], "rllm", CONTEXT)
    assert rep["findings"] == []
    assert {n["code"] for n in rep["not_run"]} == documented_not_run("rllm")


def test_missing_logprobs_are_l201_on_the_trajectory() -> None:
    rep = report([fixture("rllm", "logprobs_missing")], "rllm", CONTEXT)
    assert finding_keys(rep) == [("L201", "task-7:1/solver", 1)]


def test_compact_filtering_run_audits_clean_and_names_the_policy() -> None:
    rep = report([fixture("rllm", "compact_filtering")], "rllm", FILTERING)
    assert rep["findings"] == []
    policy = rep["summary"]["trainer_settings_said"]
    assert "compact filtering on" in policy and "error" in policy and "max_response_length_exceeded" in policy
    assert rep["summary"]["trainer_settings"] == {"truncation": "exclude"}
    assert "U604" not in {n["code"] for n in rep["not_run"]}  # the advantages were audited


def test_compact_filtering_not_given_trains_everything_and_t303_stays() -> None:
    """rLLM's default (filter off) trains truncated episodes with their reward: the audit follows that
    policy (truncation = penalize, said in the summary), and an errored episode trained is still T303."""
    rep = report([fixture("rllm", "compact_filtering")], "rllm", CONTEXT)
    assert finding_keys(rep) == [("T303", "12/task-7:3/solver", None)]
    assert "compact filtering off" in rep["summary"]["trainer_settings_said"]
    assert rep["summary"]["trainer_settings"] == {"truncation": "penalize"}


def test_the_configured_truncation_policy_wins_over_the_trainers(tmp_path: Path) -> None:
    config = tmp_path / "audit.toml"
    config.write_text('truncation = "exclude"\n')
    src = fixture("rllm", "compact_filtering")
    res = cli("check", src, "--from", "rllm", *opts([*FILTERING, "mask_timeout=false"]), "--config", config)
    assert res.exit_code == 1 and "T304" in res.stdout and "12/task-9:2/solver" in res.stdout, res.output
    assert "trained with their reward: truncation = 'penalize'" in res.stderr


def test_grpo_group_of_one_is_u603_and_u604_on_its_trajectory() -> None:
    # rLLM's normalised GRPO is declared grpo_population_std, so U603 recomputes it: the group of one
    # kept its raw reward (mean 0, std 1) where it has no baseline (rllm-org/rllm#776)
    rep = report([fixture("rllm", "grpo_group_of_one")], "rllm", FILTERING)
    assert finding_keys(rep) == [("U603", "12/task-9:0/solver", None), ("U604", "12/task-9:0/solver", None)]
    u603 = next(f for f in rep["findings"] if f["code"] == "U603")
    assert "(grpo_population_std): advantage 0.999999 recorded, expected 0" in u603["message"], u603["message"]


def test_grpo_without_std_declares_the_estimator_so_u603_recomputes() -> None:
    rep = report([fixture("rllm", "grpo_group_of_one")], "rllm", [*FILTERING, "norm_adv_by_std_in_grpo=false"])
    found = {(c, t) for c, t, _ in finding_keys(rep)}
    # the fixture's advantages are normalised GRPO: U603 recomputes R - mean and disagrees on every member
    assert found >= {("U603", "12/task-7:0/solver"), ("U603", "12/task-9:0/solver"), ("U604", "12/task-9:0/solver")}


def test_a_filtered_episode_that_carries_an_advantage_is_u606(tmp_path: Path) -> None:
    recs = records("rllm", "compact_filtering")
    for step in recs[2]["trajectories"][0]["steps"]:
        step["advantage"] = -0.5
    src = tmp_path / "dump.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rep = report([src], "rllm", FILTERING)
    assert ("U606", "12/task-7:2/solver") in {(c, t) for c, t, _ in finding_keys(rep)}


def test_convert_then_check_equals_check_from(tmp_path: Path) -> None:
    same_after_convert("rllm", "logprobs_missing", CONTEXT, tmp_path)
    same_after_convert("rllm", "grpo_group_of_one", FILTERING, tmp_path / "2")


def test_missing_field_exits_2_naming_it(tmp_path: Path) -> None:
    recs = records("rllm", "compliant")
    bad = without(recs[0], ["trajectories", 0, "steps", 1, "model_output", "completion_ids"])
    fails_naming("rllm", [bad, *recs[1:]], "completion_ids", tmp_path)


def test_records_of_the_wrong_shape_exit_2_in_one_line(tmp_path: Path) -> None:
    fails_naming("rllm", [{"id": "t:0", "trajectories": 5}], "dump.jsonl:1: episode t:0: trajectories", tmp_path)


def test_per_token_advantages_that_differ_exit_2_naming_the_trajectory(tmp_path: Path) -> None:
    recs = records("rllm", "grpo_group_of_one")
    recs[0]["trajectories"][0]["steps"][0]["advantage"] = [0.5, -0.5, 0.5, 0.5]
    fails_naming("rllm", recs, "task-7:0 trajectory solver", tmp_path)


def test_convert_writes_the_policy_the_log_was_trained_under(tmp_path: Path) -> None:
    res = cli("convert", "--from", "rllm", fixture("rllm", "compact_filtering"), tmp_path / "log", *opts(CONTEXT))
    assert res.exit_code == 0, res.output
    assert 'truncation = "penalize"' in (tmp_path / "log" / "pyproject.toml").read_text()
    after = cli("check", tmp_path / "log", "--format", "json", *users_word(res, tmp_path))
    direct = report([fixture("rllm", "compact_filtering")], "rllm", CONTEXT)
    assert finding_keys(json.loads(after.stdout)) == finding_keys(direct) == [("T303", "12/task-7:3/solver", None)]


def test_a_directory_of_step_dumps_keeps_the_step_in_the_identity(tmp_path: Path) -> None:
    """The documented hook writes step-{global_step:06d}.jsonl; rLLM's episode ids recur every step that
    draws the task again, so the step (from the record or the file name) is part of the identity."""
    for step in (3, 4):
        recs = records("rllm", "compliant")
        (tmp_path / f"step-{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rep = report([tmp_path], "rllm", CONTEXT)
    assert rep["findings"] == [], rep["findings"]
    ids = load("rllm").to_contract(read_dump(tmp_path))["trajectory_id"].to_pylist()
    assert ids[:3] == ["3/task-7:0/solver", "3/task-7:1/solver", "3/task-7:2/solver"] and len(set(ids)) == 6


def test_a_nan_advantage_reaches_the_update_and_is_flagged(tmp_path: Path) -> None:
    """task-9's group is degenerate (both rewards 1.0): a NaN advantage there is U604 and U603 (its
    recomputed advantage is 0), not an exit 2."""
    recs = records("rllm", "compact_filtering")
    for step in recs[4]["trajectories"][0]["steps"]:
        step["advantage"] = float("nan")
    src = tmp_path / "step-000012.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rep = report([src], "rllm", FILTERING)
    assert finding_keys(rep) == [("U603", "12/task-9:0/solver", None), ("U604", "12/task-9:0/solver", None)]


# ---------------------------------------------------------------- the trainer side: the rows rLLM trains


def _check(case: str) -> tuple[int, set[tuple[str, str]], set[str]]:
    """(exit code, (code, trajectory) findings, codes not run) of the page's command on a fixture."""
    result = cli("check", "--from", "rllm", fixture("rllm", case), *opts(CONTEXT), "--format", "json")
    rep = json.loads(result.stdout)
    return (
        result.exit_code,
        {(f["code"], f["trajectory_id"]) for f in rep["findings"]},
        {n["code"] for n in rep["not_run"]},
    )


def test_trainer_rows_of_the_unified_and_fully_async_trainers_audit_clean_with_the_loss_rules_run():
    """The batch rows after advantages (unified trainer) and after transform_to_backend_batch (fully-async
    path: episode_ids hold the group id, rows are matched by the trajectory uid) audit clean; R411, U604,
    U605, U606 and U607 run on them, which the rollout dump alone leaves not run."""
    _, _, before = _check("compliant")
    for case in ("trainer_compliant", "trainer_fully_async"):
        code, found, not_run = _check(case)
        assert (code, found) == (0, set()), case
        assert {"R411", "U604", "U605", "U606", "U607"} <= before - not_run


def test_a_row_cut_at_the_cap_loses_its_reward_r411_and_its_last_turn_m102():
    """transform_to_backend_batch cuts a merged multi-turn row at the cap and places no reward on a cut
    row: R411 names the episode whose reward 1.0 is on no token, M102 the turn the cut left untrained."""
    code, found, _ = _check("trainer_row_cut_at_cap")
    assert code == 1
    assert found == {("R411", "12/task-7:0/solver"), ("M102", "12/task-7:0/solver")}


@pytest.mark.slow  # imports verl and torch
def test_dump_batch_writes_a_verl_dataproto_as_the_fixture_rows(tmp_path):
    """rLLM trains a verl DataProto: `dump_batch` of one built as transform.py pads it (prompts left,
    responses right, attention_mask) writes the fixture's rows back, with the identity of non_tensor_batch."""
    pytest.importorskip("verl")
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl import DataProto

    from rollout_audit.integrations.rllm import dump_batch

    rows = [r for r in read_dump(fixture("rllm", "trainer_row_cut_at_cap")) if "responses" in r]
    n_p, n_r = max(len(r["prompts"]) for r in rows), max(len(r["responses"]) for r in rows) + 2

    def pad(v, n, left=False, fill=0):
        return [fill] * (n - len(v)) + v if left else v + [fill] * (n - len(v))

    tensors = {
        "prompts": torch.tensor([pad(r["prompts"], n_p, left=True) for r in rows]),
        "attention_mask": torch.tensor(
            [pad([1] * len(r["prompts"]), n_p, left=True) + pad([1] * len(r["responses"]), n_r) for r in rows]
        ),
        **{
            k: torch.tensor([pad(r[k], n_r) for r in rows], dtype=torch.float32 if k != "responses" else torch.long)
            for k in ("responses", "response_mask", "traj_rewards", "advantages", "rollout_log_probs")
        },
    }
    extra = {k: np.array([r[k] for r in rows], dtype=object) for k in ("step_ids", "episode_ids", "group_roles")}
    extra["is_pad_step"] = np.zeros(len(rows), dtype=bool)
    batch = DataProto(batch=TensorDict(tensors, batch_size=len(rows)), non_tensor_batch=extra, meta_info={})
    written = [json.loads(x) for x in dump_batch(tmp_path, batch, 12).read_text().splitlines()]
    for got, want in zip(written, rows):
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert got[k] == (pytest.approx(v) if isinstance(v, list) and v and isinstance(v[0], float) else v), k


def test_a_malformed_batch_row_exits_2_naming_it(tmp_path):
    recs = [dict(r) for r in read_dump(fixture("rllm", "trainer_compliant"))]
    recs[2]["advantages"] = ["x"] * len(recs[2]["advantages"])
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = cli("check", "--from", "rllm", tmp_path / "d.jsonl", *opts(CONTEXT))
    assert result.exit_code == 2 and "d.jsonl:3: advantages: expected a number, got str" in result.output


# ---------------------------------------------------------------- contract 1.3: routes (R3)


def test_routes_of_a_step_after_a_weight_sync_replace_the_older_ones_p505():
    """rLLM replays a segment's last routed step (transform.py:336-360): after a weight sync between the
    turns, the first turn's tokens are replayed with the newer weights' routes (the class of verl#6046)."""
    result = cli("check", "--from", "rllm", fixture("rllm", "routes_across_weight_sync"), *opts(CONTEXT),
                 "--format", "json")  # fmt: skip
    assert result.exit_code == 1, result.output
    rep = json.loads(result.stdout)
    assert [k for k in finding_keys(rep) if k[0] != "P504"] == [("P505", "task-7:1/solver", 0)]
    clean = report([fixture("rllm", "compliant_routes")], "rllm", CONTEXT)
    assert clean["findings"] == [] and "P505" not in {n["code"] for n in clean["not_run"]}


def test_a_malformed_routing_header_exits_2_naming_it(tmp_path):
    recs = read_dump(fixture("rllm", "compliant_routes"))
    recs[0]["trajectories"][0]["steps"][1]["routing_matrices"][0] = '{"shape": [2, 2], "dtype": "object"}'
    bad = tmp_path / "dump.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = cli("check", "--from", "rllm", bad, *opts(CONTEXT))
    assert result.exit_code == 2 and "routing_matrices" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (7, "of type int"),
        ({"shape": [2, 2]}, "of type dict"),
        (['{"shape": [2, 2], "dtype": "int32"}', "AAAA", "AAAA"], "has 3 items, not 2"),
        (["AAAA", 3], "holding non-strings"),
    ],
)
def test_routing_matrices_in_no_known_form_exit_2_naming_record_and_field(tmp_path, value, said):
    """Neither [{shape, dtype}, base64] nor one string per token (another engine's form): one line
    naming the dump file, the record and the field, never skipped as if the step had no routes."""
    recs = read_dump(fixture("rllm", "compliant_routes"))
    recs[0]["trajectories"][0]["steps"][1]["routing_matrices"] = value
    bad = tmp_path / "dump.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = cli("check", "--from", "rllm", bad, *opts(CONTEXT))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "dump.jsonl:1" in lines[0] and "routing_matrices" in lines[0] and said in lines[0], lines[0]


def test_rewards_normalised_per_trajectory_are_g703_and_the_compliant_dumps_stay_clean_of_it() -> None:
    """An AgentFlow that set each trajectory's reward normalised over the trajectory itself (every
    reward 0.0, alibaba/ROLL#397) while rLLM took is_correct from the evaluator: G703, a warning, so
    `check` exits 0 and `--strict` blocks; every compliant rLLM dump stays clean of it."""
    src = fixture("rllm", "rewards_normalised_per_trajectory")
    rep = report([src], "rllm", CONTEXT)
    assert finding_keys(rep) == [("G703", None, None)], rep["findings"]
    msg = rep["findings"][0]["message"]
    assert "all 2 groups of two or more trajectories are degenerate" in msg, msg
    assert "success rate is 0.500" in msg and "2 successes in 4 scored trajectories" in msg, msg
    strict = cli("check", src, "--from", "rllm", *opts(CONTEXT), "--strict")
    assert strict.exit_code == 1 and "G703" in strict.stdout, strict.output
    for case, context in (("compliant", CONTEXT), ("compact_filtering", FILTERING), ("compliant_routes", CONTEXT)):
        clean = report([fixture("rllm", case)], "rllm", context)
        assert clean["findings"] == [], (case, clean["findings"])
        assert "G703" not in {n["code"] for n in clean["not_run"]}, case
    for case in ("trainer_compliant", "trainer_fully_async"):
        assert _check(case)[:2] == (0, set()), case
