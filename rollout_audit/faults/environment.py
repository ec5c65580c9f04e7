"""Faults the environment checks (E) must catch."""

from __future__ import annotations

from .base import Ctx, fault


@fault("environment_version_missing", {"E801"}, group="episodes-3")
def environment_version_missing(ctx: Ctx) -> list[str]:
    """The collector did not record which environment image produced the episode."""
    t = ctx.pick()
    t["environment_version"] = None
    return [t["trajectory_id"]]


@fault("reset_not_reproducible", {"E802"}, group="episodes-3")
def reset_not_reproducible(ctx: Ctx) -> list[str]:
    """Two resets with the same seed produced different initial states (shared mutable state
    between rollouts)."""
    t = ctx.pick(lambda t: sum(o["reset_seed"] == t["reset_seed"] for o in ctx.trajs) > 1, "reset seed used twice")
    t["initial_state_checksum"] = "f" * 16
    return [t["trajectory_id"]]
