"""slime adapter: the compliant fixture audits clean with the not-run list docs/frameworks/slime.md
predicts; an OpenRLHF-style episode cut at the response budget but COMPLETED is T306; partial
rollouts (several weight_versions per turn) audit clean; a removed sample is out of the loss; the
per-rollout denominators are recomputed (U601)."""

from __future__ import annotations

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


def test_partial_rollout_audits_clean_with_the_first_calls_version():
    """A resumed sample has two weight_versions for its one turn: the turn gets the first call's."""
    rep = audit("slime", "partial_rollout", max_response_tokens=BUDGET)
    assert rep.findings.is_empty(), rep.render()
    turns = _turns("partial_rollout")
    assert [t["policy_version"] for t in turns["1"]] == [4] and [t["policy_version"] for t in turns["0"]] == [5]


def test_partial_rollout_with_the_stale_prefix_masked_keeps_it_as_policy_tokens():
    table = load("slime").to_contract(
        read_dump(fixture("slime", "partial_rollout_mask_offpolicy")), **CONTEXT, mask_offpolicy_in_partial_rollout="1"
    )
    rep = ra.audit_tables(table, config=Config(max_response_tokens=BUDGET))
    assert rep.codes("error") == set() and rep.codes() == {"M102"}  # the masked stale prefix, as slime masks it
    row = table.slice(1, 1).to_pylist()[0]
    resp = row["token_source"][-6:], row["loss_mask"][-6:]
    assert resp == ([2] * 6, [False] * 3 + [True] * 3)


@pytest.mark.parametrize(
    ("calls", "turns", "expected"),
    [
        (["3", "3", "3"], 3, [3, 3, 3]),  # one call per turn
        (["3", "4"], 1, [3]),  # a resumed single turn: its first call
        (["3", "3", "4"], 2, [3, None]),  # turn 1 began at call 1 (3) or call 2 (4): not placed
        (["3", "4", "4"], 2, [3, 4]),  # either way turn 1's first call has version 4
        (["5"], 3, [5, 5, 5]),  # one version in all
        (["3", "4"], 3, [3, None, None]),  # fewer calls than turns
        (["v1"], 1, [None]),  # not an integer: nothing to order
    ],
)
def test_versions_per_call_are_placed_on_turns_only_where_the_list_fixes_them(calls, turns, expected):
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
