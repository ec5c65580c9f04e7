"""verl adapter: the compliant fixture audits clean with the not-run list docs/frameworks/verl.md
predicts, with the engine-side checks (M105, M106, M107) run; verl#6501 (a dropped turn separator)
is M107; a Search-R1-style mask built on a re-encoded transcript is M101 against the engine's
record of what it sampled; the CLI paths agree."""

from __future__ import annotations

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
)

import rollout_audit as ra
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


def test_top_k_off_is_accepted_and_a_cutoff_or_bad_value_exits_2(tmp_path):
    src = fixture("verl", "compliant")
    for value in ("-1", "0"):
        ok = cli("check", "--from", "verl", src, *context_args(), "--context", f"top_k={value}")
        assert ok.exit_code == 0, ok.output + ok.stderr
    for kv, says in (
        ("top_k=50", "top_k=50"),
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
