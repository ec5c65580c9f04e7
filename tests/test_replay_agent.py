"""Replay checks (L205-L207, L209) on the reference agent's log: clean when the log is right, each producer bug
caught (base softmax at T=0.7, v-1 log-probs, top-p ignored, stale checkpoint mapping, a version stamped at
completion), clear not-run reasons."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

import rollout_audit as ra
from reference_agent.env import OBS_RESET, controller_mask
from reference_agent.logging import to_table
from reference_agent.replay import REPLAY_FAULTS, controller_masks, faulty_row
from reference_agent.train import PROFILES, train
from rollout_audit.cli import main
from rollout_audit.contract.config import Config

REPLAY = ("L205", "L206", "L207", "L209")
CFG = replace(PROFILES["tiny"], temperature=0.7, top_p=0.7, infra_failure_rate=0.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("agent")
    train(CFG, out)
    return out


def _cfg(run: Path, **kw: object) -> Config:
    base = {
        "replay": 64,
        "replayer": "reference_agent.replay:replayer",
        "replay_checkpoints": str(run / "checkpoints" / "v{version}.safetensors"),
    }
    return Config(**{**base, **kw})  # type: ignore[arg-type]


def _codes(path: Path, cfg: Config) -> tuple[set[str], ra.Report]:
    rep = ra.audit(str(path), config=cfg, select=list(REPLAY))
    return set(rep.findings["code"].to_list()), rep


def _broken(run: Path, fault: str, dst: Path) -> Path:
    rows = pq.read_table(run / "trajectories" / "part-0000.parquet").to_pylist()
    (dst / "trajectories").mkdir(parents=True)
    pq.write_table(
        to_table([faulty_row(run / "checkpoints", r, fault) for r in rows], "trajectories"),
        dst / "trajectories" / "part-0000.parquet",
    )
    return dst


def test_clean_agent_log_replays_exactly(run: Path) -> None:
    codes, rep = _codes(run, _cfg(run))
    assert codes == set() and not set(rep.not_run) & set(REPLAY), rep.render()
    per_version = rep.summary["statistics"]["L205"]
    assert len(per_version) == CFG.iterations and all(v["max"] < 1e-5 for v in per_version)


@pytest.mark.parametrize("fault", REPLAY_FAULTS)
def test_replay_faults_are_caught(run: Path, fault: str, tmp_path: Path) -> None:
    codes, rep = _codes(_broken(run, fault, tmp_path), _cfg(run))
    assert "L205" in codes, rep.render()
    assert ("L206" in codes) == (fault == "base_softmax"), rep.render()
    if fault == "wrong_version":  # version 0 has no v-1: only the later versions are named
        assert "policy version 0:" not in " ".join(rep.findings["message"].to_list())


def test_replay_renormalises_over_the_recorded_nucleus(run: Path, tmp_path: Path) -> None:
    """With the nucleus recorded, replay scores each action over the actions it was sampled from, not over
    a top-p recomputed from the turn's field: a log whose turns claim top_p 1 replays clean with its
    nucleus, and is caught (L205) once the nucleus is dropped and replay must recompute from top_p."""
    rows = pq.read_table(run / "trajectories" / "part-0000.parquet").to_pylist()
    wide = [dict(r, turns=[dict(t, top_p=1.0) for t in r["turns"]]) for r in rows]
    for name, drop in (("with", False), ("without", True)):
        (tmp_path / name / "trajectories").mkdir(parents=True)
        table = to_table(wide, "trajectories")
        if drop:
            table = table.drop_columns(["nucleus_ids", "nucleus_offsets"])
        pq.write_table(table, tmp_path / name / "trajectories" / "part-0000.parquet")
    codes, rep = _codes(tmp_path / "with", _cfg(run, replay=len(rows)))
    assert codes == set(), rep.render()
    codes, rep = _codes(tmp_path / "without", _cfg(run, replay=len(rows)))
    assert "L205" in codes, rep.render()


def test_version_stamped_at_completion_is_named_with_the_version_that_sampled(run: Path, tmp_path: Path) -> None:
    """rllm-org/rllm#622: every turn of the episodes of the first two rounds is stamped with the next
    round's version (the weights live when the generation completed), tokens and log-probs unchanged.
    The second round's episodes (sampled by v1, stamped v2) are named by L209 with both versions; the first
    round's (sampled by v0, stamped v1) have no earlier version left in the log to be explained by: L205 only."""
    v = [it * CFG.epochs for it in range(CFG.iterations)]
    later = {v[0]: v[1], v[1]: v[2]}
    rows = pq.read_table(run / "trajectories" / "part-0000.parquet").to_pylist()
    moved: dict[str, int] = {}
    for r in rows:
        if r["turns"] and int(r["turns"][0]["policy_version"]) in later:
            moved[r["trajectory_id"]] = int(r["turns"][0]["policy_version"])
            for t in r["turns"]:
                t["policy_version"] = later[int(t["policy_version"])]
    (tmp_path / "trajectories").mkdir()
    pq.write_table(to_table(rows, "trajectories"), tmp_path / "trajectories" / "part-0000.parquet")
    codes, rep = _codes(tmp_path, _cfg(run, replay=len(rows)))
    assert {"L205", "L209"} <= codes, rep.render()
    named = rep.findings.filter(pl.col("code") == "L209")
    assert named.height and {moved.get(t) for t in named["trajectory_id"].to_list()} == {v[1]}, rep.render()
    assert all(
        f"policy version {v[1]} reproduces and the logged version {v[2]} does not" in m for m in named["message"]
    )


