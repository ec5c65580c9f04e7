"""verl adapter: the compliant fixture audits clean with the not-run list docs/frameworks/verl.md
predicts, with the engine-side checks (M105, M106, M107) run; verl#6501 (a dropped turn separator)
is M107; a Search-R1-style mask built on a re-encoded transcript is M101 against the engine's
record of what it sampled; the CLI paths agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from adapterhelp import (
    CONTEXT,
    audit,
    cli,
    context_args,
    convert_then_check_equals_check_from,
    documented_not_run,
    findings,
    fixture,
    missing_field_exits_2,
)

import rollout_audit as ra
from rollout_audit.adapters.base import read_dump
from rollout_audit.adapters.verl import to_contract
from rollout_audit.contract.config import Config
from rollout_audit.integrations.verl import dump


def test_compliant_is_clean_and_not_run_as_documented():
    rep = audit("verl", "compliant")
    assert rep.findings.is_empty(), rep.render()
    assert set(rep.not_run) == documented_not_run("verl")
    assert not {"M105", "M106", "M107"} & set(rep.not_run)


def test_mask_after_reencoding_is_m101(tmp_path):
    found = convert_then_check_equals_check_from("verl", "searchr1_mask_after_reencoding", tmp_path)
    assert {(f[0], f[1]) for f in found} == {("M101", "e2a901"), ("M102", "e2a901")}


def test_dropped_turn_separator_is_m107_not_m105():
    """verl#6501: the engine and the trainer share the separator-less sequence (M105 holds); the
    template's render of the conversation has one more token per earlier tool boundary."""
    rep = audit("verl", "tool_separator_dropped")
    f = rep.findings.sort("turn")
    assert f.select("code", "trajectory_id", "turn").rows() == [("M107", "e2a901", 1), ("M107", "e2a901", 2)]
    assert "has 50 tokens" in f["message"][0] and "as 51" in f["message"][0]


def test_missing_response_mask_exits_2_naming_it(tmp_path):
    line = missing_field_exits_2("verl", "compliant", "response_mask", tmp_path)
    assert "7c1f01" in line


class _Output:
    """The attributes of an AgentLoopOutput the hook reads."""

    prompt_ids, response_ids, response_mask = [1, 2], [3, 4, 5], [1, 0, 1]
    response_logprobs, reward_score, num_turns = [-0.5, 0.0, -0.25], 1.0, 4
    extra_fields = {"turn_scores": [], "tool_rewards": [], "raw_prompt": object()}


def test_hook_writes_records_the_adapter_reads(tmp_path):
    calls = [{"prompt_ids": [1, 2], "token_ids": [3]}, {"prompt_ids": [1, 2, 3, 4], "token_ids": [5]}]
    path = dump(tmp_path, _Output(), request_id="r0", uid="u0", engine_calls=calls)
    from rollout_audit.adapters.base import read_dump
    from rollout_audit.adapters.verl import to_contract

    t = to_contract(read_dump(path.parent)).to_pylist()[0]
    assert t["token_source"] == [1, 1, 2, 3, 2] and t["behavior_logprobs"] == [None, None, -0.5, None, -0.25]
    assert [x["context_length"] for x in t["turns"]] == [2, 4]


def test_turn_cut_by_response_length_is_m106():
    """verl cuts the response at response_length and says nothing; the engine's ids show the cut."""
    from rollout_audit.adapters.base import read_dump
    from rollout_audit.adapters.verl import to_contract

    rec = read_dump(fixture("verl", "compliant"))[0]
    for k in ("response_ids", "response_mask", "response_logprobs"):
        rec[k] = rec[k][:-3]
    rep = ra.audit_tables(to_contract([rec], **CONTEXT))
    assert rep.findings.select("code", "trajectory_id").rows() == [("M106", rec["request_id"])]


def test_cut_last_turn_and_differing_earlier_ids_are_both_m106():
    """A sample whose last turn is cut by response_length and whose first turn's engine ids differ
    from the trainer's: both turns are M106 findings, in one frame (no dtype clash between them)."""
    from rollout_audit.adapters.base import read_dump
    from rollout_audit.adapters.verl import to_contract

    rec = next(r for r in read_dump(fixture("verl", "compliant")) if len(r["engine_calls"]) >= 2)
    for k in ("response_ids", "response_mask", "response_logprobs"):
        rec[k] = rec[k][:-2]
    rec["engine_calls"][0]["token_ids"][0] += 1
    rep = ra.audit_tables(to_contract([rec], **CONTEXT), select=["M"])
    assert rep.crashes == []
    m106 = rep.findings.filter(rep.findings["code"] == "M106")
    assert sorted(m106["turn"].to_list()) == [0, len(rec["engine_calls"]) - 1]


# ---------------------------------------------------------------- versions, stop reasons, top_k, GLM boundaries

ASYNC = {**CONTEXT, "response_length": "64"}


def _table(case: str, **context):
    from rollout_audit.adapters.base import read_dump
    from rollout_audit.adapters.verl import to_contract

    return to_contract(read_dump(fixture("verl", case)), **context)


