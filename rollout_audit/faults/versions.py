"""Faults the policy versions checks (P) must catch."""

from __future__ import annotations

from .base import Ctx, fault


@fault("policy_version_missing", {"P501"}, group="episodes-2")
def policy_version_missing(ctx: Ctx) -> list[str]:
    """A turn was sampled by a worker that did not report its weight version."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2)
    t["turns"][-1]["policy_version"] = None
    return [t["trajectory_id"]]


@fault("policy_version_decreasing", {"P502"}, group="episodes-2")
def policy_version_decreasing(ctx: Ctx) -> list[str]:
    """Versions go backwards inside an episode (a turn routed to a replica one version ahead,
    the next one back to a stale one)."""
    t = ctx.pick(
        lambda t: len(t["turns"]) >= 2 and t["trajectory_id"] not in ctx.used(), "excluded trajectory with two turns"
    )
    t["turns"][0]["policy_version"] = t["turns"][0]["policy_version"] + 1
    return [t["trajectory_id"]]


@fault("stale_batch_beyond_lag", {"P503"}, group="episodes-3")
def stale_batch_beyond_lag(ctx: Ctx) -> list[str]:
    """A trajectory sampled one version too many ago entered an update (its lag exceeds the
    bound the update promised)."""
    ups = [u for u in ctx.updates if u["trajectory_ids"] and u["trainer_version"] >= (u.get("max_policy_lag") or 0) + 1]
    if not ups:
        raise ValueError("the log has no update late enough for this fault")
    u = max(ups, key=lambda u: u["trainer_version"])
    tid = ctx.rng.choice(u["trajectory_ids"])
    for tr in ctx.by_id[tid]["turns"]:
        tr["policy_version"] = u["trainer_version"] - (u.get("max_policy_lag") or 0) - 1
    return [tid]
