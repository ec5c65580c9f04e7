"""verl adapter: the compliant fixture audits clean with the not-run list docs/frameworks/verl.md
predicts, with the engine-side checks (M105, M106, M107) run; verl#6501 (a dropped turn separator)
is M107; a Search-R1-style mask built on a re-encoded transcript is M101 against the engine's
record of what it sampled; the CLI paths agree."""

from __future__ import annotations

from adapterhelp import (
    CONTEXT,
    audit,
    convert_then_check_equals_check_from,
    documented_not_run,
    fixture,
    missing_field_exits_2,
)

import rollout_audit as ra
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