def test_fully_async_versions_and_length_stop_audit_clean_under_penalize():
    """Each turn carries its engine call's weight version (the oldest of a resumed call); the call whose
    cumulative tokens reached the budget stopped with "length": a truncated episode, which verl scores
    and trains (truncation = "penalize"); P504 reports the episode sampled by two versions."""
    t = {r["trajectory_id"]: r for r in _table("fully_async", **ASYNC).to_pylist()}
    assert [x["policy_version"] for x in t["a2"]["turns"]] == [7, 7]
    assert [x["policy_version"] for x in t["a3"]["turns"]] == [8, 8, 9]
    assert t["a3"]["turns"][-1]["finish_reason"] == "length"
    assert (t["a3"]["truncated"], t["a3"]["stop_reason"]) == (True, "max_tokens")
    assert (t["a1"]["terminated"], t["a1"]["stop_reason"]) == (True, "end_of_sequence")
    rep = ra.audit_tables(_table("fully_async", **ASYNC), config=Config(truncation="penalize"))
    assert rep.findings.select("code", "severity", "trajectory_id").rows() == [("P504", "info", "a3")]
    assert not {"P501", "P502", "T301", "T302", "T303", "T304"} & set(rep.not_run)


def test_length_stop_scored_under_exclude_is_t304():
    rep = ra.audit_tables(_table("fully_async", **ASYNC))
    assert rep.findings.filter(rep.findings["severity"] == "error").select("code", "trajectory_id").rows() == [
        ("T304", "a3")
    ]


def test_version_decreasing_within_an_episode_is_p502():
    rep = ra.audit_tables(_table("fully_async_versions_decrease", **ASYNC), config=Config(truncation="penalize"))
    errors = rep.findings.filter(rep.findings["severity"] == "error")
    assert errors.select("code", "trajectory_id", "turn").rows() == [("P502", "a3", 2)]


def test_without_response_length_the_stop_cause_is_not_run_not_guessed():
    rep = ra.audit_tables(_table("fully_async", **CONTEXT))
    assert {"T301", "T302", "T303", "T304"} <= set(rep.not_run)
    assert "response_length" in rep.not_run["T301"]


def test_glm_boundary_edit_is_clean():
    """GLMContinuousTokenBuilder drops the sampled <|observation|> that ends a tool-calling turn (the tool
    message opens with its own, mask 0): declared by the hook's boundary_ids, neither M102 nor M106."""
    rep = ra.audit_tables(_table("glm_boundary", **ASYNC), select=["M", "L", "P", "T"])
    assert rep.findings.is_empty(), rep.render()
    assert not {"M105", "M106"} & set(rep.not_run)


def test_glm_boundary_edit_undeclared_is_m102():
    """Without boundary_ids the dropped stop token is what it looks like: a sampled token the trainer
    does not train (the tool message's own <|observation|> sits there with mask 0)."""
    from rollout_audit.adapters.base import read_dump
    from rollout_audit.adapters.verl import to_contract

    recs = read_dump(fixture("verl", "glm_boundary"))
    for r in recs:
        del r["boundary_ids"]
    rep = ra.audit_tables(to_contract(recs, **CONTEXT), select=["M"])
    assert sorted(rep.findings.select("code", "trajectory_id").rows()) == [("M102", "glm00"), ("M102", "glm01")]
    assert rep.findings["message"][0].startswith("2 of 18 policy-sampled token(s) have loss_mask false")


def test_glm_builder_dropping_a_non_boundary_token_is_m106_and_m102():
    rep = ra.audit_tables(_table("glm_boundary_dropped_answer", **CONTEXT), select=["M"])
    assert sorted(rep.findings.select("code", "trajectory_id", "turn").rows()) == [
        ("M102", "glm01", 0),
        ("M106", "glm01", 0),
    ]


def test_top_k_is_recorded_on_every_turn_and_a_bad_value_exits_2(tmp_path):
    src = fixture("verl", "compliant")
    for value in ("-1", "0", "50"):  # a cut-off is recorded (contract 1.3 turns.top_k): replay applies it
        ok = cli("check", "--from", "verl", src, *context_args(), "--context", f"top_k={value}")
        assert ok.exit_code == 0, ok.output + ok.stderr
    table = to_contract(read_dump(src), **{**CONTEXT, "top_k": "50"})
    assert {t["top_k"] for r in table.column("turns").to_pylist() for t in r} == {50}
    for kv, says in (
        ("top_k=hot", "top_k"),
        ("topk=1", "'topk'"),
        ("temperature=hot", "temperature"),
    ):
        res = cli("check", "--from", "verl", src, *context_args(), "--context", kv)
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and says in lines[0], (kv, res.stderr)


# ---------------------------------------------------------------- verl's own classes through the hook


def _glm_tokenizer():
    from benchmarks.tinylm import tokenizer

    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|observation|>", "<|user|>", "<|assistant|>"]})
    return tok