def test_stale_checkpoint_mapping_is_caught(run: Path) -> None:
    versions = range(0, CFG.iterations * CFG.epochs, CFG.epochs)
    stale = {str(v): str(run / "checkpoints" / f"v{max(v - 1, 0)}.safetensors") for v in versions}
    codes, rep = _codes(run, _cfg(run, replay_checkpoints=stale))
    assert "L205" in codes and len(rep.findings.filter(pl.col("code") == "L205")) == CFG.iterations - 1


def test_not_run_reasons(run: Path) -> None:
    _, rep = _codes(run, Config())
    assert "--replay N" in rep.not_run["L205"] and "compare_logprobs" in rep.not_run["L207"]
    _, rep = _codes(run, Config(replay=8))
    assert "no replayer configured" in rep.not_run["L206"]
    _, rep = _codes(run, _cfg(run, replay_checkpoints={"0": str(run / "checkpoints" / "v0.safetensors")}))
    assert "no checkpoint configured for policy version 4" in rep.not_run["L205"]
    _, rep = _codes(run, _cfg(run, replayer="no_such_module:factory"))
    assert "cannot be imported" in rep.not_run["L205"]


def test_vectorised_controller_masks_match_the_controller(run: Path) -> None:
    table = pq.read_table(run / "trajectories" / "part-0000.parquet")
    rows = table.to_pylist()
    traj = np.repeat(np.arange(len(rows)), [len(r["turns"]) for r in rows])
    turn = np.concatenate([np.arange(len(r["turns"])) for r in rows])
    expected = np.stack(
        [
            controller_mask([OBS_RESET] + [t["observation_text"] or "" for t in r["turns"][:k]])
            for r in rows
            for k in range(len(r["turns"]))
        ]
    )
    assert np.array_equal(controller_masks(table, traj, turn), expected)


