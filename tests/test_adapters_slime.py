"""slime adapter: the compliant fixture audits clean with the not-run list docs/frameworks/slime.md
predicts; an OpenRLHF-style episode cut at the response budget but COMPLETED is T306."""

from __future__ import annotations

import pytest
from adapterhelp import (
    audit,
    convert_then_check_equals_check_from,
    documented_not_run,
    missing_field_exits_2,
)

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
