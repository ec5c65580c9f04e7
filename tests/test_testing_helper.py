"""`rollout_audit.testing.assert_clean` and its pytest fixture, on real logs and in-memory tables."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from rollout_audit.faults import apply, read_records
from rollout_audit.testing import assert_clean

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_a_clean_log_passes_and_returns_its_report():
    rep = assert_clean(FIXTURES / "compliant")
    assert rep.ok and rep.complete


def test_a_broken_log_fails_with_the_verdict_and_the_findings():
    with pytest.raises(AssertionError) as e:
        assert_clean(FIXTURES / "broken" / "loss_over_whole_transcript")
    msg = str(e.value)
    assert msg.splitlines()[0].startswith("the rollout log is not clean: FAIL: 2 errors")
    assert "U601 [error]" in msg and "loss_denominator 1992 recorded, expected 59" in msg and "\nnot run:" not in msg


def test_in_memory_tables_with_select_ignore_and_strict():
    trajs, ups = read_records(FIXTURES / "compliant")
    (bt, bu), _ = apply("action_loop", copy.deepcopy(trajs), copy.deepcopy(ups))  # one R409 warning
    assert_clean(bt, bu)
    with pytest.raises(AssertionError, match="R409 \\[warning\\]"):
        assert_clean(bt, bu, strict=True)
    assert_clean(bt, bu, strict=True, ignore=["R409"])
    assert assert_clean(bt, bu, select=["M"]).summary["checks_run"][0] == "M101"


def test_nothing_to_audit_fails_saying_why():
    _, ups = read_records(FIXTURES / "compliant")
    with pytest.raises(AssertionError, match="nothing to audit: the log holds no trajectory records"):
        assert_clean(None, ups)


def test_the_pytest_plugin_provides_the_fixture(rollout_audit_clean):
    assert rollout_audit_clean is assert_clean
    with pytest.raises(AssertionError, match="R408"):
        rollout_audit_clean(FIXTURES / "broken" / "first_visit_paid_twice")
