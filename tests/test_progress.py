"""The progress line (on a terminal only, gone when the audit ends) and the overall line after the
reports of several logs."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from hostilehelp import cli
from rich.console import Console

from rollout_audit.cli.progress import progress

ROOT = Path(__file__).resolve().parents[1]
COMPLIANT = str(ROOT / "fixtures" / "compliant")
BROKEN = str(ROOT / "fixtures" / "broken" / "loss_over_whole_transcript")


def test_the_line_names_the_log_being_audited_and_clears_itself() -> None:
    buf = io.StringIO()
    with progress(3, enabled=True, delay=0, console=Console(file=buf, force_terminal=True, width=80)) as step:
        for label in ("run-a", "run-b", "run-c"):
            step(label)
    out = buf.getvalue()
    assert "auditing run-c" in out and "2/3" in out
    assert out.endswith("\x1b[2K")  # transient: the last thing drawn is the erase of its own line


def test_one_log_has_no_count() -> None:
    buf = io.StringIO()
    with progress(1, enabled=True, delay=0, console=Console(file=buf, force_terminal=True, width=80)) as step:
        step("run-a")
    assert "auditing run-a" in buf.getvalue() and "/1" not in buf.getvalue()


def test_disabled_or_quick_work_draws_nothing() -> None:
    for enabled, delay in ((False, 0.0), (True, 60.0)):
        buf = io.StringIO()
        with progress(2, enabled=enabled, delay=delay, console=Console(file=buf, force_terminal=True)) as step:
            step("run-a")
        assert buf.getvalue() == ""


def test_not_a_terminal_gets_no_line_and_several_logs_get_an_overall_line() -> None:
    r = cli("check", COMPLIANT, BROKEN)
    assert r.returncode == 1 and "auditing" not in r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last == "overall: 2 logs: 1 ok, 1 FAIL, 0 INCOMPLETE; 2 errors, 0 warnings; exit 1", last


def test_machine_formats_and_one_log_have_no_overall_line() -> None:
    assert "overall:" not in cli("check", COMPLIANT).stdout
    assert "overall:" not in cli("check", COMPLIANT, BROKEN, "--format", "json").stdout
    assert "overall:" not in cli("check", COMPLIANT, BROKEN, "--quiet").stdout


@pytest.mark.slow
def test_a_terminal_sees_the_line_while_a_long_audit_runs(tmp_path: Path) -> None:
    """The real command with stderr on a pseudo-terminal: the line is drawn, then erased; stdout (a
    pipe) holds the reports alone. The delay is zero so that a fast machine draws it too."""
    master, slave = pty.openpty()
    logs = [str(p) for p in sorted((ROOT / "fixtures" / "broken").iterdir()) if (p / "trajectories").is_dir()][:12]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout_audit.cli", "check", *logs],
        stdout=subprocess.PIPE,
        stderr=slave,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "100", "ROLLOUT_AUDIT_PROGRESS_DELAY": "0"},
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    out = proc.communicate(timeout=300)[0].decode()
    os.close(master)
    assert b"auditing" in seen and b"/12" in seen, seen[-500:]
    assert "auditing" not in out and out.strip().splitlines()[-1].startswith("overall: 12 logs:")


def test_the_delay_is_read_from_the_environment_and_a_bad_value_keeps_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rollout_audit.cli.progress import DELAY, DELAY_VARIABLE, delay_from_environment

    for value, expected in (("0", 0.0), ("0.5", 0.5), ("-1", DELAY), ("nan", DELAY), ("soon", DELAY)):
        monkeypatch.setenv(DELAY_VARIABLE, value)
        assert delay_from_environment() == expected, value
    monkeypatch.delenv(DELAY_VARIABLE)
    assert delay_from_environment() == DELAY
