"""Groups and difficulty: G701 (degenerate groups per task, P_info) and G702 (difficulty band)."""

from __future__ import annotations

import random

import polars as pl
import pytest

import rollout_audit as ra
from rollout_audit.checks.groups import p_info
from rollout_audit.synth import make_trajectory


def blocking(rep) -> set[str]:
    return rep.codes("error") | rep.codes("warning")


def of(rep, code) -> pl.DataFrame:
    return rep.findings.filter(pl.col("code") == code)


def task_log(outcomes: dict[int, list[bool]], group_size: int) -> list[dict]:
    """Terminated trajectories: per task, the given outcomes in groups of `group_size`."""
    rng = random.Random(1)
    trajs = []
    for task, results in outcomes.items():
        for i, ok in enumerate(results):
            trajs.append(make_trajectory(f"t{task}-{i:04d}", task, rng, n_turns=1, success=ok, group=i // group_size))
    return trajs


def test_p_info_formula_matches_the_lecture():
    df = pl.DataFrame({"p": [0.01, 0.5, 0.0], "G": [8, 2, 4]})
    df = df.with_columns(p_info(pl.col("p"), pl.col("G")).alias("pi"))
    pi = df["pi"].to_list()
    assert pi[0] == pytest.approx(0.0773, abs=5e-5)
    assert 1 / pi[0] == pytest.approx(12.94, abs=5e-3)
    assert pi[1] == pytest.approx(0.5)
    assert pi[2] == 0.0


def test_g701_rare_success_task(records):
    # p = 1/100 with groups of 8 (12 groups of 8 and one of 4: median G = 8), as in lesson “When a rollout group contains no relative signal”
    trajs = task_log({0: [i == 0 for i in range(100)]}, group_size=8)
    rep = ra.audit(trajs)
    assert not blocking(rep)
    row = rep.summary["statistics"]["G701"][0]
    assert row["task_id"] == "task0" and row["trajectories"] == 100 and row["groups"] == 13
    assert row["group_size"] == 8 and row["p"] == pytest.approx(0.01)
    assert row["p_info"] == pytest.approx(0.0773, abs=5e-5)
    assert row["expected_groups"] == pytest.approx(12.94, abs=5e-3)
    assert row["degenerate_share"] == pytest.approx(12 / 13)
    f = of(rep, "G701")
    assert f.height == 1 and f["severity"][0] == "info"
    msg = f["message"][0]
    assert msg.startswith("task task0: 12 of 13 groups degenerate")
    assert "p = 0.01" in msg and "G = 8" in msg and "= 0.0773" in msg and "comparison: 12.94" in msg


def test_g701_uses_reward_without_verifier_success():
    trajs = task_log({0: [True] * 8, 1: [True, False] * 4}, group_size=4)
    for t in trajs:
        del t["verifier_success"]
    rep = ra.audit(trajs)
    rows = {r["task_id"]: r for r in rep.summary["statistics"]["G701"]}
    assert rows["task0"]["p"] == 1.0 and rows["task0"]["p_info"] == 0.0 and rows["task0"]["expected_groups"] is None
    assert rows["task1"]["p"] == 0.5 and rows["task1"]["degenerate_share"] == 0.0
    f = of(rep, "G701")
    assert f.height == 1 and f["message"][0].startswith("task task0: 2 of 2 groups degenerate")
    assert "never (P_info = 0)" in f["message"][0]


def test_g701_silent_on_compliant_log_with_table(records):
    rep = ra.audit(*records)
    assert "G701" not in rep.codes()
    rows = rep.summary["statistics"]["G701"]
    assert [r["task_id"] for r in rows] == ["task0", "task1", "task2", "task3"]
    assert all(0 <= r["degenerate_share"] <= 1 and r["groups"] == 2 for r in rows)
    assert "G701" in rep.to_dict()["summary"]["statistics"]


def test_g701_excluded_episodes_are_not_counted(records):
    trajs, ups = records
    rep = ra.audit(trajs, ups)
    counted = sum(r["trajectories"] for r in rep.summary["statistics"]["G701"])
    assert counted == sum(t["reward"] is not None for t in trajs) < len(trajs)


def test_g701_g702_not_run_without_task_id(records):
    trajs, _ = records
    for t in trajs:
        del t["task_id"]
    rep = ra.audit(trajs, select=["G"])
    assert "task_id" in rep.not_run["G701"] and "task_id" in rep.not_run["G702"]
    assert rep.findings.is_empty()


def test_g702_mixture_of_easy_and_impossible_tasks():
    trajs = task_log({0: [True] * 8, 1: [True] * 8, 2: [False] * 8, 3: [False] * 8, 4: [True, False] * 4}, group_size=4)
    rep = ra.audit(trajs)
    assert not blocking(rep)
    st = rep.summary["statistics"]["G702"]
    assert st["global_success_rate"] == pytest.approx(0.5)
    assert (st["tasks"], st["tasks_below_band"], st["tasks_above_band"]) == (5, 2, 2)
    assert st["share_outside_band"] == pytest.approx(0.8) and st["hidden_by_global_rate"] is True
    f = of(rep, "G702")
    assert f.height == 1 and f["severity"][0] == "info" and f["trajectory_id"][0] is None
    msg = f["message"][0]
    assert "global success rate 0.500 is inside the band [0.05, 0.95]" in msg
    assert "4 of 5 tasks" in msg and "2 with p < 0.05" in msg and "2 with p > 0.95" in msg


def test_g702_silent_when_tasks_are_in_band_or_global_rate_is_not(records):
    rep = ra.audit(*records)
    assert "G702" not in rep.codes()
    assert rep.summary["statistics"]["G702"]["hidden_by_global_rate"] is False
    # every task unsolved: the global rate itself is outside the band, nothing is hidden
    rep = ra.audit(task_log({0: [False] * 8, 1: [False] * 8}, group_size=4))
    assert "G702" not in rep.codes()
    assert rep.summary["statistics"]["G702"]["tasks_below_band"] == 2


def test_g702_band_from_configuration():
    trajs = task_log({0: [True] * 7 + [False], 1: [True] * 7 + [False], 2: [False] * 8}, group_size=4)
    assert "G702" not in ra.audit(trajs).codes()  # p = 0.875 is inside the default band
    rep = ra.audit(trajs, config=ra.Config(difficulty_band=(0.2, 0.8)))
    assert "G702" in rep.codes()
    assert rep.summary["statistics"]["G702"]["band"] == [0.2, 0.8]


# ---------------------------------------------------------------- G703


def test_g703_every_group_degenerate_inside_the_band(records):
    trajs, ups = records
    assert "G703" not in ra.audit(trajs, ups).codes()
    for t in trajs:  # rewards zeroed after grouping; the verdicts still vary (alibaba/ROLL#397)
        if t["reward"] is not None:
            t["reward"] = 0.0
    rep = ra.audit(trajs, select=["G703"])
    f = of(rep, "G703")
    assert f.height == 1 and f["severity"][0] == "warning"
    assert (
        "groups of two or more trajectories are degenerate" in f["message"][0] and "inside the band" in f["message"][0]
    )


def test_g703_silent_when_the_rate_is_outside_the_band():
    # every task always solved: every group degenerate, but the rate (1.0) says so
    rep = ra.audit(task_log({0: [True] * 8, 1: [True] * 8}, group_size=4), select=["G703"])
    assert "G703" not in rep.codes() and "G701" not in rep.codes()
    # half the tasks solved, half never: degenerate groups, rate 0.5 inside the band: it fires
    rep = ra.audit(task_log({0: [True] * 8, 1: [False] * 8}, group_size=4), select=["G703"])
    assert rep.codes() == {"G703"}
    # one informative group is enough to keep it silent
    rep = ra.audit(
        task_log({0: [True] * 8, 1: [False] * 4 + [True, False, False, False]}, group_size=4), select=["G703"]
    )
    assert "G703" not in rep.codes()
