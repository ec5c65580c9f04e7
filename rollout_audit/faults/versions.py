"""Faults the policy versions checks (P) must catch."""

from __future__ import annotations

from .base import Ctx, NoTarget, fault


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
        raise NoTarget("the log has no update late enough for this fault")
    u = max(ups, key=lambda u: u["trainer_version"])
    tid = ctx.rng.choice(u["trajectory_ids"])
    for tr in ctx.by_id[tid]["turns"]:
        tr["policy_version"] = u["trainer_version"] - (u.get("max_policy_lag") or 0) - 1
    return [tid]


def record_routes(t: dict) -> None:
    """The expert routes a compliant routing-replay trainer keeps (contract 1.3
    routed_experts_version): each policy token's from the call that sampled it, each other token's
    from the prefill of the first call whose context held it (the last call's after the last turn)."""
    versions = [tr.get("policy_version") for tr in t["turns"]]
    if not versions or None in versions:
        return  # no version to tie the routes to (P505 needs turns.policy_version)
    out = []
    for s, k in zip(t["token_source"], t["token_turn"]):
        if s == 2:
            out.append(versions[k])
        else:
            out.append(versions[min(k + 1, len(versions) - 1)])
    t["routed_experts_version"] = out


def _routed(ctx: Ctx) -> dict:
    for t in ctx.trajs:
        record_routes(t)
    return ctx.pick(
        lambda t: len(t["turns"]) >= 2 and t["token_source"].count(2) >= 2 and "routed_experts_version" in t,
        "trajectory with two turns and their policy versions",
    )


@fault("routes_resumed_duplicated", {"P505"})
def routes_resumed_duplicated(ctx: Ctx) -> list[str]:
    """A partial rollout resumed after a weight update: the routes of the first call's tokens
    were appended again with the resumed call's, so the replayed array is longer than the
    sequence (verl-project/verl#6029)."""
    t = _routed(ctx)
    pos = [i for i, k in enumerate(t["token_turn"]) if k == 0 and t["token_source"][i] == 2]
    t["routed_experts_version"] = t["routed_experts_version"] + [t["routed_experts_version"][i] for i in pos]
    return [t["trajectory_id"]]


@fault("routes_of_resumed_weights", {"P505"})
def routes_of_resumed_weights(ctx: Ctx) -> list[str]:
    """The resumed call's prefill replaced the routes of the prefix the older weights had routed
    (the prompt and the tokens they sampled): a turn's policy tokens are replayed through the next
    version's experts (verl-project/verl#6046, NovaSky-AI/SkyRL#1908)."""
    t = _routed(ctx)
    v = t["turns"][0]["policy_version"]
    last = max(i for i, (s, k) in enumerate(zip(t["token_source"], t["token_turn"])) if s == 2 and k == 0)
    for i in range(last + 1):
        t["routed_experts_version"][i] = v + 1
    return [t["trajectory_id"]]
