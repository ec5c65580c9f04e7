"""Faults the updates and reduction checks (U) must catch."""

from __future__ import annotations

import numpy as np

from .base import Ctx, NoTarget, append_member, fault, loss_evidence, n_trainable, sync_denominator


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
        raise NoTarget("the log has no informative group this fault can break")
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
    raise NoTarget("the log has no degenerate group this fault can break")


@fault("update_names_missing_trajectory", {"U605"}, group="episodes-3")
def update_names_missing_trajectory(ctx: Ctx) -> list[str]:
    """An update names a trajectory whose shard never reached the log."""
    append_member(ctx.updates[-1], "ghost-000", 0)
    return ["ghost-000"]


@fault("excluded_trajectory_trained", {"U606"})
def excluded_trajectory_trained(ctx: Ctx) -> list[str]:
    """A truncated episode that the exclude policy keeps out of training entered an update."""
    t = ctx.pick(lambda t: t["reward"] is None and t["truncated"], "excluded trajectory")
    v = t["turns"][0]["policy_version"]
    u = next((u for u in ctx.updates if u["trainer_version"] == v), ctx.updates[0])
    append_member(u, t["trajectory_id"], n_trainable(t))
    sync_denominator(ctx, t["trajectory_id"])
    return [t["trajectory_id"]]


@fault("masked_tokens_in_numerator", {"U607"}, group="evidence-1")
def masked_tokens_in_numerator(ctx: Ctx) -> list[str]:
    """The token-mean loss sums every token's loss but divides by the masked count: prompt,
    template and tool tokens enter the numerator (alibaba/ROLL#444)."""
    loss_evidence(ctx)
    u = next((u for u in ctx.updates if u["trajectory_ids"]), None)
    if u is None:
        raise NoTarget("the log has no update with a batch this fault can break")
    k = ctx.rng.randrange(len(u["trajectory_ids"]))
    tid = u["trajectory_ids"][k]
    u["numerator_tokens"][k] = len(ctx.by_id[tid]["token_ids"])
    return [tid]


@fault("rejected_in_group_statistics", {"U608", "U603"}, group="evidence-1")
def rejected_in_group_statistics(ctx: Ctx) -> list[str]:
    """A rejected episode (reward null: truncated under exclude, or an infrastructure failure)
    is dropped from the batch, but its reward, filled with 0, still enters its group's GRPO
    mean and std, shifting every trained member's advantage (verl-project/verl#6452)."""
    loss_evidence(ctx)
    key = lambda t: t.get("group_id") or t["task_id"]
    for t in ctx.trajs:
        if t["reward"] is not None:
            continue
        for u in ctx.updates:
            if u.get("advantages") is None or u.get("advantage_estimator") != "grpo" or u.get("window_trajectory_ids"):
                continue
            idx = [k for k, i in enumerate(u["trajectory_ids"]) if i in ctx.by_id and key(ctx.by_id[i]) == key(t)]
            r = np.array([ctx.by_id[u["trajectory_ids"][k]]["reward"] for k in idx], dtype=float)
            if len(idx) < 2 or not np.isfinite(r).all() or np.ptp(r) == 0:
                continue
            with_zero = np.append(r, 0.0)
            adv = (r - with_zero.mean()) / (with_zero.std(ddof=1) + 1e-6)
            for k, a in zip(idx, adv):
                u["advantages"][k] = float(a)
            u["stat_trajectory_ids"].append(t["trajectory_id"])
            return [t["trajectory_id"]] + [u["trajectory_ids"][k] for k in idx]
    raise NoTarget("the log has no excluded episode whose group is trained with GRPO advantages")


