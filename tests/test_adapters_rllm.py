"""rLLM adapter: `Episode.to_dict()` dumps audit clean with the not-run list docs/frameworks/rllm.md
predicts; missing log-probs (rLLM's transform pads them with 0.0) are L201 on the trajectory."""

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

CONTEXT = [*IDENTITY, "temperature=0.7", "top_p=1.0"]


def test_compliant_audits_clean_with_the_documented_not_run_list() -> None:
    rep = report([fixture("rllm", "compliant")], "rllm", CONTEXT)
    assert rep["findings"] == []
    assert {n["code"] for n in rep["not_run"]} == documented_not_run("rllm")


def test_missing_logprobs_are_l201_on_the_trajectory() -> None:
    rep = report([fixture("rllm", "logprobs_missing")], "rllm", CONTEXT)
    assert finding_keys(rep) == [("L201", "task-7:1/solver", 1)]


def test_convert_then_check_equals_check_from(tmp_path: Path) -> None:
    same_after_convert("rllm", "logprobs_missing", CONTEXT, tmp_path)


def test_missing_field_exits_2_naming_it(tmp_path: Path) -> None:
    recs = records("rllm", "compliant")
    bad = without(recs[0], ["trajectories", 0, "steps", 1, "model_output", "completion_ids"])
    fails_naming("rllm", [bad, *recs[1:]], "completion_ids", tmp_path)


def test_records_of_the_wrong_shape_exit_2_in_one_line(tmp_path: Path) -> None:
    fails_naming("rllm", [{"id": "t:0", "trajectories": 5}], "malformed record", tmp_path)
