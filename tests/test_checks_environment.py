"""Environment contract: E801 (versions and reset seed recorded), E802 (reset reproducible)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import write_log

import rollout_audit as ra


def blocking(rep) -> set[str]:
    return rep.codes("error") | rep.codes("warning")


def of(rep, code) -> pl.DataFrame:
    return rep.findings.filter(pl.col("code") == code)


def test_compliant_log_is_silent(records):
    rep = ra.audit(*records)
    assert not (rep.codes() & {"E801", "E802"})
    assert not ({"E801", "E802"} & set(rep.not_run))


@pytest.mark.parametrize("column,value", [("environment_version", ""), ("verifier_version", "   ")])
def test_e801_blank_version(records, column, value):
    trajs, ups = records
    trajs[3][column] = value
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"E801"}
    f = of(rep, "E801")
    assert f["trajectory_id"].to_list() == [trajs[3]["trajectory_id"]]
    assert f["message"][0] == f"{column} missing"


def test_e801_null_version_also_raises_s001(records):
    trajs, ups = records
    trajs[5]["verifier_version"] = None
    trajs[5]["environment_version"] = None
    rep = ra.audit(trajs, ups)
    assert "E801" in blocking(rep) and blocking(rep) <= {"E801", "S001"}
    f = of(rep, "E801")
    assert f["trajectory_id"].to_list() == [trajs[5]["trajectory_id"]]
    assert f["message"][0] == "environment_version missing; verifier_version missing"


def test_e801_reset_seed_missing(records):
    trajs, ups = records
    trajs[7]["reset_seed"] = None
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"E801"}
    f = of(rep, "E801")
    assert f["trajectory_id"].to_list() == [trajs[7]["trajectory_id"]]
    assert "reset_seed and initial_state_id both null" in f["message"][0]


def test_e801_initial_state_id_replaces_the_seed(records):
    trajs, ups = records
    trajs[7]["reset_seed"] = None
    trajs[7]["initial_state_id"] = "keydoor/red-17"
    assert not (ra.audit(trajs, ups).codes() & {"E801", "E802"})


def test_e801_column_absent_is_one_finding_per_file(tmp_path, records):
    trajs, ups = records
    for t in trajs:
        del t["verifier_version"]
    root = write_log(tmp_path / "log", trajs, ups, parts=2)
    rep = ra.audit(str(root))
    f = of(rep, "E801")
    assert f.height == 2 and f["trajectory_id"].null_count() == 2
    assert all(m == "column verifier_version absent: no episode of this file records it" for m in f["message"])
    assert blocking(rep) == {"E801", "S001"}


def test_e802_checksum_differs_for_same_seed(records):
    trajs, ups = records
    seed = trajs[0]["reset_seed"]
    same = [t["trajectory_id"] for t in trajs if t["reset_seed"] == seed]
    trajs[0]["initial_state_checksum"] = "deadbeefdeadbeef"
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"E802"}
    f = of(rep, "E802")
    assert sorted(f["trajectory_id"]) == sorted(same)  # every trajectory of the key is named
    good = trajs[1]["initial_state_checksum"]
    msg = dict(zip(f["trajectory_id"], f["message"]))
    expect = (
        f"environment keydoor version 1.0, reset_seed {seed}: 2 distinct initial_state_checksum over "
        f"{len(same)} trajectories ({good}: {len(same) - 1}, deadbeefdeadbeef: 1)"
    )
    assert msg[trajs[0]["trajectory_id"]] == expect + "; this one has deadbeefdeadbeef"
    assert msg[same[-1]] == expect + f"; this one has {good}"


def test_e802_across_files(tmp_path, records):
    trajs, ups = records
    last = trajs[-1]
    last["initial_state_checksum"] = "0000000000000000"
    root = write_log(tmp_path / "log", trajs, ups, parts=2)
    rep = ra.audit(str(root))
    f = of(rep, "E802")
    assert blocking(rep) == {"E802"}
    assert last["trajectory_id"] in set(f["trajectory_id"])
    assert f["file"].n_unique() == 2  # the key's trajectories live in both halves of the log


def test_e802_silent_when_key_differs(records):
    trajs, ups = records
    trajs[0]["reset_seed"] = 1000  # a different seed may give a different state
    trajs[0]["initial_state_checksum"] = "deadbeefdeadbeef"
    trajs[1]["initial_state_id"] = "alt-start"  # so may a different initial-state id
    trajs[1]["initial_state_checksum"] = "feedfacefeedface"
    trajs[2]["environment_version"] = "1.1"  # and a new environment version
    trajs[2]["initial_state_checksum"] = "cafecafecafecafe"
    assert not (ra.audit(trajs, ups).codes() & {"E801", "E802"})


def test_e802_not_run_without_checksum(records):
    trajs, ups = records
    for t in trajs:
        del t["initial_state_checksum"]
    rep = ra.audit(trajs, ups)
    assert "initial_state_checksum" in rep.not_run["E802"]
    assert not blocking(rep)