def test_verl_classes_through_the_hook_audit_clean(tmp_path):
    """verl 0.9.1's TokenOutput per engine call, its GLMContinuousTokenBuilder editing the sequence at each
    tool boundary exactly as ToolAgentLoop does (merge_assistant_tokens, _merge_context_token_ids,
    align_response_metadata), and the AgentLoopOutput it returns, dumped through the hook and audited."""
    pytest.importorskip("verl")
    pytest.importorskip("cachetools")
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.utils.tokenizer.continuous_token import GLMContinuousTokenBuilder
    from verl.workers.rollout.replica import TokenOutput

    from rollout_audit.adapters.base import read_dump
    from rollout_audit.adapters.verl import to_contract
    from rollout_audit.integrations.verl import boundary_ids, dump, engine_call

    tok = _glm_tokenizer()
    builder = GLMContinuousTokenBuilder(tok)
    obs, user, asst = tok.convert_tokens_to_ids(["<|observation|>", "<|user|>", "<|assistant|>"])
    words = lambda s: tok.encode(s, add_special_tokens=False)
    prompt = [user, *words("you are an agent in a room"), asst]
    turns = [  # (sampled ids, weight version), one TokenOutput each
        ([*words("open the red door"), obs], 5),
        ([*words("take the blue key"), obs], 5),
        ([*words("finish when done"), tok.pad_token_id], 6),
    ]
    for k, reward in enumerate((1.0, 0.0)):
        runtime, mask, lps, calls = list(prompt), [], [], []
        for t, (ids, version) in enumerate(turns):
            out = TokenOutput(
                token_ids=ids,
                log_probs=[-0.5 - 0.1 * (i + k) for i in range(len(ids))],
                stop_reason="completed",
                extra_fields={"global_steps": version, "min_global_steps": version, "max_global_steps": version},
            )
            calls.append(engine_call(runtime, out))
            merged = builder.merge_assistant_tokens(runtime, out.token_ids)
            mask, lps = builder.align_response_metadata(merged, mask, lps, assistant_logprobs=out.log_probs)
            runtime = merged.token_ids
            if t < len(turns) - 1:  # the tool's reply, opening with its own <|observation|>
                merged = builder._merge_context_token_ids(runtime, [obs, *words("the door is stuck"), asst])
                mask, lps = builder.align_response_metadata(merged, mask, lps)
                runtime = merged.token_ids
        output = AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=runtime[len(prompt) :],
            response_mask=mask,
            response_logprobs=lps,
            reward_score=reward,
            num_turns=2 * len(turns),
            metrics=AgentLoopMetrics(),
            extra_fields={"global_steps": 5, "min_global_steps": 5, "max_global_steps": 6, "raw_prompt": object()},
        )
        path = dump(
            tmp_path, output, request_id=f"r{k}", uid="u0", engine_calls=calls, boundary_ids=boundary_ids(builder)
        )
    assert boundary_ids(builder) == sorted([obs, user])
    recs = read_dump(path)
    assert recs[0]["extra_fields"] == {"global_steps": 5, "min_global_steps": 5, "max_global_steps": 6}
    table = to_contract(recs, **{**CONTEXT, "response_length": "256", "top_k": "-1"})
    assert [x["policy_version"] for x in table.to_pylist()[0]["turns"]] == [5, 5, 6]
    rep = ra.audit_tables(table)
    assert rep.findings.select("code", "severity").unique().rows() == [("P504", "info")], rep.render()
    assert not {"M105", "M106", "P501", "P502", "T301", "T304"} & set(rep.not_run)