def test_cli_replay_option(run: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    conf = tmp_path / "replay.toml"
    conf.write_text(
        f'replayer = "reference_agent.replay:replayer"\n'
        f'replay_checkpoints = "{run / "checkpoints" / "v{version}.safetensors"}"\n'
    )
    ok = CliRunner().invoke(main, ["check", str(run), "--select", "L2", "--replay", "16", "--config", str(conf)])
    # every L2 check runs but L212: the agent recomputes each turn at its own logged temperature
    assert ok.exit_code == 0 and "11 checks run, 0 partially run, 1 not run" in ok.output, ok.output
    assert "not run: L212 (" in ok.output, ok.output
    bad = CliRunner().invoke(
        main,
        [
            "check",
            str(_broken(run, "top_p_ignored", tmp_path / "b")),
            "--select",
            "L2",
            "--replay",
            "16",
            "--config",
            str(conf),
        ],
    )
    assert bad.exit_code == 1 and "L205" in bad.output, bad.output


def test_replayer_failure_is_a_reason_not_a_traceback(run: Path, tmp_path: Path) -> None:
    """A replay that was asked for and raised: not run with the replayer's one-line reason, and the
    audit is incomplete (exit 2), never ok."""
    rows = pq.read_table(run / "trajectories" / "part-0000.parquet").to_pylist()
    rows[0]["token_ids"] = [10_000] * len(rows[0]["token_ids"])  # ids the policy's embedding does not have
    (tmp_path / "trajectories").mkdir()
    pq.write_table(to_table(rows, "trajectories"), tmp_path / "trajectories" / "part-0000.parquet")
    _, rep = _codes(tmp_path, _cfg(run))
    assert (
        rep.not_run["L205"]
        == "replay of 64 trajectories was asked for and failed: IndexError: index out of range in self"
    )
    assert rep.unfulfilled["L205"] == rep.not_run["L205"] and rep.exit_code() == 2 and not rep.ok


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ("", "no replayer configured"),
        (
            'replayer = "reference_agent.replay:replayer"\nreplay_checkpoints = "{missing}/v{{version}}.safetensors"\n',
            "checkpoint of policy version 0 not found: {missing}/v0.safetensors",
        ),
        (
            'replayer = "reference_agent.replay:replayer"\nreplay_checkpoints = "{run}"\n',
            "checkpoint of policy version 0 cannot be loaded from {run}: ",
        ),
        ('replayer = "no_such_module:factory"\n', "replayer 'no_such_module:factory' cannot be imported"),
    ],
    ids=["no-replayer", "missing-checkpoint", "checkpoint-is-a-directory", "replayer-not-importable"],
)
def test_a_replay_asked_for_that_cannot_run_exits_2_saying_why(
    run: Path, tmp_path: Path, settings: str, reason: str
) -> None:
    """`check --replay N` that cannot replay, for any reason: exit 2, one line naming the reason (and the
    path tried), never "ok"."""
    from click.testing import CliRunner

    conf = tmp_path / "replay.toml"
    conf.write_text(settings.format(missing=tmp_path / "nowhere", run=run))
    res = CliRunner().invoke(main, ["check", str(run), "--replay", "16", "--config", str(conf), "--format", "json"])
    assert res.exit_code == 2, res.output
    errors = [x for x in res.stderr.splitlines() if x.startswith("rollout-audit: error: ")]
    assert len(errors) == 1 and reason.format(missing=tmp_path / "nowhere", run=run) in errors[0], res.stderr
    assert "L205, L206, L207, L209, L211: replay of 16 trajectories was asked for" in errors[0]


def test_a_check_selected_by_code_that_cannot_run_exits_2(run: Path) -> None:
    """`--select L205` (a full code) without replay: exit 2 with the reason; `--select L2` (a family)
    keeps the not-run list and its verdict."""
    from click.testing import CliRunner

    res = CliRunner().invoke(main, ["check", str(run), "--select", "L205,L201"])
    assert (
        res.exit_code == 2 and f"error: {run}: L205: selected by its code and not run: replay is off" in res.stderr
    ), res.output
    assert res.stdout.rstrip().splitlines()[-1].startswith("INCOMPLETE: 0 errors")
    family = CliRunner().invoke(main, ["check", str(run), "--select", "L2", "--show-not-run"])
    assert family.exit_code == 0 and "L205: replay is off" in family.output, family.output


def test_what_was_replayed_is_shown_in_text_json_and_the_browser(run: Path, tmp_path: Path) -> None:
    """`check --replay` says what it recomputed (trajectories, tokens, versions, largest gap), JSON has
    `summary.replay`, and the HTML report of `report --replay` shows it in a real headless Chromium."""
    import json

    from click.testing import CliRunner

    conf = tmp_path / "replay.toml"
    conf.write_text(
        f'replayer = "reference_agent.replay:replayer"\n'
        f'replay_checkpoints = "{run / "checkpoints" / "v{version}.safetensors"}"\n'
    )
    args = [str(run), "--select", "L2", "--replay", "8", "--config", str(conf)]
    text = CliRunner().invoke(main, ["check", *args])
    line = next(x for x in text.output.splitlines() if x.startswith("replayed: "))
    assert text.exit_code == 0 and "8 trajectories" in line and "largest |replayed - recorded| log-prob" in line
    js = json.loads(CliRunner().invoke(main, ["check", *args, "--format", "json"]).output)["summary"]["replay"]
    assert js["trajectories"] == 8 and js["tokens"] > 0 and js["versions"] and js["largest_gap"] < 1e-3
    off = json.loads(CliRunner().invoke(main, ["check", str(run), "--select", "L2", "--format", "json"]).output)
    assert off["summary"]["replay"] is None
    page = tmp_path / "r.html"
    rep = CliRunner().invoke(main, ["report", *args, "-o", str(page)])
    assert rep.exit_code == 0, rep.output
    sync_api = pytest.importorskip("playwright.sync_api")
    from conftest import CHROMIUM, NO_CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip(NO_CHROMIUM)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            tab = browser.new_page()
            tab.goto(page.as_uri())
            shown = tab.inner_text("#replay")
        finally:
            browser.close()
    assert shown == line, (shown, line)
