"""The CLI run as the hostile-input tests judge it: in this process, its exit code, its output and
any traceback, and the judgement that an exit is clean (0, 1 or 2, never a traceback)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Run:
    returncode: int | None  # None: hung, killed after the timeout
    stdout: str
    stderr: str


def cli(*args: str, cwd: Path | None = None) -> Run:
    """`rollout-audit ARGS` in this process (the fast path, for cases that cannot crash natively)."""
    from click.testing import CliRunner

    from rollout_audit.cli import main

    old = Path.cwd()
    os.chdir(cwd or old)
    try:
        r = CliRunner().invoke(main, list(args))
    finally:
        os.chdir(old)
    tb = "" if r.exception is None or isinstance(r.exception, SystemExit) else "Traceback " + repr(r.exception)
    return Run(r.exit_code, r.stdout, r.stderr + tb)


def assert_clean_exit(r: Run, codes: tuple[int, ...] = (0, 1, 2)) -> None:
    assert r.returncode in codes, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-2000:]
