"""The contract 1.4 rules and the capture layers' (L212, M112) on every compliant fixture (benchmarks/graduation.py): no finding on any of
them with the checks in preview on, each stable rule run on at least one of them (a rule never run there
has not been measured) and caught on a fault in a framework's own record shape and on a synthetic one;
a rule with no framework-shape fault stays in preview."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` lives at the repo root

from benchmarks.graduation import CODES, FRAMEWORK_FAULTS, caught, measure, synthetic
from rollout_audit.checks import all_rules


@pytest.fixture(scope="module")
def rows():
    return measure()


def test_no_contract_14_rule_reports_on_a_compliant_fixture(rows):
    assert len(rows) >= 30, [r.fixture for r in rows]
    unused = [r.fixture for r in rows if not r.commands]
    assert not unused, f"compliant fixtures no documented command audits clean: {unused}"
    found = {(r.fixture, c): n for r in rows for c, n in r.found.items() if n}
    assert not found, found


def test_a_stable_rule_ran_on_compliant_fixtures_and_catches_both_faults(rows):
    shape = caught()
    synth = synthetic()
    for code in CODES:
        assert synth[code], f"{code} has no synthetic fault"
        assert all(n > 0 for n in shape[code].values()), (code, shape[code])
        if all_rules()[code].preview:
            continue
        ran = [r.fixture for r in rows if r.ran.get(code)]
        assert ran, f"{code} is stable but ran on no compliant fixture"
        assert FRAMEWORK_FAULTS[code], f"{code} is stable without a fault in a framework's record shape"


def test_a_rule_without_a_framework_shape_fault_stays_in_preview():
    for code in CODES:
        if not FRAMEWORK_FAULTS[code]:
            assert all_rules()[code].preview, f"{code} graduated without a fault in a framework's record shape"
