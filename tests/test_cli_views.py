"""stats, show and report commands on a small log."""

from __future__ import annotations

import json

from click.testing import CliRunner
from conftest import write_log

from rollout_audit.cli import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_stats_counts_match_records(tmp_path, records):
    trajs, ups = records
    root = write_log(tmp_path / "log", trajs, ups)
    d = json.loads(run("stats", root, "--format", "json").output)
    assert d["trajectories"] == len(trajs)
    assert d["tokens"] == sum(len(t["token_ids"]) for t in trajs)
    assert d["trainable_tokens"] == sum(t["num_trainable_tokens"] for t in trajs)
    assert d["tokens_by_source"]["policy"] == d["trainable_tokens"]
    assert sum(d["stop_reasons"].values()) == len(trajs)
    assert "trainable" in run("stats", root).output


def test_show_prints_turns_and_marks_trained_tokens(tmp_path, records):
    trajs, ups = records
    root = write_log(tmp_path / "log", trajs, ups)
    t = trajs[0]
    out = run("show", root, t["trajectory_id"], "--no-color").output
    assert f"turn {len(t['turns']) - 1}" in out
    first_policy = next(i for i, s in enumerate(t["token_source"]) if s == 2)
    assert f"‹policy› {t['token_ids'][first_policy]}* " in out  # in the loss
    lp = t["behavior_logprobs"][first_policy]
    assert (
        f"{t['token_ids'][first_policy]}*({lp:.3g})"
        in run("show", root, t["trajectory_id"], "--no-color", "--ids").output
    )
    assert run("show", root, "no-such-id").exit_code == 2


def test_report_writes_html_outside_the_log(tmp_path, records):
    trajs, ups = records
    trajs[0]["num_trainable_tokens"] += 3
    root = write_log(tmp_path / "log", trajs, ups)
    res = run("report", root, "-o", tmp_path / "r.html")
    assert res.exit_code == 1
    html = (tmp_path / "r.html").read_text()
    assert "M103" in html and "<svg" in html and trajs[0]["trajectory_id"] in html
    assert run("report", root, "-o", root / "r.html").exit_code == 2
