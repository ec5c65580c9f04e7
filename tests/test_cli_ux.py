"""The command line as a linter user meets it: exit codes, no cascades from one unreadable file,
one error style, the concise and quiet formats, several logs, colour, help and listings."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rollout_audit as ra
from rollout_audit.cli import main
from rollout_audit.contract.schema import META_REWARD_COMPONENTS
from rollout_audit.faults import FAULTS, read_records, write_records
from rollout_audit.reporting.stats import MAX_VERSION_BINS, _versions

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
COMPLIANT = FIXTURES / "compliant"
WARNING_ONLY = FIXTURES / "broken" / "action_loop"  # one R409 warning, no error


def cli(*args: object, env: dict | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


@pytest.fixture(scope="module")
def records():
    return read_records(COMPLIANT)


@pytest.fixture(scope="module")
def sharded_corrupt(records, tmp_path_factory) -> Path:
    """The compliant log in four shards, the first one truncated (no footer)."""
    out = tmp_path_factory.mktemp("shards") / "log"
    write_records(out, *copy.deepcopy(records), parts=4, corrupt=True)
    return out


# ---------------------------------------------------------------- cascades and exit codes


def test_one_corrupt_shard_gives_its_s005_and_one_u605_naming_it(sharded_corrupt):
    res = cli("check", sharded_corrupt, "--format", "json")
    assert res.exit_code == 1
    rep = json.loads(res.stdout)
    by_code: dict[str, list[dict]] = {}
    for f in rep["findings"]:
        by_code.setdefault(f["code"], []).append(f)
    assert sorted(by_code) == ["S005", "U605"]
    (s005,), (u605,) = by_code["S005"], by_code["U605"]
    assert s005["file"].endswith("step=0/part-0000.parquet")
    assert s005["file"] in u605["message"] and u605["message"].startswith("29 trajectory ids named by 2 updates")
    clean = json.loads(cli("check", COMPLIANT, "--format", "json").stdout)
    # the copy has neither the compliant log's reward declaration (R408) nor its pyproject.toml (T306's budget)
    assert {x["code"] for x in rep["not_run"]} <= {x["code"] for x in clean["not_run"]} | {"R408", "T306"}


@pytest.mark.parametrize(
    "target, why",
    [
        (ROOT / "README.md", "README.md: not a Parquet file"),
        (COMPLIANT / "updates", "nothing to audit: the log holds no trajectory records"),
    ],
)
def test_no_trajectory_file_is_exit_2_with_one_line(target, why):
    res = cli("check", target)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and why in lines[0], res.output


def test_stats_and_show_work_on_the_readable_rest_and_say_what_was_left_out(sharded_corrupt, records):
    res = cli("stats", sharded_corrupt, "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trajectories"] == len(records[0]) - 32  # the first of four shards of 128
    assert "rollout-audit: warning:" in res.stderr and "step=0/part-0000.parquet left out" in res.stderr
    tid = records[0][-1]["trajectory_id"]
    assert cli("show", sharded_corrupt, tid, "--no-color").exit_code == 0
    only = cli("stats", FIXTURES / "broken" / "corrupt_file")
    assert only.exit_code == 2 and "rollout-audit: error: no readable trajectory file (1 file unreadable" in only.stderr


def test_strict_fails_the_verdict_line_as_it_fails_the_exit_code():
    plain, strict = cli("check", WARNING_ONLY), cli("check", WARNING_ONLY, "--strict")
    assert plain.exit_code == 0 and plain.stdout.splitlines()[-1].startswith("ok: 0 errors, 1 warning,")
    assert strict.exit_code == 1 and strict.stdout.splitlines()[-1].startswith("FAIL: 0 errors, 1 warning,")


# ---------------------------------------------------------------- the producer declares its reward components


def test_a_first_visit_component_paid_twice_fails_a_plain_check():
    res = cli("check", FIXTURES / "broken" / "first_visit_paid_twice")
    assert res.exit_code == 1 and "R408 [error]" in res.output and "R408:" not in res.output.split("not run:")[-1]
    meta = pq.read_schema(next((COMPLIANT / "trajectories").glob("*.parquet"))).metadata
    assert json.loads(meta[META_REWARD_COMPONENTS]) == {"outcome": "terminal"}  # the reference agent's writer
    assert "R408" in ra.audit(COMPLIANT).summary["checks_run"]


def test_configuration_overrides_the_declared_components(tmp_path):
    log = tmp_path / "proj" / "log"
    log.parent.mkdir()
    (log.parent / "pyproject.toml").write_text("[tool.rollout-audit]\nfirst_visit_components = []\n")
    import shutil

    shutil.copytree(
        FIXTURES / "broken" / "first_visit_paid_twice", log, ignore=shutil.ignore_patterns("pyproject.toml")
    )
    res = cli("check", log, "--show-not-run")
    assert res.exit_code == 0 and "R408: needs first_visit_components" in res.output


def test_the_writer_declares_reward_components_and_refuses_unknown_payments(tmp_path, records):
    with ra.RolloutWriter(tmp_path / "t.parquet", reward_components={"key_found": "first_visit"}) as w:
        w.write(records[0][:4])
    assert json.loads(pq.read_schema(tmp_path / "t.parquet").metadata[META_REWARD_COMPONENTS]) == {
        "key_found": "first_visit"
    }
    with pytest.raises(ValueError, match="not one of first_visit, terminal, per_step"):
        ra.RolloutWriter(tmp_path / "u.parquet", reward_components={"key_found": "twice"})


# ---------------------------------------------------------------- formats


def _hostile_log(tmp_path: Path, records) -> tuple[Path, str]:
    """Two trajectories sharing an id with a colon and an escape character in it (S002)."""
    trajs, ups = copy.deepcopy(records)
    tid = "a:b\x1bc"
    trajs[0]["trajectory_id"] = trajs[1]["trajectory_id"] = tid
    write_records(tmp_path / "log", trajs, ups)
    return tmp_path / "log", tid


def test_concise_is_one_escaped_finding_per_line_in_the_json_order(tmp_path, records):
    log, _ = _hostile_log(tmp_path, records)
    res = cli("check", log, "--format", "concise", "--select", "S002")
    lines = res.stdout.splitlines()
    assert res.exit_code == 1 and "\x1b" not in res.stdout
    assert lines[0].endswith(":a\\x3ab\\x1bc::: S002 " + lines[0].split(" S002 ", 1)[1])
    assert lines[-1].startswith("FAIL: 1 error, 0 warnings")
    full = json.loads(cli("check", FIXTURES / "broken" / "corrupt_file", "--format", "json").stdout)["findings"]
    concise = cli("check", FIXTURES / "broken" / "corrupt_file", "--format", "concise").stdout.splitlines()
    assert [f["code"] for f in full] == [ln.split(": ", 1)[1].split(" ", 1)[0] for ln in concise[: len(full)]]


def test_quiet_prints_findings_only_and_nothing_when_clean():
    assert cli("check", COMPLIANT, "-q").stdout == ""
    out = cli("check", FIXTURES / "broken" / "loss_over_whole_transcript", "--quiet").stdout
    assert out.startswith("U601 [error]") and "not run" not in out and "FAIL" not in out


def test_plurals_in_text_and_junit():
    text = cli("check", FIXTURES / "broken" / "loss_over_whole_transcript").stdout
    assert "1 finding\n" in text and "FAIL: 2 errors, 0 warnings" in text
    junit = cli("check", FIXTURES / "broken" / "loss_over_whole_transcript", "--format", "junit").stdout
    assert 'message="1 finding"' in junit and "1 findings" not in junit


def test_colour_only_when_asked_or_on_a_terminal():
    broken = FIXTURES / "broken" / "loss_over_whole_transcript"
    assert "\x1b[" in cli("check", broken, "--color").stdout
    assert "\x1b[" not in cli("check", broken).stdout  # CliRunner's stdout is not a terminal
    assert "\x1b[" not in cli("check", broken, "--color", "--format", "concise").stdout


def test_a_report_repr_is_one_short_line():
    r = repr(ra.audit(FIXTURES / "broken" / "loss_over_whole_transcript"))
    assert r.startswith("<Report FAIL: 2 errors") and len(r) < 200 and "\n" not in r


# ---------------------------------------------------------------- several paths


def test_each_path_is_its_own_log_unless_merged():
    broken = FIXTURES / "broken" / "loss_over_whole_transcript"
    res = cli("check", COMPLIANT, broken, "--select", "S,U")
    assert res.exit_code == 1 and f"== {COMPLIANT} ==" in res.stdout and f"== {broken} ==" in res.stdout
    merged = cli("check", COMPLIANT, COMPLIANT, "--merge", "--select", "S002")
    assert merged.exit_code == 1 and "S002 [error] duplicate trajectory_id: 128 findings" in merged.stdout
    logs = json.loads(cli("check", COMPLIANT, broken, "--format", "json", "--select", "S,U").stdout)["logs"]
    assert [x["path"] for x in logs] == [str(COMPLIANT), str(broken)] and logs[1]["summary"]["by_severity"][
        "error"
    ] == 2


def test_config_is_found_next_to_the_audited_log_from_another_directory(tmp_path, monkeypatch):
    import shutil

    log = tmp_path / "proj" / "log"
    shutil.copytree(FIXTURES / "broken" / "action_loop", log)
    (log.parent / "pyproject.toml").write_text('[tool.rollout-audit]\nignore = ["R409"]\n')
    monkeypatch.chdir("/")
    res = cli("check", log, "--strict")
    assert res.exit_code == 0 and "0 warnings" in res.stdout
    assert str(log.parent / "pyproject.toml") in cli("check", log, "--show-settings").stdout


# ---------------------------------------------------------------- errors, help, listings


def test_usage_errors_use_the_one_error_style():
    res = cli("check", "--bogus", COMPLIANT)
    assert res.exit_code == 2 and "rollout-audit: error: No such option '--bogus'" in res.stderr
    assert "Error:" not in res.output


def test_top_level_help_has_examples_exit_codes_and_whole_descriptions():
    out = " ".join(cli("--help").stdout.split())
    assert "Examples:" in out and "Exit codes" in out and "2 the audit could not be completed" in out
    assert "Counts, trainable share, stop causes, rewards, groups and policy versions of a log." in out


def test_explain_lists_by_family_and_explains_a_family():
    out = cli("explain", "--list").stdout.splitlines()
    families = [ln.split()[0] for ln in out if not ln.startswith(" ")]
    assert families == list(ra.contract.registry.FAMILIES)
    m = cli("explain", "m")
    members = sorted(c for c in ra.all_rules() if c.startswith("M"))  # from the registry, never pinned
    assert m.exit_code == 0 and [ln.split()[0] for ln in m.stdout.splitlines()[1:]] == members


def test_faults_list_wraps_every_description_whole():
    out = " ".join(CliRunner(env={"COLUMNS": "100"}).invoke(main, ["faults", "--list"]).stdout.split())
    for f in FAULTS.values():
        assert " ".join(f.description.split()) in out, f.name


def test_stats_summarises_many_versions_and_names_uses_across_epochs():
    many = {v: 10 for v in range(80)}
    line = _versions(many)
    bins = line.split(": ", 1)[1].split(", ")
    assert line.startswith("80 versions, v0-79: ") and len(bins) == MAX_VERSION_BINS
    assert sum(int(x.split()[-1]) for x in bins) == 800 and bins[0] == "v0-9 100"
    out = cli("stats", COMPLIANT).stdout
    assert re.search(r"trajectory uses across epochs \d+ \(\d+ distinct\)", out), out


def test_fixtures_entry_point_without_torch_is_one_line():
    code = "import sys; sys.modules['torch'] = None; from rollout_audit.dev.fixtures import main; sys.exit(main(['--check']))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "rollout_audit.dev fixtures: error: needs torch: pip install -e '.[agent]'"
    ]


def test_the_pre_commit_hook_runs_the_installed_command():
    yaml = pytest.importorskip("yaml")  # PyYAML comes with the trl/replay extras, not with the core
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "rollout-audit" and hook["entry"].split()[:2] == ["rollout-audit", "check"]
    assert hook["pass_filenames"] is False and hook["files"] == r"\.parquet$"
    res = cli(*hook["entry"].split()[1:], COMPLIANT)
    assert res.exit_code == 0 and res.stdout == ""


@pytest.mark.slow  # imports the reference agent, and torch with it
def test_the_demo_training_progress_bar_counts_rounds():
    import io

    from rich.console import Console

    from reference_agent.train import _progress_bar

    buf = io.StringIO()
    with _progress_bar(True, 3, "training seed 0", Console(file=buf, force_terminal=True, width=100)) as advance:
        for _ in range(3):
            advance()
    assert "training seed 0" in buf.getvalue() and "3/3" in buf.getvalue()
    with _progress_bar(False, 3, "x") as advance:
        advance()  # the stand-in: nothing printed, nothing to stop
    assert "--progress / --no-progress" in cli("demo", "--help").stdout


def test_default_colour_needs_a_terminal_and_no_no_color(monkeypatch):
    import io

    from rollout_audit.cli.options import tty_colour as _tty_colour

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert _tty_colour()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not _tty_colour()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.delenv("NO_COLOR")
    assert not _tty_colour()


def test_every_command_has_examples_that_use_its_own_options():
    """Each command's `--help` ends with examples; every option an example uses is one the command
    declares, and the faults it names exist, so that an example cannot drift from the command."""
    import shlex

    import click

    from rollout_audit.cli.main import EXAMPLES

    names = main.list_commands(click.Context(main))  # loads the commands imported only when named
    assert set(EXAMPLES) == set(names)
    for name in names:
        assert "Examples:" in cli(name, "--help").stdout, name
        lines = [x.strip() for x in EXAMPLES[name].splitlines() if x.strip().startswith("rollout-audit ")]
        assert lines, name
        for line in lines:
            words = shlex.split(line)
            target, args = main.commands[words[1]], words[2:]  # an example may show the next command
            if isinstance(target, click.Group) and args and args[0] in target.commands:
                target, args = target.commands[args[0]], args[1:]
            if target.name == "apply":
                assert args[0] in FAULTS, line
            declared = {o for p in target.params for o in (*p.opts, *p.secondary_opts)}
            used = {a.split("=", 1)[0] for a in args if a.startswith("-")}
            assert used <= declared, (line, used - declared)


def test_why_an_audit_is_incomplete_goes_to_stderr_with_the_prefix(tmp_path):
    """A linter's errors are on stderr, `rollout-audit: error: LOG: why`; stdout holds the report (its
    findings; the overall line of several logs), with no unprefixed `error:` line, in text and concise."""
    corrupt = FIXTURES / "broken" / "corrupt_file"
    why = "nothing to audit: no readable trajectory file (1 file unusable: see S005)"
    for fmt in ("text", "concise"):
        one = cli("check", corrupt, "--format", fmt)
        assert one.exit_code == 2
        assert one.stderr.splitlines() == [
            f"rollout-audit: error: {corrupt}: {why} (configuration: pyproject.toml [tool.rollout-audit])"
        ]
        assert "S005" in one.stdout and not [x for x in one.stdout.splitlines() if "error: " in x]
        two = cli("check", corrupt, COMPLIANT, "--format", fmt)
        assert two.exit_code == 2 and f"rollout-audit: error: {corrupt}: {why}" in two.stderr
        assert "nothing to audit" not in two.stdout
    several = cli("check", corrupt, COMPLIANT)
    assert (
        several.stdout.splitlines()[-1] == "overall: 2 logs: 1 ok, 0 FAIL, 1 INCOMPLETE; 0 errors, 0 warnings; exit 2"
    )
    # a report written to a file keeps the reason; stderr says it too
    written = cli("check", corrupt, "-o", tmp_path / "audit.txt")
    assert written.exit_code == 2 and f"rollout-audit: error: {corrupt}: {why}" in written.stderr
    assert f"error: {why}" in (tmp_path / "audit.txt").read_text()
