"""Demo entry points for the `rollout-audit demo` command: train a profile, write the log with its
configurations, return and format the eval table.

Each run's directory (OUT, or OUT/seed{s} for the `full` profile) holds:

    log/                the rollout log (trajectories/, updates/)
    checkpoints/        one checkpoint per policy version (v{version}.safetensors)
    pyproject.toml      what the collector was set up with (its response budget): found by any
                        `rollout-audit check OUT/log`, wherever it is run from
    rollout-audit.toml  the same, plus the agent's replayer and its checkpoints:
                        `rollout-audit check OUT/log --config OUT/rollout-audit.toml --replay 64`

The replayer runs code and reads files, so the audit takes it only from the command line, a file
named with --config, or the project it is run from, never from a configuration found beside or
inside the audited log (a log cannot vouch for itself): that is why it has a file of its own,
named on the command line, and is not in the pyproject.toml the audit finds next to the log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reference_agent.train import POLICY_LABELS, format_table, run_profile

__all__ = ["CONFIG", "LOG", "POLICY_LABELS", "REPLAY", "format_table", "next_steps", "replay_summary", "run_demo"]

LOG = "log"  # the log's directory inside a run's directory
CONFIG = "rollout-audit.toml"  # the configuration with the replayer, named with --config
REPLAY = 64  # trajectories the demo's own audit replays (stratified by policy version)
REPLAYER = "reference_agent.replay:replayer"


def run_demo(out_dir: str, profile: str = "smoke", seed: int = 0, progress: bool | str = False) -> dict[str, Any]:
    """Train the profile, write each run's log, checkpoints and configurations under out_dir (the
    layout above), return the greedy evaluation table with `run_dirs`, the runs' directories
    (`progress`: a bar of the training rounds on stderr)."""
    result = run_profile(profile, out_dir, seed, progress=progress, log_dir=LOG)
    runs = result.get("runs", [result])
    for run in runs:
        write_configurations(Path(run["out_dir"]), run["config"]["max_response_tokens"])
    result["run_dirs"] = [run["out_dir"] for run in runs]
    return result


def write_configurations(run_dir: Path, max_response_tokens: int) -> None:
    """Write run_dir/pyproject.toml (the collector's settings) and run_dir/rollout-audit.toml (the
    same with the replayer and the checkpoints, as an absolute template: it works from any directory)."""
    settings = write_collector_settings(run_dir, max_response_tokens)
    checkpoints = str(run_dir.resolve() / "checkpoints" / "v{version}.safetensors")
    replay = {**settings, "replayer": REPLAYER, "replay_checkpoints": checkpoints}
    (run_dir / CONFIG).write_text(
        "# The audit of log/ with replay (written by `rollout-audit demo`), named on the command line:\n"
        f"#   rollout-audit check {run_dir.resolve() / LOG} --config {run_dir.resolve() / CONFIG} --replay {REPLAY}\n"
        "# The replayer is code the audit imports and runs: it is taken from a file named with --config,\n"
        "# never from a configuration found next to the audited log.\n" + _table(replay)
    )


def write_collector_settings(directory: Path, max_response_tokens: int) -> dict[str, Any]:
    """Write directory/pyproject.toml: what the agent's collector was set up with (its response
    budget, for T306), where the audit finds it for any log at or below `directory`; returns the settings."""
    settings = {"max_response_tokens": max_response_tokens}
    (directory / "pyproject.toml").write_text(
        "# The reference agent's collector settings, for any audit of the log here (T306: its response budget)\n"
        + _table(settings)
    )
    return settings


def _table(settings: dict[str, Any]) -> str:
    """A [tool.rollout-audit] table (JSON strings and integers are TOML values)."""
    return "[tool.rollout-audit]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())


REPLAY_CHECKS = ("L205", "L206", "L207", "L209")


def replay_summary(summary: dict[str, Any]) -> str:
    """One line on the replay of an audit's summary (Report.summary): the replay checks that ran,
    on how many tokens of how many policy versions, and the largest |replayed − recorded|."""
    ran = [c for c in REPLAY_CHECKS if c in summary.get("checks_run", ())]
    per_version = summary.get("statistics", {}).get("L205") or []
    if not ran or not per_version:
        return "replay did not run: " + ", ".join(c for c in REPLAY_CHECKS if c not in ran)
    tokens = sum(v["n"] for v in per_version)
    worst = max(v["max"] for v in per_version)
    return (
        f"replay ran ({', '.join(ran)}): {tokens} sampled tokens of {len(per_version)} policy versions "
        f"recomputed from their checkpoints, largest |replayed - recorded| log-prob {worst:.2g}"
    )


def next_steps(run_dir: str) -> str:
    """The commands that audit a run's log again, with and without replay."""
    log, config = Path(run_dir) / LOG, Path(run_dir) / CONFIG
    return (
        f"audit it again: rollout-audit check {log}\n"
        f"with replay:    rollout-audit check {log} --config {config} --replay {REPLAY}"
    )
