"""The CLI run as the hostile-input tests judge it: in this process, its exit code, its output and
any traceback, and the judgement that an exit is clean (0, 1 or 2, never a traceback)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
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


class BigAnswer(BaseHTTPRequestHandler):
    """A replay server answering every GET with `body`, without a Content-Length (read to the end)."""

    body = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()  # no Content-Length: read to the end, under the cap
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


# a trajectory id that would forge a CI annotation, a terminal hyperlink and a screen clear, and
# inject rich markup, were it printed unescaped
EVIL_ID = "t\n::error file=evil.py,line=1::forged\x1b]8;;https://evil.example\x07x\x1b[2J[link=https://e.x]y[/]"


def write(root: Path, trajs: list[dict], name: str = "part-0000.parquet") -> Path:
    """`trajs` written unvalidated as one trajectory file of the log at `root`; returns `root`."""
    from rollout_audit import RolloutWriter

    with RolloutWriter(root / "trajectories" / name, validate=False) as w:
        w.write(trajs)
    return root


def assert_clean_exit(r: Run, codes: tuple[int, ...] = (0, 1, 2)) -> None:
    assert r.returncode in codes, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-2000:]
