"""Demo entry points for the `rollout-audit demo` command: train a profile, return and format the eval table."""

from __future__ import annotations

from typing import Any

from reference_agent.train import run_profile

POLICY_LABELS = {
    "trained": "trained (GRU memory)",
    "untrained": "untrained (v0)",
    "no_memory": "trained, no memory (state reset each turn)",
}


def run_demo(out_dir: str, profile: str = "smoke", seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Train the profile, write logs and checkpoints under out_dir, return the greedy evaluation table
    (`progress`: a bar of the training rounds on stderr)."""
    return run_profile(profile, out_dir, seed, progress=progress)


def format_table(result: dict[str, Any]) -> str:
    """Plain-text table: greedy success on red and blue tasks for each policy (mean ± std for `full`)."""
    summary = result.get("summary")
    lines = [
        f"profile {result.get('profile')}  train {result['train_seconds']:.1f}s  "
        f"total {result['total_seconds']:.1f}s  out {result.get('out_dir')}",
        f"{'policy':<44}{'red':>16}{'blue':>16}",
    ]
    for key, label in POLICY_LABELS.items():
        cells = []
        for colour in ("red", "blue"):
            if summary:
                s = summary[f"{key}/{colour}"]
                cells.append(f"{s['mean']:.3f} ± {s['std']:.3f}")
            else:
                cells.append(f"{result['evaluation'][key][colour]:.3f}")
        lines.append(f"{label:<44}{cells[0]:>16}{cells[1]:>16}")
    for run in result.get("runs", []):  # full profile: every seed, so a failed seed is visible
        ev = run["evaluation"]
        lines.append(
            f"  seed {run['seed']}: trained red {ev['trained']['red']:.2f} blue {ev['trained']['blue']:.2f}, "
            f"no-memory red {ev['no_memory']['red']:.2f} blue {ev['no_memory']['blue']:.2f}"
        )
    if "stop_reasons" in result:
        lines.append("stop reasons: " + ", ".join(f"{k}={v}" for k, v in sorted(result["stop_reasons"].items())))
    return "\n".join(lines)
