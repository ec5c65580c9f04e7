"""Rough edges a new user met, each fixed and kept fixed through the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rollout_audit as ra
from rollout_audit.cli import main

ROOT = Path(__file__).resolve().parent.parent
COMPLIANT = ROOT / "fixtures" / "compliant"
WARNING_ONLY = ROOT / "fixtures" / "broken" / "action_loop"


def cli(*args: object, env: dict | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def test_stats_reductions_are_a_list_not_letters():
    text = cli("stats", COMPLIANT)
    assert text.exit_code == 0 and text.output.strip().endswith("reductions token"), text.output
    d = json.loads(cli("stats", COMPLIANT, "--format", "json").stdout)
    assert d["updates"]["reductions"] == ["token"]


def test_dir_lists_the_lazy_names():
    out = subprocess.run(
        [sys.executable, "-c", "import rollout_audit as ra; print(' '.join(dir(ra)))"],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT)},
    ).stdout.split()
    assert {"audit", "scan", "RolloutWriter", "Report", "Config"} <= set(out)


def test_quiet_prints_nothing_for_an_info_finding_on_a_passing_log(tmp_path):
    table = pq.read_table(COMPLIANT / "trajectories" / "part-0000.parquet").slice(0, 32)
    pq.write_table(table, tmp_path / "part.parquet")
    assert "G702 [info]" in cli("check", tmp_path).output  # the finding is there when not quiet
    for fmt in ("text", "concise"):
        res = cli("check", tmp_path, "-q", "--format", fmt)
        assert res.exit_code == 0 and res.output == "", res.output


def test_color_asked_for_wins_over_no_color():
    res = cli("check", WARNING_ONLY, "--color", env={"NO_COLOR": "1"})
    assert "\x1b[1;32mok\x1b[0m" in res.output and "\x1b[33mR409 [warning]\x1b[0m" in res.output
    assert "\x1b[" not in cli("check", WARNING_ONLY, env={"NO_COLOR": "1"}).output


def test_did_you_mean_for_a_configuration_key_and_a_context_key(tmp_path):
    cfg = tmp_path / "typo.toml"
    cfg.write_text("[tool.rollout-audit]\nmax_respons_tokens = 3\n")
    res = cli("check", COMPLIANT, "--config", cfg)
    assert res.exit_code == 2 and "did you mean 'max_response_tokens'?" in res.output
    dump = ROOT / "fixtures" / "frameworks" / "skyrl" / "compliant.jsonl"
    res = cli("check", "--from", "skyrl", dump, "--context", "reset_sed=3")
    assert res.exit_code == 2 and "did you mean 'reset_seed'?" in res.output


def test_fixture_configuration_lives_where_a_users_does_and_the_hook_blocks_its_warnings():
    yaml = __import__("pytest").importorskip("yaml")
    broken = ROOT / "fixtures" / "broken" / "budget_cut_logged_as_terminated"
    res = cli("check", broken, "--format", "json")
    assert {f["code"] for f in json.loads(res.stdout)["findings"]} == {"T306"}  # configured from its pyproject.toml
    assert res.exit_code == 0  # a warning: exit 0 without --strict
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert cli(*hook["entry"].split()[1:], broken).exit_code == 1
    assert cli(*hook["entry"].split()[1:], COMPLIANT).exit_code == 0


def test_users_read_the_contracts_field_names_not_internal_columns(tmp_path):
    from rollout_audit.faults import read_records, write_records

    t, u = read_records(COMPLIANT)
    for tr in t:
        for turn in tr["turns"]:
            del turn["policy_version"]
    write_records(tmp_path / "log", t, u)
    rep = json.loads(cli("check", tmp_path / "log", "--format", "json").stdout)
    reasons = {x["code"]: x["reason"] for x in rep["not_run"]}
    assert "turns.policy_version" in reasons["P504"], reasons
    internal = ("pv_min", "pv_max", "n_trainable", "n_policy", "rc_n_", " ok,")
    assert not [r for r in reasons.values() if any(x in r for x in internal)], reasons
    for code in ("P503", "P504", "U601", "U605"):
        text = cli("explain", code).output
        assert not any(x in text.split("Needs:")[1] for x in internal), text


@pytest.mark.slow  # a pytest run of its own in a subprocess
def test_assert_clean_failure_shows_no_frame_of_the_library(tmp_path):
    test = tmp_path / "test_user.py"
    test.write_text(
        "from rollout_audit.testing import assert_clean\n\n"
        f"def test_log():\n    assert_clean({str(ROOT / 'fixtures' / 'broken' / 'tool_tokens_trained')!r})\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        # the user's own pytest, without the plugins of this environment (torch, hypothesis...): a
        # failure's frames are pytest's doing and the library's, never a plugin's
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        timeout=300,
    )
    assert res.returncode == 1 and "the rollout log is not clean" in res.stdout and "M101" in res.stdout
    assert "rollout_audit/testing.py" not in res.stdout and "rollout_audit/running" not in res.stdout, res.stdout


def test_not_run_is_one_line_before_the_verdict_and_expands_on_request():
    not_run = sorted(ra.audit(COMPLIANT).not_run)
    lines = cli("check", COMPLIANT).output.strip().splitlines()
    assert f"not run: {', '.join(not_run)} (--show-not-run for why)" in lines[-4:] and lines[-1].startswith("ok:")
    full = cli("check", COMPLIANT, "--show-not-run").output.strip().splitlines()
    k = full.index("not run:")
    assert full[k + 1].startswith("  L205: replay is off") and len(full) - k <= len(not_run) + 4
    assert full[-1].startswith("ok:")


def test_github_format_on_a_clean_log_is_one_notice_naming_every_check_not_run():
    not_run = sorted(ra.audit(COMPLIANT).not_run)
    res = cli("check", COMPLIANT, "--format", "github")
    assert res.exit_code == 0
    (line,) = res.stdout.strip().splitlines()
    assert line.startswith(f"::notice title={len(not_run)} checks not run::")
    assert all(code in line for code in not_run)