def test_the_documented_command_audits_a_fully_async_run_with_length_cuts_clean():
    """verl trains a response cut at response_length with the score it got: the adapter states that
    policy (truncation = penalize), so the page's command, with no configuration, gives no error."""
    res = cli("check", "--from", "verl", fixture("verl", "fully_async"), *context_args(), "--context", "top_k=-1",
              "--context", "response_length=64", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "truncation = 'penalize'" in res.stderr


# ---------------------------------------------------------------- the trainer side: verl's own DataProto and estimators

PAGE = [*context_args(), "--context", "top_k=-1", "--context", "response_length=64"]


def _dataproto(samples: list[dict], old_shift: dict[str, float]):
    """The DataProto RayPPOTrainer.fit holds before rollout correction, built from the sampler records as
    agent_loop.py `_postprocess` pads them (prompts left, responses right), with the score on the last
    response token (rm_scores), token_level_rewards = token_level_scores (no KL in reward), and the
    actor's old_log_probs: the engine's on sampled tokens (+ `old_shift[request_id]`), -5.0 elsewhere."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl import DataProto

    n_p = max(len(s["prompt_ids"]) for s in samples)
    n_r = max(len(s["response_ids"]) for s in samples)

    def right(values, n, fill=0):
        return values + [fill] * (n - len(values))

    prompts = torch.tensor([[0] * (n_p - len(s["prompt_ids"])) + s["prompt_ids"] for s in samples])
    responses = torch.tensor([right(s["response_ids"], n_r) for s in samples])
    attention = [
        [0] * (n_p - len(s["prompt_ids"])) + [1] * (len(s["prompt_ids"]) + len(s["response_ids"])) for s in samples
    ]
    attention = torch.tensor([right(a, n_p + n_r) for a in attention])
    mask = torch.tensor([right(s["response_mask"], n_r) for s in samples], dtype=torch.float32)
    lps = torch.tensor([right(s["response_logprobs"], n_r, 0.0) for s in samples], dtype=torch.float32)
    shift = torch.tensor([old_shift.get(s["request_id"], 0.0) for s in samples]).unsqueeze(-1)
    old = torch.where(mask.bool(), lps + shift, torch.full_like(lps, -5.0))
    scores = torch.zeros_like(lps)
    for i, s in enumerate(samples):
        scores[i, len(s["response_ids"]) - 1] = s["reward_score"]
    batch = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": attention,
            "response_mask": mask,
            "rollout_log_probs": lps,
            "old_log_probs": old,
            "token_level_scores": scores,
            "token_level_rewards": scores.clone(),
        },
        batch_size=len(samples),
    )
    extra = {k: np.array([s[k] for s in samples], dtype=object) for k in ("uid", "request_id")}
    return DataProto(batch=batch, non_tensor_batch=extra, meta_info={})


def _trained(
    tmp_path, name: str, rejection: dict | None = None, old_shift: dict[str, float] | None = None, estimator="grpo"
):
    """verl's own step on the compliant batch: rollout correction (when `rejection` configures it), then
    compute_advantage (GRPO), then the trainer-side hook; the sampler records beside it. Returns the dump."""
    pytest.importorskip("verl")
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    from rollout_audit.adapters.base import read_dump
    from rollout_audit.integrations.verl import dump_batch

    out = tmp_path / name
    out.mkdir()
    samples = [dict(r) for r in read_dump(fixture("verl", "compliant"))]
    (out / "verl-sampler.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    batch = _dataproto(samples, old_shift or {})
    if rejection:
        batch, _ = compute_rollout_correction_and_add_to_batch(batch, rejection)
    algorithm = AlgoConfig(adv_estimator=estimator, norm_adv_by_std_in_grpo=True, gamma=1.0)
    batch = compute_advantage(batch, adv_estimator=algorithm.adv_estimator, config=algorithm)
    dump_batch(out, batch, 5, algorithm)
    return out


def test_verl_grpo_batch_through_the_trainer_hook_audits_clean_and_runs_the_loss_rules(tmp_path):
    """verl 0.9.1's own compute_advantage on a DataProto, dumped by dump_batch: clean with the page's
    command, and U603 (recomputed GRPO), U607, U608, L207, R411 and R412 run on the hook's records."""
    dump = _trained(tmp_path, "clean")
    result = cli("check", "--from", "verl", dump, *PAGE, "--format", "json")
    rep = json.loads(result.stdout)
    assert result.exit_code == 0 and rep["findings"] == [], result.output
    assert not {"U603", "U604", "U606", "U607", "U608", "L207", "R411", "R412"} & {n["code"] for n in rep["not_run"]}
    assert "R413" in {n["code"] for n in rep["not_run"]}  # GRPO's `returns` are its advantages, not reward-to-go


def test_verl_rejection_sampling_leaves_the_rejected_row_in_grpo_statistics_u608(tmp_path):
    """verl-project/verl#6452 with verl's own code: seq_mean_k1 rejection zeroes the response_mask of the
    row whose old log-probs drifted 1.5 nats from the engine's, and compute_advantage still reads its
    reward: U608 names it, and L207 the drift itself."""
    dump = _trained(
        tmp_path,
        "rejected",
        {"rollout_is": None, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.5_2.0"},
        {"e2a901": -1.5},
    )
    rows = [json.loads(x) for f in sorted(dump.glob("verl-batch-*.jsonl")) for x in f.read_text().splitlines()]
    assert [sum(r["response_mask"]) for r in rows if r["request_id"] == "e2a901"] == [0]
    result = cli("check", "--from", "verl", dump, *PAGE, "--format", "json")
    codes = {(f[0], f[1]) for f in findings(result)}
    assert ("U608", "e2a901") in codes and ("L207", "e2a901") in codes, result.output
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("trainer_rejected_in_group_statistics", ("U608", "e2a901")),
        ("trainer_mask_from_attention", ("U607", "e2a900")),
        ("trainer_stale_old_log_probs", ("L207", "e2a901")),
        ("trainer_grpo_group_of_one", ("U603", "7c1f01")),
        ("trainer_v1_advantages_mispaired", ("U603", "e2a9_1_0")),  # verl#7956 on the V1 trainer's record
    ],
)
def test_trainer_side_faults_are_caught_with_the_page_command(case, expected):
    result = cli("check", "--from", "verl", fixture("verl", case), *PAGE, "--format", "json")
    assert expected in {(f[0], f[1]) for f in findings(result)}, result.output


