"""`check --format sarif`: SARIF 2.1.0 as code scanning reads it, validated against the official
OASIS schema (tests/data/sarif-schema-2.1.0.json, errata01) and parsed back: the right rules and
results on a broken log, none on a compliant one, the exit code and execution state of an audit
that could not complete, hostile ids intact."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from hostilehelp import EVIL_ID, assert_clean_exit, cli, write

from rollout_audit.synth import make_log

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))


def sarif(*args: str, codes: tuple[int, ...], cwd: Path = ROOT) -> dict:
    """`check ARGS --format sarif` through the CLI: its exit code checked, its output valid SARIF."""
    r = cli("check", *args, "--format", "sarif", cwd=cwd)
    assert_clean_exit(r, codes)
    log = json.loads(r.stdout)
    jsonschema.Draft4Validator(SCHEMA).validate(log)
    assert log["version"] == "2.1.0"
    return log


def test_broken_log_gives_its_findings_as_results():
    log = sarif("fixtures/broken/loss_over_whole_transcript", codes=(1,))
    (run,) = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert {r["ruleId"] for r in run["results"]} == {"U601", "U602"}  # fixtures/README.md's expected codes
    for res in run["results"]:
        assert res["level"] == "error"
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
        assert rules[res["ruleIndex"]]["defaultConfiguration"]["level"] == "error"
        (loc,) = res["locations"]
        uri = loc["physicalLocation"]["artifactLocation"]["uri"]
        assert uri == "fixtures/broken/loss_over_whole_transcript/updates/updates.parquet"
    inv = run["invocations"][0]
    assert inv["executionSuccessful"] is True and inv["exitCode"] == 1
    not_run = {n["descriptor"]["id"] for n in inv["toolExecutionNotifications"] if n["level"] == "note"}
    assert "L205" in not_run  # replay is off: said, never silently missing
    assert {r["id"] for r in rules} >= {"S001", "U601", "U602", "L205"}


def test_trajectory_findings_name_trajectory_and_turn():
    (run,) = sarif("fixtures/broken/two_stop_flags", codes=(1,))["runs"]
    by_rule = {r["ruleId"]: r for r in run["results"]}
    assert {"T301", "R405"} <= set(by_rule)
    (logical,) = by_rule["R405"]["locations"][0]["logicalLocations"]
    assert logical["fullyQualifiedName"].startswith("trajectory[") and "/turn[" in logical["fullyQualifiedName"]
    assert by_rule["R405"]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith(".parquet")


def test_compliant_log_has_no_results():
    (run,) = sarif("fixtures/compliant", codes=(0,))["runs"]
    assert run["results"] == []
    inv = run["invocations"][0]
    assert inv["executionSuccessful"] is True and inv["exitCode"] == 0
    assert run["tool"]["driver"]["rules"]


def test_incomplete_audit_is_unsuccessful_exit_2():
    (run,) = sarif("fixtures/compliant", "--select", "L205", codes=(2,))["runs"]
    inv = run["invocations"][0]
    assert inv["executionSuccessful"] is False and inv["exitCode"] == 2
    errors = [n for n in inv["toolExecutionNotifications"] if n["level"] == "error"]
    assert any(n.get("descriptor", {}).get("id") == "L205" for n in errors)
    assert any("no check ran" in n["message"]["text"] for n in errors)


def test_several_logs_are_one_run_each():
    log = sarif("fixtures/compliant", "fixtures/broken/loss_over_whole_transcript", codes=(1,))
    assert [len(r["results"]) for r in log["runs"]] == [0, 2]
    assert [r["invocations"][0]["exitCode"] for r in log["runs"]] == [0, 1]
    ids = [r["automationDetails"]["id"] for r in log["runs"]]
    assert ids == ["rollout-audit/fixtures/compliant/", "rollout-audit/fixtures/broken/loss_over_whole_transcript/"]


def test_hostile_strings_stay_intact_json(tmp_path):
    trajs = [dict(t) for t in make_log(n_tasks=2, group_size=2, n_versions=1, seed=3)[0]]
    trajs[0]["trajectory_id"] = trajs[1]["trajectory_id"] = EVIL_ID  # S002 names the id
    trajs[2]["stop_reason"] = 'weird"}\\\n::error file=x,line=1::forged\x1b[2J\u202e'
    root = write(tmp_path / "ev\nil,a::b%", trajs)
    log = sarif(str(root), codes=(1,), cwd=tmp_path)
    text = json.dumps(log)
    assert "\x1b" not in text and "\u202e" not in text
    (run,) = log["runs"]
    names = [
        ll["fullyQualifiedName"] for r in run["results"] for loc in r["locations"] for ll in loc["logicalLocations"]
    ]
    assert any(":\\x3aerror file=evil.py,line=1:\\x3aforged" in n and "\\x1b" in n for n in names), names
    uris = {loc["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"] for loc in r["locations"]}
    assert uris and all(u.startswith("ev%0Ail%2Ca%3A%3Ab%25/") for u in uris), uris  # relative, percent-encoded
    (t302,) = [r["message"]["text"] for r in run["results"] if r["ruleId"] == "T302"]
    assert 'weird"}' in t302 and "forged\\x1b[2J\\u202e" in t302  # quote and backslash kept, controls shown
    assert EVIL_ID not in text  # the raw control characters never reach the output


def test_sarif_is_a_choice_of_check_and_a_registered_format():
    from rollout_audit.cli.options import FORMATS
    from rollout_audit.reporting.report import FORMATS as REPORT_FORMATS
    from rollout_audit.running.report import formats

    assert "sarif" in FORMATS and set(FORMATS) == set(REPORT_FORMATS) == set(formats())