def _population_std_advantages(ctx: Ctx) -> None:
    """rLLM's GRPO as a compliant trainer records it: every update's advantages recomputed with
    the population std (ddof 0) and declared as grpo_population_std."""
    for u in ctx.updates:
        if u.get("advantages") is None:
            continue
        groups: dict[str, list[int]] = {}
        for k, tid in enumerate(u["trajectory_ids"]):
            t = ctx.by_id.get(tid)
            if t is not None:
                groups.setdefault(t.get("group_id") or t["task_id"], []).append(k)
        for idx in groups.values():
            r = np.array([ctx.by_id[u["trajectory_ids"][k]]["reward"] for k in idx], dtype=float)
            if not np.isfinite(r).all():
                continue
            adv = np.zeros(len(r)) if len(r) < 2 else (r - r.mean()) / (r.std(ddof=0) + 1e-6)
            for k, a in zip(idx, adv):
                u["advantages"][k] = float(a)
        u["advantage_estimator"] = "grpo_population_std"


@fault("advantages_singleton_groups", {"U603"})
def advantages_singleton_groups(ctx: Ctx) -> list[str]:
    """GRPO with the population std (rLLM), but every repeat of a prompt got a uid of its own, so
    each was grouped alone and kept its raw reward as its advantage (the size-1 branch: mean 0,
    std 1; rllm-org/rllm#776). Broken here in the groups whose rewards differ (in a group where every
    member succeeded, U604 would fire too)."""
    _population_std_advantages(ctx)
    key = lambda t: t.get("group_id") or t["task_id"]
    for u in ctx.updates:
        if u.get("advantages") is None:
            continue
        known = [ctx.by_id[i] for i in u["trajectory_ids"] if i in ctx.by_id]
        rewards: dict[str, set] = {}
        for t in known:
            rewards.setdefault(key(t), set()).add(t["reward"])
        touched = []
        for k, tid in enumerate(u["trajectory_ids"]):
            m = ctx.by_id.get(tid)
            if m is None or m["reward"] is None or len(rewards[key(m)]) < 2 or None in rewards[key(m)]:
                continue
            if abs(u["advantages"][k] - m["reward"]) > 1e-3:
                touched.append(tid)
            u["advantages"][k] = float(m["reward"])
        if touched:
            return touched
    raise NoTarget("the log has no update whose advantages this fault changes")


@fault("advantages_resampled_under_original_keys", {"U603"})
def advantages_resampled_under_original_keys(ctx: Ctx) -> list[str]:
    """The batch was resampled with replacement after its advantages were computed (PF-PPO's
    reweighting, which draws the high-|score| rows), and the resampled advantages were written back
    under the original trajectories' keys, so each trajectory trains on another's advantage
    (verl-project/verl#7956, the verl V1 trainer). Broken here in the groups whose rewards differ
    (a degenerate group given another's advantage would be U604 too)."""
    key = lambda t: t.get("group_id") or t["task_id"]
    for u in ctx.updates:
        if u.get("advantages") is None:
            continue
        ids = u["trajectory_ids"]
        rewards: dict[str, set] = {}
        for tid in ids:
            if tid in ctx.by_id:
                rewards.setdefault(key(ctx.by_id[tid]), set()).add(ctx.by_id[tid]["reward"])
        rows = [
            k
            for k, tid in enumerate(ids)
            if tid in ctx.by_id and len(rewards[key(ctx.by_id[tid])]) > 1 and None not in rewards[key(ctx.by_id[tid])]
        ]
        if len(rows) < 2:
            continue
        top = max(abs(ctx.by_id[ids[k]]["reward"]) for k in rows)
        drawn = [k for k in rows if abs(ctx.by_id[ids[k]]["reward"]) == top]  # what |score|^2 weights draw
        old = list(u["advantages"])
        touched = []
        for k in rows:
            u["advantages"][k] = old[ctx.rng.choice(drawn)]
            if abs(u["advantages"][k] - old[k]) > 1e-3:
                touched.append(ids[k])
        if touched:
            return touched
        u["advantages"] = old
    raise NoTarget("the log has no update with an informative group this fault can break")