def test_the_page_lists_every_finding_of_each_trainer_side_fault():
    """docs/frameworks/verl.md's "Caught, from the trainer-side records" list names, for each fixture,
    every code its page command reports: the page cannot drift from what the audit says."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "frameworks" / "verl.md").read_text()
    caught = page.split("**Caught, from the trainer-side records**", 1)[1].split("\n\n", 1)[0]
    bullets = re.findall(r"^- `(\w+)\.jsonl` (.*?)(?=^- |\Z)", caught, re.S | re.M)
    assert len(bullets) >= 4, caught
    for case, text in bullets:
        result = cli("check", "--from", "verl", fixture("verl", case), *PAGE, "--format", "json")
        said = set(re.findall(r"\b[A-Z]\d{3}\b", text.split("→", 1)[1]))
        assert said == {f[0] for f in findings(result)}, (case, said, result.output)


@pytest.mark.parametrize(
    "case",
    [
        "compliant",
        "compliant_v1",
        "fully_async",
        "glm_boundary",
        "tool_agent_loop_response_length",
        "trainer_compliant",
    ],
)
def test_every_compliant_fixture_audits_clean_with_the_page_command(case):
    result = cli("check", "--from", "verl", fixture("verl", case), *PAGE)
    assert result.exit_code == 0 and "ok: 0 errors, 0 warnings" in result.output, result.output


def test_last_turn_cut_at_response_length_is_m106_only_without_the_budget():
    """The kept ids are a prefix of the engine's and the response is response_length long: verl's own cut,
    read as such with --context response_length; without it the cut is not known to be verl's."""
    found = cli("check", "--from", "verl", fixture("verl", "tool_agent_loop_response_length"), *context_args())
    assert found.exit_code == 1 and "M106" in found.output
    t = _table("tool_agent_loop_response_length", **CONTEXT, response_length="64").to_pylist()[1]
    assert (t["truncated"], t["stop_reason"]) == (True, "max_tokens")
    assert len(t["turns"][-1]["sampled_token_ids"]) == 16


def test_convert_carries_the_old_log_probs_and_the_policy(tmp_path):
    convert_then_check_equals_check_from(
        "verl",
        "trainer_stale_old_log_probs",
        tmp_path,
        context=[*(f"{k}={v}" for k, v in CONTEXT.items()), "top_k=-1", "response_length=64"],
    )
    assert 'compare_logprobs = "old_log_probs"' in (tmp_path / "log" / "pyproject.toml").read_text()


def test_a_malformed_trainer_side_record_exits_2_naming_it(tmp_path):
    from rollout_audit.adapters.base import read_dump

    recs = [dict(r) for r in read_dump(fixture("verl", "trainer_compliant"))]
    recs[5]["responses"] = recs[5]["responses"][:-1]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = cli("check", "--from", "verl", tmp_path / "d.jsonl", *PAGE)
    assert result.exit_code == 2
    assert "d.jsonl:6 (7c1f01): responses differ from the sampler record's response_ids" in result.output


def test_verl_reinforce_plus_plus_returns_are_token_returns_and_telescope_r413(tmp_path):
    """verl's REINFORCE++ (core_algos.compute_reinforce_plus_plus_outcome_advantage) at gamma 1 carries the
    return over observation spans: its `returns` are the contract's reward-to-go, R413 runs on them and
    holds; its whitened per-token advantages are no group advantage (no estimator declared)."""
    dump = _trained(tmp_path, "rpp", estimator="reinforce_plus_plus")
    result = cli("check", "--from", "verl", dump, *PAGE, "--format", "json")
    rep = json.loads(result.stdout)
    assert result.exit_code == 0 and rep["findings"] == [], result.output
    assert not {"R411", "R412", "R413", "U607"} & {n["code"] for n in rep["not_run"]}


# ---------------------------------------------------------------- contract 1.3: routes (R3) and DAPO's overlong penalty

DAPO_CONTEXT = ["max_resp_len=64", "overlong_buffer_len=16", "overlong_penalty_factor=1.0"]
DAPO = [x for kv in DAPO_CONTEXT for x in ("--context", kv)]
PAGE_CONTEXT = [*(f"{k}={v}" for k, v in CONTEXT.items()), "top_k=-1", "response_length=64"]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("routes_resumed_duplicated", "routed_experts_version has 91 entries for 57 tokens"),  # verl#6029
        (
            "routes_resumed_replaced",
            "11 policy token(s) whose log-prob is replayed through routes of another version",
        ),  # verl#6046
    ],
)
def test_resumed_partial_rollout_routes_are_p505_through_the_cli(case, message):
    result = cli("check", "--from", "verl", fixture("verl", case), *PAGE, "--format", "json")
    assert result.exit_code == 1, result.output
    errors = [f for f in findings(result) if f[0] != "P504"]
    assert [(f[0], f[1]) for f in errors] == [("P505", "3e0f01")] and message in errors[0][4], errors


def test_moe_dumps_of_a_correct_run_audit_clean_with_p505_run():
    """vLLM routes (every position but the last sampled token: null there, read by no log-prob) audit
    clean; a call resumed across a weight update, each attempt's rows with its version (verl's merge at
    HEAD), has only P504's info (two versions in one episode)."""
    vllm = cli("check", "--from", "verl", fixture("verl", "compliant_routes_vllm"), *PAGE, "--format", "json")
    assert vllm.exit_code == 0 and findings(vllm) == [], vllm.output
    assert "P505" not in {n["code"] for n in json.loads(vllm.stdout)["not_run"]}
    resumed = cli("check", "--from", "verl", fixture("verl", "fully_async_routes"), *PAGE, "--format", "json")
    assert resumed.exit_code == 0 and {f[0] for f in findings(resumed)} == {"P504"}, resumed.output
    table = to_contract(read_dump(fixture("verl", "fully_async_routes")), **CONTEXT).to_pylist()
    versions = [t["policy_version"] for t in table[1]["turns"]]
    assert versions == [7, 7, 8]  # the resumed call is one turn per attempt
    assert table[1]["routed_experts_version"].count(8) == len(table[1]["turns"][2]["sampled_token_ids"])


