"""Demo entry points for the `rollout-audit demo` command: train a profile, return and format the eval table."""

from __future__ import annotations

from typing import Any

from reference_agent.train import POLICY_LABELS, format_table, run_profile

__all__ = ["POLICY_LABELS", "format_table", "run_demo"]


def run_demo(out_dir: str, profile: str = "smoke", seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Train the profile, write logs and checkpoints under out_dir, return the greedy evaluation table
    (`progress`: a bar of the training rounds on stderr)."""
    return run_profile(profile, out_dir, seed, progress=progress)