def reducer_evidence(ctx: Ctx, per_sample_floor: bool = False) -> None:
    """Contract 1.4 reducer evidence as a per-token-mean trainer writes it: each step's divisor is
    the trainable tokens of every record of the step (`token_mean_step`); with `per_sample_floor`
    each sample's count is clamped to at least 1 before the sum, as slime's and miles' loss do."""
    steps: dict[int, float] = {}
    for u in ctx.updates:
        counts = [n_trainable(ctx.by_id[i]) for i in u["trajectory_ids"] if i in ctx.by_id]
        floor = [max(c, 1) for c in counts] if per_sample_floor else counts
        steps[u["update_step"]] = steps.get(u["update_step"], 0.0) + float(sum(floor))
    for u in ctx.updates:
        u["reducer_mode"] = "token_mean_step"
        u["reducer_divisor"] = max(steps[u["update_step"]], 1.0)


@fault("removed_sample_counted_as_token", {"U609"})
def removed_sample_counted_as_token(ctx: Ctx) -> list[str]:
    """A sample removed from the loss (its mask zeroed, its reward kept for the group statistics)
    still adds one token to the per-token loss divisor: the reducer clamps each sample's count to
    at least 1 before summing (radixark/miles#2796), so every gradient of the step shrinks."""
    t = ctx.pick(lambda t: any(t["loss_mask"]) and t["trajectory_id"] in ctx.used(), "trained trajectory")
    t["loss_mask"] = [False] * len(t["loss_mask"])
    t["loss_excluded"] = True
    if t.get("num_trainable_tokens") is not None:
        t["num_trainable_tokens"] = 0
    sync_denominator(ctx, t["trajectory_id"])
    reducer_evidence(ctx, per_sample_floor=True)
    return [t["trajectory_id"]]


def _stale(ctx: Ctx, u: dict) -> list[str]:
    """The trajectories of update `u` with a turn sampled at another version than its trainer's."""
    v = u.get("trainer_version")
    return [
        i
        for i in u["trajectory_ids"]
        if i in ctx.by_id and v is not None and any(tr.get("policy_version") != v for tr in ctx.by_id[i]["turns"])
    ]


def ratio_evidence(ctx: Ctx) -> None:
    """Contract 1.4 ratio evidence as a compliant asynchronous trainer that recomputes the old
    log-probs with the weights each update starts from writes it: anchor current, PPO clipping on,
    no correction while one set of weights sampled the update's batch, else a truncated
    importance-sampling correction toward the behaviour log-probs (cap 2)."""
    for u in ctx.updates:
        lagged = bool(_stale(ctx, u))
        u["ratio_anchor"] = "current"
        u["ratio_correction"] = "truncated_is" if lagged else "none"
        u["ratio_correction_cap"] = 2.0 if lagged else None
        u["ratio_clipping"] = True


@fault("ratio_anchored_on_current_weights", {"U610"})
def ratio_anchored_on_current_weights(ctx: Ctx) -> list[str]:
    """An asynchronous trainer trains part of a batch sampled one version behind its weights
    (within its promised lag) but takes the importance ratio against a recomputation by the current
    weights, with no correction toward the behaviour log-probs (radixark/miles#1829,
    NovaSky-AI/SkyRL#1315): the ratio is 1 at the first step and its clip bounds nothing."""
    ratio_evidence(ctx)
    u = next((u for u in ctx.updates if (u.get("trainer_version") or 0) >= 1), None)
    if u is None:
        raise NoTarget("the log has no update past the first version")
    if u["ratio_correction"] == "none":  # one set of weights sampled it: put a third one version behind
        for tid in [i for i in u["trajectory_ids"] if i in ctx.by_id][::3]:
            for tr in ctx.by_id[tid]["turns"]:
                tr["policy_version"] = u["trainer_version"] - 1
        u["max_policy_lag"] = max(u.get("max_policy_lag") or 0, 1)
    u["ratio_correction"], u["ratio_correction_cap"] = "none", None  # the correction the stale ones needed, dropped
    return _stale(ctx, u)