def test_dapo_overlong_penalty_over_tool_tokens_is_r414_and_single_turn_is_clean():
    """verl's DAPO manager counts the attention mask past the prompt, tool responses included
    (dapo.py:121-126): on a ToolAgentLoop sample the penalty is not the one of the policy's tokens."""
    bad = cli("check", "--from", "verl", fixture("verl", "dapo_overlong_counts_tool_tokens"), *PAGE, *DAPO,
              "--format", "json")  # fmt: skip
    assert bad.exit_code == 1 and [(f[0], f[1]) for f in findings(bad)] == [("R414", "d91a01")], bad.output
    assert "expected 0" in findings(bad)[0][4]
    good = cli("check", "--from", "verl", fixture("verl", "compliant_dapo"), *PAGE, *DAPO, "--format", "json")
    assert good.exit_code == 0 and findings(good) == []
    assert "R414" not in {n["code"] for n in json.loads(good.stdout)["not_run"]}
    without = cli(
        "check", "--from", "verl", fixture("verl", "dapo_overlong_counts_tool_tokens"), *PAGE, "--format", "json"
    )
    assert without.exit_code == 0 and "R414" in {n["code"] for n in json.loads(without.stdout)["not_run"]}


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("engine_calls", 1, "routed_experts_versions"), [[3, "seven"]], "routed_experts_versions"),
        (("engine_calls", 1, "routed_experts_rows"), 10**12, "routed_experts_rows"),  # never expanded
        (("engine_calls", 1, "routed_experts_versions"), [[10**12, 7]], "routed_experts_versions"),
    ],
)
def test_malformed_route_provenance_exits_2_naming_it(tmp_path, path, value, named):
    recs = read_dump(fixture("verl", "fully_async_routes"))
    node = recs[1]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = tmp_path / "dump.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = cli("check", "--from", "verl", bad, *PAGE)
    assert result.exit_code == 2 and named in result.stderr and "Traceback" not in result.output


def test_verl_classes_carry_routes_from_the_engine_to_the_trainer_hook():
    """verl 0.9.1's TokenOutput through HEAD's resume merge with the hook's `attempt` line (vLLM: each
    attempt routes all but its last token), its AgentLoopOutput, and a DataProto holding the routes as
    `_postprocess` aligns them (a zero row for the last token) with the row count verl copied from
    extra_fields: both hooks digest the engine's rows, and the runs name each attempt's rows."""
    pytest.importorskip("verl")
    import numpy as np
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.workers.rollout.replica import TokenOutput

    from rollout_audit.adapters.routes import digest
    from rollout_audit.integrations.verl import attempt, batch_records, engine_call, record

    rng = np.random.default_rng(0)
    prompt, ids = [5, 6, 7], [11, 12, 13, 14]
    final = TokenOutput(token_ids=[], log_probs=[], extra_fields={})
    for n, version in ((2, 7), (2, 8)):  # aborted after two tokens, resumed on newer weights
        new = ids[len(final.token_ids) : len(final.token_ids) + n]
        routes = rng.integers(0, 8, (len(prompt) + len(final.token_ids) + n - 1, 2, 2), dtype=np.int16)
        out = TokenOutput(token_ids=new, routed_experts=routes, extra_fields={"global_steps": version})
        before = final.routed_experts
        final.token_ids.extend(new)
        final.routed_experts = routes if before is None else np.concatenate([before, routes[-n:]])
        attempt(final, out, before)
    call = engine_call(prompt, final)
    assert call["attempts"] == [[2, 7], [2, 8]] and call["routed_experts_versions"] == [[4, 7], [2, 8]]
    output = AgentLoopOutput(prompt_ids=prompt, response_ids=ids, response_mask=[1] * 4, routed_experts=final.routed_experts,
                             metrics=AgentLoopMetrics(), extra_fields={})  # fmt: skip
    rec = record(output, request_id="r0", uid="u0", engine_calls=[call])
    assert (
        rec["routed_experts_sha256"] == digest(final.routed_experts) and output.extra_fields["routed_experts_rows"] == 6
    )
    batch = _dataproto([{**rec, "response_logprobs": [0.0] * 4, "reward_score": 1.0}], {})
    aligned = torch.zeros(1, 7, 2, 2, dtype=torch.int16)
    aligned[0, :6] = torch.from_numpy(final.routed_experts)
    batch.batch["routed_experts"] = aligned
    for key in ("routed_experts_rows", "overlong_reward"):  # agent_loop.py:1129-1135, ray_trainer.py:1636
        batch.non_tensor_batch[key] = np.array(
            [{"routed_experts_rows": 6, "overlong_reward": -0.25}[key]], dtype=object
        )
    trained = batch_records(batch, 5, {})[0]
    assert trained["routed_experts_sha256"] == rec["routed_experts_sha256"] and trained["overlong_reward"] == -0.25
    row = to_contract([rec], **CONTEXT).to_pylist()[0]
    assert row["routed_experts_version"] == [7, 7, 7, 7, 8, 8, None]
    assert [t["policy_version"] for t in row["turns"]] == [7, 8]


