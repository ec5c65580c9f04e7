"""The HTML report without a browser: hostile log strings escaped, many policy versions and tasks
summarised into a bounded number of rows, and a second fault's plot differing from the compliant one."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner
from conftest import write_log

from rollout_audit.cli import main
from rollout_audit.synth import make_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BAD_DOT = 'fill="#c0392b" opacity=".7" class="fault"'  # a point off the diagonal, not the legend's swatch


def report(tmp_path: Path, log: Path, name: str = "r.html") -> str:
    res = CliRunner().invoke(main, ["report", str(log), "-o", str(tmp_path / name)])
    assert res.exit_code in (0, 1), res.output
    return (tmp_path / name).read_text()


def _figure(html: str, label: str) -> str:
    m = re.search(rf'<svg[^>]*aria-label="{re.escape(label)}.*?</svg>', html, re.S)
    assert m, label
    return m.group(0)


def test_hostile_strings_are_escaped_everywhere(tmp_path, records):
    trajs, ups = records
    evil = '<script>alert(1)</script>\x1b[2J"><img src=x onerror=alert(2)>'
    for t in trajs[:3]:
        t["task_id"] = evil
        t["stop_reason"] = evil
    trajs[0]["trajectory_id"] = evil
    html = report(tmp_path, write_log(tmp_path / "log", trajs, ups))
    assert "<script" not in html and "<img" not in html and "\x1b" not in html
    assert "&lt;script&gt;" in html  # shown, as text


def test_many_versions_and_tasks_are_binned(tmp_path):
    trajs, ups = make_log(n_tasks=14, group_size=2, n_versions=40, seed=3)
    html = report(tmp_path, write_log(tmp_path / "log", trajs, ups))
    stops = _figure(html, "stop causes per policy version")
    rows = re.findall(r'<text x="0" y="[\d.]+">(v\d+(?:–v\d+)?)</text>', stops)
    assert 1 < len(rows) <= 12 and rows[0].startswith("v0–") and rows[-1].endswith("v39")
    tasks = _figure(html, "reward vs verifier success per task")
    assert len(re.findall(r'<text x="0" y="[\d.]+">', tasks)) <= 12 and "(other tasks)" in tasks


def test_loss_over_whole_transcript_is_off_the_diagonal(tmp_path):
    broken = _figure(report(tmp_path, FIXTURES / "broken" / "loss_over_whole_transcript", "b.html"), "loss denominator")
    clean = _figure(report(tmp_path, FIXTURES / "compliant", "c.html"), "loss denominator")
    assert BAD_DOT in broken and BAD_DOT not in clean
    assert "1992" in broken  # the recorded value is an axis end, written in full
