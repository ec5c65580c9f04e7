"""verifiers adapter: `RolloutOutput` rows with their trajectory audit clean with the not-run list
docs/frameworks/verifiers.md predicts; a stored prompt missing the assistant header the server rendered
(PrimeIntellect-ai/verifiers#476) is M105 on the trajectory's second turn."""

from __future__ import annotations

from pathlib import Path

from adapterhelp import (
    IDENTITY,
    documented_not_run,
    fails_naming,
    finding_keys,
    fixture,
    records,
    report,
    same_after_convert,
    without,
)

CONTEXT = [*IDENTITY, "policy_version=3"]


def test_compliant_audits_clean_with_the_documented_not_run_list() -> None:
    rep = report([fixture("verifiers", "compliant")], "verifiers", CONTEXT)
    assert rep["findings"] == []
    assert {n["code"] for n in rep["not_run"]} == documented_not_run("verifiers")


def test_v1_trace_audits_clean_without_an_engine_context() -> None:
    rep = report([fixture("verifiers", "v1_compliant")], "verifiers", CONTEXT)
    assert rep["findings"] == []
    assert {n["code"] for n in rep["not_run"]} == documented_not_run("verifiers") | {"M105"}


def test_missing_assistant_header_is_m105_on_the_turn() -> None:
    rep = report([fixture("verifiers", "assistant_header_missing")], "verifiers", CONTEXT)
    assert finding_keys(rep) == [("M105", "rollout-1", 1)]


def test_convert_then_check_equals_check_from(tmp_path: Path) -> None:
    same_after_convert("verifiers", "assistant_header_missing", CONTEXT, tmp_path)


def test_missing_field_exits_2_naming_it(tmp_path: Path) -> None:
    recs = records("verifiers", "compliant")
    fails_naming(
        "verifiers",
        [without(recs[0], ["trajectory", 1, "tokens", "completion_logprobs"])],
        "completion_logprobs",
        tmp_path,
    )