def test_convert_carries_the_overlong_settings_to_the_written_log(tmp_path):
    found = convert_then_check_equals_check_from(
        "verl", "dapo_overlong_counts_tool_tokens", tmp_path, context=[*PAGE_CONTEXT, *DAPO_CONTEXT]
    )
    assert [(f[0], f[1]) for f in found] == [("R414", "d91a01")]


# ---------------------------------------------------------------- verl's own generations file (trainer.rollout_data_dir)


def _v1_run(tmp_path, edit=None):
    """`compliant_v1` laid out as a V1 run leaves trainer.rollout_data_dir: the wrapper's and the V1
    trainer's records under rollout-audit/, verl's generations rows in `5.jsonl` (edited by `edit`)."""
    from rollout_audit.adapters.verl import _kind

    recs = [dict(r) for r in read_dump(fixture("verl", "compliant_v1"))]
    gens = [r for r in recs if _kind(r) == "generations"]
    if edit:
        edit(gens)
    (tmp_path / "rollout-audit").mkdir()
    (tmp_path / "rollout-audit" / "verl-a.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in recs if _kind(r) != "generations")
    )
    (tmp_path / "5.jsonl").write_text("".join(json.dumps(g) + "\n" for g in gens))
    return tmp_path


def test_generations_give_the_rewards_the_agent_loop_could_not_record(tmp_path):
    """The wrapper dumps before verl scores (reward_score null); verl's `{step}.jsonl` joined by the
    V1 key (`uid`) gives each sample its reward: R-family and U603 run, clean."""
    from rollout_audit.adapters.verl import _kind

    recs = [dict(r) for r in read_dump(fixture("verl", "compliant_v1"))]
    loop_only = [r for r in recs if _kind(r) != "trainer"]
    rows = to_contract(loop_only, **CONTEXT).to_pylist()
    assert [r["reward"] for r in rows] == [0.0, 1.0, 0.0, 1.0]
    result = cli("check", "--from", "verl", _v1_run(tmp_path), *PAGE, "--format", "json")
    rep = json.loads(result.stdout)
    assert result.exit_code == 0 and rep["findings"] == [], result.output
    assert "U603" in rep["summary"]["checks_run"]


def test_legacy_generations_join_by_request_id(tmp_path):
    """The legacy trainer writes `request_id` (the wrapper's, through extra_fields) beside `uid`-less rows."""
    recs = [dict(r) for r in read_dump(fixture("verl", "compliant"))]
    gens = [
        {"input": "p", "output": "r", "gts": None, "score": r["reward_score"], "step": 5, "request_id": r["request_id"]}
        for r in recs
    ]
    for r in recs:
        r["reward_score"] = None
    rows = to_contract([*recs, *gens], **CONTEXT).to_pylist()
    assert [r["reward"] for r in rows] == [g["score"] for g in gens]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda g: g[1].update(uid="7c1f_9_0"), "5.jsonl:2: uid '7c1f_9_0' matches no agent-loop record's request_id"),
        (lambda g: g[2].pop("uid"), "5.jsonl:3: verl generations row has neither request_id"),
        (lambda g: g[3].update(uid=g[0]["uid"]), "5.jsonl:4: uid '7c1f_0_0' is also the row of"),
        (
            lambda g: g[0].update(score=0.5),
            "5.jsonl:1: score 0.5 differs from the sample's reward 0.0 (uid '7c1f_0_0')",
        ),
        (lambda g: g[0].update(score="high"), "5.jsonl:1: score: expected a number, got str 'high'"),
    ],
)
def test_a_generations_row_that_does_not_join_is_exit_2_naming_it(tmp_path, edit, message):
    result = cli("check", "--from", "verl", _v1_run(tmp_path, edit), *PAGE)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def _v1_trainer_records():
    from rollout_audit.adapters.verl import _kind

    return [dict(r) for r in read_dump(fixture("verl", "compliant_v1")) if _kind(r) == "trainer"]


