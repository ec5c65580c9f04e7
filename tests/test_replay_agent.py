"""Replay checks (L205-L207) on the reference agent's log: clean when the log is right, each producer bug
caught (base softmax at T=0.7, v-1 log-probs, top-p ignored, stale checkpoint mapping), clear not-run reasons."""

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
from rollout_audit.config import Config

REPLAY = ("L205", "L206", "L207")
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
    assert ok.exit_code == 0 and "8 checks run, 0 partially run, 0 not run" in ok.output, ok.output
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
    rows = pq.read_table(run / "trajectories" / "part-0000.parquet").to_pylist()
    rows[0]["token_ids"] = [10_000] * len(rows[0]["token_ids"])  # ids the policy's embedding does not have
    (tmp_path / "trajectories").mkdir()
    pq.write_table(to_table(rows, "trajectories"), tmp_path / "trajectories" / "part-0000.parquet")
    _, rep = _codes(tmp_path, _cfg(run))
    assert rep.not_run["L205"].startswith("replay failed: IndexError")
