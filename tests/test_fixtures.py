"""The committed fixtures: the compliant agent log is clean, every broken log raises exactly
its manifest's codes naming the touched trajectories, and the fixtures match the generator."""

from __future__ import annotations

import json

import polars as pl
import pytest

import rollout_audit as ra
from reference_agent.fixtures import FIXTURES, drift, generate
from rollout_audit.config import Config

MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def serious(rep) -> pl.DataFrame:
    return rep.findings.filter(pl.col("severity").is_in(["error", "warning"]))


def test_compliant_agent_log_is_clean():
    rep = ra.audit(FIXTURES / "compliant")
    assert serious(rep).is_empty(), rep.render()
    # replay is off by default; R408 runs on the declaration; T306 needs max_response_tokens; no
    # template render recorded (M107)
    assert set(rep.not_run) == {"T306", "M107", "L205", "L206", "L207"}
    assert rep.summary["rows_read"] > 100


@pytest.mark.parametrize("name", sorted(MANIFEST["faults"]))
def test_broken_fixture_raises_its_codes(name):
    entry = MANIFEST["faults"][name]
    rep = ra.audit(FIXTURES / "broken" / name, config=Config.from_mapping(entry["config"]))
    found = serious(rep)
    assert set(found["code"].to_list()) == set(entry["codes"]), rep.render()
    named = set(found.filter(pl.col("code").is_in(entry["codes"]))["trajectory_id"].drop_nulls().to_list())
    assert set(entry["touched"]) <= named


def test_every_fault_has_a_fixture():
    from rollout_audit.faults import FAULTS

    assert set(MANIFEST["faults"]) == set(FAULTS)


def test_fixtures_match_the_generator(tmp_path):
    pytest.importorskip("torch")
    generate(tmp_path)
    assert drift(FIXTURES, tmp_path) == []