def test_v1_updates_one_per_advantage_step_numbered_by_parameter_sync_step():
    """separate_async's parameter_sync_step local updates per global step are updates of their own:
    update_step (global_steps - 1) * parameter_sync_step + local_trigger_step + 1, all from version
    global_steps - 1."""
    from rollout_audit.adapters.verl import updates

    recs = _v1_trainer_records()
    for k, r in enumerate(recs):
        r |= {"parameter_sync_step": 2, "local_trigger_step": k // 2, "trainer_mode": "separate_async"}
    ups = updates(recs).to_pylist()
    assert [(u["update_step"], u["trainer_version"], u["trajectory_ids"]) for u in ups] == [
        (9, 4, ["7c1f_0_0", "7c1f_1_0"]),
        (10, 4, ["e2a9_0_0", "e2a9_1_0"]),
    ]


def test_v1_grpo_over_sessions_with_several_outputs_is_not_recomputed():
    """V1's GRPO groups each session's final output and broadcasts its advantage to the session's
    other outputs: the statistics members are the final outputs, and U603 is not run, saying why."""
    from rollout_audit.adapters.verl import updates
    from rollout_audit.contract import schema as S

    recs = _v1_trainer_records()
    recs.append({**recs[0], "request_id": "7c1f_0_1"})  # a second output of session 7c1f_0
    table = updates(recs)
    (u,) = table.to_pylist()
    assert sorted(u["stat_trajectory_ids"]) == ["7c1f_0_1", "7c1f_1_0", "e2a9_0_0", "e2a9_1_0"]
    assert u.get("advantage_estimator") is None
    why = json.loads(table.schema.metadata[S.META_NOT_RECORDED])["advantage_estimator"]
    assert "final output" in why


def test_the_gae_fixture_is_verls_own_gae():
    """compliant_gae's returns are what verl 0.9.1's compute_gae_advantage_return makes of its rewards,
    values and response_mask (within float32); trainer_gae_over_every_position's differ exactly on the
    rows with a masked span (the tool episodes)."""
    pytest.importorskip("verl")
    import torch
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    for case, bug in (("compliant_gae", False), ("trainer_gae_over_every_position", True)):
        for r in (r for r in read_dump(fixture("verl", case)) if "values" in r):
            row = {k: torch.tensor([r[k]], dtype=torch.float32) for k in ("token_level_rewards", "values", "returns")}
            mask = torch.tensor([r["response_mask"]], dtype=torch.float32)
            _, ret = compute_gae_advantage_return(row["token_level_rewards"], row["values"], mask, r["gamma"], r["lam"])
            on = mask.bool()
            same = torch.allclose(ret[on], row["returns"][on], atol=1e-5)
            assert same == (not bug or all(r["response_mask"])), (case, r["request_id"])


def test_verls_own_gae_through_the_trainer_hook_runs_r416_clean(tmp_path):
    """verl 0.9.1's compute_advantage with a critic (adv_estimator gae) on the compliant batch, dumped by
    dump_batch: the hook records values and lam, R416 runs and holds; the same dump with returns made
    by an every-position recursion is R416 on the tool episodes."""
    pytest.importorskip("verl")
    import torch
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from rollout_audit.integrations.verl import dump_batch

    out = tmp_path / "gae"
    out.mkdir()
    samples = [dict(r) for r in read_dump(fixture("verl", "compliant"))]
    (out / "verl-sampler.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    batch = _dataproto(samples, {})
    gen = torch.Generator().manual_seed(0)
    batch.batch["values"] = torch.rand(batch.batch["responses"].shape, generator=gen) * 2 - 1
    algorithm = AlgoConfig(adv_estimator="gae", gamma=0.99, lam=0.95)
    batch = compute_advantage(batch, adv_estimator="gae", gamma=0.99, lam=0.95, config=algorithm)
    dump_batch(out, batch, 5, algorithm)
    rows = [json.loads(x) for f in sorted(out.glob("verl-batch-*.jsonl")) for x in f.read_text().splitlines()]
    assert all(r["lam"] == 0.95 and len(r["values"]) == len(r["responses"]) for r in rows)
    result = cli("check", "--from", "verl", out, *PAGE, "--preview", "--format", "json")
    rep = json.loads(result.stdout)
    assert result.exit_code == 0 and rep["findings"] == [], result.output
    assert "R416" in rep["summary"]["checks_run"]


def test_verl_041_gae_over_every_position_is_r416_naming_the_tool_output_value():
    case = fixture("verl", "trainer_gae_over_every_position")
    result = cli("check", "--from", "verl", case, *PAGE, "--preview", "--format", "json")
    rep = json.loads(result.stdout)
    r416 = [f for f in rep["findings"] if f["code"] == "R416"]
    assert result.exit_code == 1 and {f["trajectory_id"] for f in r416} == {"e2a900", "e2a901"}, result.output
    assert {f["code"] for f in rep["findings"]} == {"R416"}
    f = next(f for f in r416 if f["trajectory_id"] == "e2a901")
    assert f["position"] == 58 and f["message"].endswith(
        "it is GAE over every position, which bootstraps from V = 0.9155 at position 59, a masked observation token"
    )


def test_a_grpo_step_says_why_r416_is_not_run():
    rep = audit("verl", "trainer_compliant", preview=True)
    assert "algorithm.adv_estimator=gae" in rep.not_run["R416"]


def test_a_gae_record_without_lam_exits_2_naming_it(tmp_path):
    recs = [dict(r) for r in read_dump(fixture("verl", "compliant_gae"))]
    del recs[5]["lam"]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = cli("check", "--from", "verl", tmp_path / "d.jsonl", *PAGE)
    assert result.exit_code == 2 and "d.jsonl:6 (7c1f01): missing field 'lam'" in result.output, result.output
