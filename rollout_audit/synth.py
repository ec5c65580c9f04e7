"""Small synthetic rollout logs that satisfy every rule of the contract, for tests, examples
and property tests. (The reference agent writes real ones; benchmarks have their own
vectorised generator for large logs.)

`make_log()` returns (trajectory records, update records) as lists of dicts; mutate a copy
to break exactly one rule.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from typing import Any

import numpy as np

from .contract import schema as S

ACTIONS = ["inspect", "pickup_red", "pickup_blue", "open_red", "open_blue", "finish"]


def grpo(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """(R - mean) / (std with ddof 1 + eps); zeros for a group of one."""
    r = np.asarray(rewards, dtype=np.float64)
    if len(r) < 2:
        return [0.0] * len(r)
    return list((r - r.mean()) / (r.std(ddof=1) + eps))


def make_trajectory(
    tid: str,
    task: int,
    rng: random.Random,
    *,
    version: int = 0,
    gamma: float = 0.99,
    n_turns: int | None = None,
    success: bool | None = None,
    truncated: bool = False,
    group: int = 0,
) -> dict[str, Any]:
    """One compliant trajectory record with every optional column filled."""
    T = n_turns if n_turns is not None else rng.randint(1, 6)
    success = (rng.random() < 0.5) if success is None else success
    ids: list[int] = []
    src: list[int] = []
    mask: list[bool] = []
    lps: list[float | None] = []
    tturn: list[int] = []

    def add(tokens, source, turn, lp=None):
        for k, tok in enumerate(tokens):
            ids.append(tok)
            src.append(source)
            mask.append(source == 2)
            lps.append(None if lp is None else lp[k])
            tturn.append(turn)

    add([1, 2, 3], 0, -1)
    add([10 + task % 50, 11, 12, 13], 1, -1)
    phi = [round(0.1 * (t + 1) + 0.05 * (task % 3), 6) for t in range(T + 1)]
    terminal = not truncated
    if terminal:
        phi[T] = 0.0
    values = [round(rng.uniform(-0.5, 1.0), 6) for _ in range(T)]
    final_value = 0.0 if terminal else round(rng.uniform(0, 1), 6)
    outcome = 1.0 if (success and terminal) else 0.0
    turns: list[dict[str, Any]] = []
    prev = None
    for t in range(T):
        add([100, 101], 4, t)
        ctx_len = len(ids)
        m = rng.randint(1, 4)
        choices = [a for a in ACTIONS if a != prev] if t >= 2 else ACTIONS
        action = rng.choice(choices)
        prev = action
        pol = [200 + ACTIONS.index(action) * 10 + k for k in range(m)]
        lp = [float(np.float32(-rng.uniform(0.01, 3.0))) for _ in range(m)]
        add(pol, 2, t, lp)
        add([102], 4, t)
        add([300 + t, 301, 302], 3, t)
        r = outcome if t == T - 1 else 0.0
        shaping = gamma * phi[t + 1] - phi[t]
        v_next = values[t + 1] if t + 1 < T else final_value
        turns.append(
            {
                "turn_id": t,
                "policy_version": version,
                "logprob": float(sum(lp)),
                "num_policy_tokens": m,
                "temperature": 1.0,
                "top_p": 1.0,
                "action_text": f"<call>{action}</call>",
                "parsed_action": json.dumps({"action": action}),
                "observation_text": f"obs {t}",
                "reward": r,
                "reward_components": [("outcome", r)],
                "potential_before": phi[t],
                "potential_after": phi[t + 1],
                "shaping": shaping,
                "value": values[t],
                "td_residual": r + shaping + gamma * v_next - values[t],
                "latency_s": 0.01,
                "tool_latency_s": 0.002,
                "tool_status": "ok",
                "finish_reason": "stop" if (t == T - 1 and terminal) else "tool_calls",
                "sampled_token_ids": pol,
                "context_length": ctx_len,
                "context_sha256": S.context_sha256(ids, ctx_len),
            }
        )
    ret = sum(gamma**t * (tr["reward"] + tr["shaping"]) for t, tr in enumerate(turns))
    return {
        "trajectory_id": tid,
        "task_id": f"task{task}",
        "group_id": f"task{task}/g{group}",
        "environment_id": "keydoor",
        "environment_version": "1.0",
        "reset_seed": task,
        "initial_state_id": None,
        "initial_state_checksum": hashlib.sha256(f"seed{task}".encode()).hexdigest()[:16],
        "final_state_checksum": hashlib.sha256(f"{tid}".encode()).hexdigest()[:16],
        "verifier_version": "v1",
        "tokenizer_id": "keydoor-tok-1",
        "gamma": gamma,
        "token_ids": ids,
        "token_source": src,
        "loss_mask": mask,
        "behavior_logprobs": lps,
        "token_turn": tturn,
        "turns": turns,
        "terminated": terminal,
        "truncated": not terminal,
        "infra_error": False,
        "stop_reason": ("success" if success else "failure") if terminal else "max_turns",
        "reward": outcome if terminal else None,
        "verifier_success": bool(success and terminal),
        "discounted_return": ret,
        "final_value": final_value,
        "num_trainable_tokens": sum(mask),
        "wall_clock_s": 0.5 + 0.1 * T,
    }


def make_log(
    n_tasks: int = 4,
    group_size: int = 4,
    n_versions: int = 2,
    seed: int = 0,
    truncated_share: float = 0.1,
    gamma: float = 0.99,
) -> tuple[list[dict], list[dict]]:
    """A compliant log: groups of `group_size` per task per version, one update per version."""
    rng = random.Random(seed)
    trajs, updates = [], []
    n = 0
    for v in range(n_versions):
        batch = []
        for task in range(n_tasks):
            p = (task + 1) / (n_tasks + 1)
            for _ in range(group_size):
                tr = make_trajectory(
                    f"t{n:06d}",
                    task,
                    rng,
                    version=v,
                    gamma=gamma,
                    success=rng.random() < p,
                    truncated=rng.random() < truncated_share,
                    group=v,
                )
                n += 1
                trajs.append(tr)
                if tr["reward"] is not None:
                    batch.append(tr)
        adv: dict[str, float] = {}
        for g in sorted({b["group_id"] for b in batch}):
            mem = [b for b in batch if b["group_id"] == g]
            adv.update(zip([m["trajectory_id"] for m in mem], grpo([m["reward"] for m in mem])))
        updates.append(
            {
                "update_step": v,
                "trainer_version": v,
                "trajectory_ids": [b["trajectory_id"] for b in batch],
                "reduction": "token",
                "loss_denominator": float(sum(b["num_trainable_tokens"] for b in batch)),
                "advantages": [adv[b["trajectory_id"]] for b in batch],
                "advantage_estimator": "grpo",
                "max_policy_lag": 0,
            }
        )
    return trajs, updates


def nan_safe(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def record_loss_evidence(trajs: list[dict], updates: list[dict], kl_coef: float = 0.01) -> None:
    """Fill, in place, the contract 1.2 evidence of what a compliant trainer built its loss from:
    per token, the episode reward placed on the last policy token (`token_reward`), a KL penalty
    on policy tokens only (`token_kl`, kl_coef·|behaviour log-prob|) and the reward-to-go over
    the policy tokens (`token_returns`); per update, the tokens summed in the loss
    (`numerator_tokens`, the trainable ones) and the trajectories of the group statistics
    (`stat_trajectory_ids`, the batch or its window). Columns already recorded are kept."""
    for t in trajs:
        src = t["token_source"]
        pol = [i for i, s in enumerate(src) if s == 2]
        if "token_reward" not in t:
            placed = [0.0] * len(src)
            if pol and t.get("reward"):
                placed[pol[-1]] = float(t["reward"])
            t["token_reward"] = placed
        if "token_kl" not in t:
            lps = t.get("behavior_logprobs") or [None] * len(src)
            t["token_kl"] = [
                float(np.float32(kl_coef * abs(lp if lp is not None else 1.0))) if s == 2 else 0.0
                for s, lp in zip(src, lps)
            ]
        if "token_returns" not in t:
            ret = [0.0] * len(src)
            acc = 0.0
            for i in reversed(pol):
                acc += (t["token_reward"][i] or 0.0) - (t["token_kl"][i] or 0.0)
                ret[i] = acc
            t["token_returns"] = ret
    by_id = {t["trajectory_id"]: t for t in trajs}
    for u in updates:
        if "numerator_tokens" not in u:
            u["numerator_tokens"] = [int(sum(by_id[i]["loss_mask"])) if i in by_id else 0 for i in u["trajectory_ids"]]
        if "stat_trajectory_ids" not in u:
            u["stat_trajectory_ids"] = list(u.get("window_trajectory_ids") or u["trajectory_ids"])


def gae_value_targets(t: dict, every_position: bool = False) -> list[float]:
    """GAE's A + V per token of trajectory record `t` (0.0 where not computed): over its trainable
    tokens (loss_mask true), from token_reward − token_kl, token_values, gamma, gae_lambda and,
    after the last one, final_value (0 when null); `every_position`: over every position from the
    first trainable one on, the masked ones included, as an estimator that ignores the mask does."""
    mask, v = t["loss_mask"], t["token_values"]
    kl = t.get("token_kl") or [0.0] * len(mask)
    g, lam = t.get("gamma") or 1.0, t["gae_lambda"]
    first = next((i for i, m in enumerate(mask) if m), len(mask))
    steps = [i for i in range(first, len(mask)) if every_position or mask[i]]
    out = [0.0] * len(mask)
    adv, v_next = 0.0, t.get("final_value") or 0.0
    for i in reversed(steps):
        delta = (t["token_reward"][i] or 0.0) - (kl[i] or 0.0) + g * v_next - v[i]
        adv = delta + g * lam * adv
        out[i] = adv + v[i]
        v_next = v[i]
    return out


def record_gae_evidence(trajs: list[dict], lam: float = 0.95, seed: int = 0) -> None:
    """Fill, in place, the contract 1.4 evidence of a compliant critic-based trainer: a critic value
    on every token (`token_values`, the masked ones included), `gae_lambda`, and GAE's targets over
    the trainable tokens (`token_value_targets`), after the 1.2 loss evidence (`record_loss_evidence`)."""
    rng = random.Random(seed)
    for t in trajs:
        t["token_values"] = [float(np.float32(rng.uniform(-1.0, 1.0))) for _ in t["token_ids"]]
        t["gae_lambda"] = lam
        t["token_value_targets"] = [float(np.float32(x)) for x in gae_value_targets(t)]


# How a trainer's second log-prob column of a compliant run may differ from the engine's
SECOND_PRECISIONS = ("float32", "bf16", "bf16_engine")


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (round to nearest, ties to even, on the upper 16 bits), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) & np.uint64(0xFFFF0000)
    return rounded.astype(np.uint32).view(np.float32)


def second_logprobs(
    trajs: list[dict], precision: str, seed: int = 0, column: str = "trainer_logprobs", vocab: int = 64
) -> None:
    """Give every trajectory of a compliant log a trainer's recomputation of its policy tokens'
    log-probs (`column`, null elsewhere), as a compliant run would have it: over the same distribution
    as the engine, differing only by arithmetic.

    `float32`: the engine's log-prob recomputed in float32 in another order (a relative error of
    about 10⁻⁶). `bf16`: the same value stored by a trainer that computes in bfloat16 (rounded to 8
    significant bits: up to 0.4% of the log-prob). `bf16_engine`: an engine and a trainer each in
    bfloat16 on the same weights: per token a fresh distribution of `vocab` logits, each side's logits
    perturbed independently by bfloat16-sized error (2⁻⁸ of their magnitude), the token sampled from
    the engine's softmax, both log-probs rounded to bfloat16; the behaviour log-probs (and the turn
    sums) are replaced by the engine's. Sampling from the noisier side makes a sampled token's
    log-prob a little higher under the engine on average (by KL(π_beh ‖ π_trainer)): the compliant
    bias a bf16 run carries."""
    if precision not in SECOND_PRECISIONS:
        raise ValueError(f"precision must be one of {SECOND_PRECISIONS}, got {precision!r}")
    rng = np.random.default_rng(seed)
    for t in trajs:
        lp = np.array([np.nan if x is None else x for x in t["behavior_logprobs"]], np.float64)
        pol = ~np.isnan(lp)
        if precision == "bf16_engine":
            z = rng.normal(0.0, 3.0, (int(pol.sum()), vocab))
            err = 2.0**-8 * (np.abs(z) + 1.0)  # each side's bfloat16-sized error on the logits
            ze, zt = z + rng.normal(0.0, 1.0, z.shape) * err, z + rng.normal(0.0, 1.0, z.shape) * err
            le = ze - np.logaddexp.reduce(ze, axis=1, keepdims=True)
            lt = zt - np.logaddexp.reduce(zt, axis=1, keepdims=True)
            u = rng.random((le.shape[0], 1))
            y = np.minimum((np.cumsum(np.exp(le), axis=1) < u).sum(axis=1), vocab - 1)
            rows = np.arange(le.shape[0])
            lp[pol] = bf16(le[rows, y])
            other = lp.copy()
            other[pol] = bf16(lt[rows, y])
            t["behavior_logprobs"] = [None if np.isnan(x) else float(x) for x in lp]
            for k, tr in enumerate(t["turns"]):
                if tr.get("logprob") is not None:
                    mine = [i for i, q in enumerate(t["token_turn"]) if q == k and pol[i]]
                    tr["logprob"] = float(lp[mine].sum())
        else:
            other = lp + rng.normal(0.0, 1e-6, lp.shape) * (1.0 + np.abs(lp))
            other = np.minimum(other.astype(np.float32), np.float32(0.0))
            if precision == "bf16":
                other = bf16(other)
        t[column] = [None if np.isnan(x) else float(x) for x in np.asarray(other, np.float64)]
