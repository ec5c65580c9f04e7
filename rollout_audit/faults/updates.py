"""Faults the updates and reduction checks (U) must catch."""

from __future__ import annotations

import numpy as np

from .base import Ctx, fault, sync_denominator


@fault("denominator_batch_size_for_token_reduction", {"U601"}, group="episodes-3")
def denominator_batch_size_for_token_reduction(ctx: Ctx) -> list[str]:
    """The update declares token reduction but divides by the number of trajectories."""
    u = ctx.updates[0]
    u["loss_denominator"] = float(len(u["trajectory_ids"]))
    return []


@fault("loss_over_whole_transcript", {"U601", "U602"}, group="updates-1")
def loss_over_whole_transcript(ctx: Ctx) -> list[str]:
    """The loss was divided by the whole transcript length (system, user, tool and template
    tokens included), diluting every policy token's gradient."""
    u = ctx.updates[0]
    u["loss_denominator"] = float(sum(len(ctx.by_id[i]["token_ids"]) for i in u["trajectory_ids"]))
    return []


@fault("advantages_population_std", {"U603"}, group="episodes-3")
def advantages_population_std(ctx: Ctx) -> list[str]:
    """GRPO advantages normalised with the population std (ddof 0) instead of ddof 1."""
    u = ctx.updates[0]
    groups: dict[str, list[int]] = {}
    for k, tid in enumerate(u["trajectory_ids"]):
        groups.setdefault(ctx.by_id[tid].get("group_id") or ctx.by_id[tid]["task_id"], []).append(k)
    touched = []
    for idx in groups.values():
        r = np.array([ctx.by_id[u["trajectory_ids"][k]]["reward"] for k in idx], dtype=float)
        if len(r) < 2 or r.std() == 0:
            continue
        adv = (r - r.mean()) / (r.std(ddof=0) + 1e-6)
        for k, a in zip(idx, adv):
            u["advantages"][k] = float(a)
            touched.append(u["trajectory_ids"][k])
    if not touched:
        raise ValueError("the log has no informative group this fault can break")
    return touched


@fault("advantages_on_degenerate_group", {"U603", "U604"}, group="updates-1")
def advantages_on_degenerate_group(ctx: Ctx) -> list[str]:
    """A degenerate group (all rewards equal) got advantages against the batch mean."""
    for u in ctx.updates:
        groups: dict[str, list[int]] = {}
        for k, tid in enumerate(u["trajectory_ids"]):
            groups.setdefault(ctx.by_id[tid].get("group_id") or ctx.by_id[tid]["task_id"], []).append(k)
        mean = float(np.mean([ctx.by_id[i]["reward"] for i in u["trajectory_ids"]]))
        for idx in groups.values():
            r = [ctx.by_id[u["trajectory_ids"][k]]["reward"] for k in idx]
            if len(idx) >= 2 and len(set(r)) == 1 and abs(r[0] - mean) > 1e-3:
                for k in idx:
                    u["advantages"][k] = r[0] - mean
                return [u["trajectory_ids"][k] for k in idx]
    raise ValueError("the log has no degenerate group this fault can break")


@fault("update_names_missing_trajectory", {"U605"}, group="episodes-3")
def update_names_missing_trajectory(ctx: Ctx) -> list[str]:
    """An update names a trajectory whose shard never reached the log."""
    u = ctx.updates[-1]
    u["trajectory_ids"].append("ghost-000")
    if u.get("advantages") is not None:
        u["advantages"].append(0.0)
    return ["ghost-000"]


@fault("excluded_trajectory_trained", {"U606"})
def excluded_trajectory_trained(ctx: Ctx) -> list[str]:
    """A truncated episode that the exclude policy keeps out of training entered an update."""
    t = ctx.pick(lambda t: t["reward"] is None and t["truncated"], "excluded trajectory")
    v = t["turns"][0]["policy_version"]
    u = next((u for u in ctx.updates if u["trainer_version"] == v), ctx.updates[0])
    u["trajectory_ids"].append(t["trajectory_id"])
    if u.get("advantages") is not None:
        u["advantages"].append(0.0)
    sync_denominator(ctx, t["trajectory_id"])
    return [t["trajectory_id"]]
