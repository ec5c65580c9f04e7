"""Vectorised generator of large synthetic rollout logs that satisfy contract v1.

    python -m benchmarks.generate --tokens 50M --out benchmarks/data/50M [--fault-share 0.01]

Same conventions as `rollout_audit.synth.make_log` (the reference for "compliant"), every
optional trajectory column and turn field filled, but built with numpy + pyarrow from flat
arrays and offsets: no Python loop per trajectory or per token. The one per-turn loop is
the SHA-256 of each turn's context prefix (`context_sha256`), hashed incrementally per
trajectory (update with the new bytes, digest a copy), so each token is hashed once.

Shape (like /work/shared/notes/performance.md): ~600 tokens and ~8 turns per trajectory,
groups of 8 per task, 64 groups per optimizer update, ~5% episodes truncated at max_turns
(null reward, excluded from updates) and ~0.5% infra errors (null reward, excluded).

Layout: `part-00000.parquet ...` (16384 trajectories per file, row groups of 4096, zstd,
metadata rollout_log.schema_version=1, rollout_log.kind=trajectories), and
`updates/updates.parquet` (kind=updates), and `_generated.json` (parameters; the audit
ignores files starting with `_`). Written into a temporary directory renamed at the end,
so a directory that exists is complete.

With `--fault-share f`, a fraction f of trajectories gets one injected fault each, in
rotation (see FAULTS); their ids and kinds are listed in `_generated.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollout_audit.contract import schema as S

ROW_GROUP = 4096
GROUP_SIZE = 8
GROUPS_PER_UPDATE = 64
GAMMA = 0.99
LAMBDA = 0.95  # GAE's λ of the generated critic
TRUNCATED_SHARE = 0.05
INFRA_SHARE = 0.005
GRPO_EPS = 1e-6
ACTIONS = ["inspect", "pickup_red", "pickup_blue", "open_red", "open_blue", "finish"]

# fault kind -> the code it must raise (other codes may follow from it, on the same
# trajectory or, for update-level checks, on the update that contains it)
FAULTS = {
    1: ("mask_tool", "M101"),  # loss_mask true on the observation tokens of turn 0
    2: ("turn_logprob", "L202"),  # turn 0 logprob off by +0.5
    3: ("trainable_count", "M103"),  # num_trainable_tokens off by +3 (update denominator stays right)
    4: ("stop_reason", "T302"),  # a terminated episode recorded with stop_reason max_tokens
}


@dataclass(frozen=True)
class Shape:
    """The shape of the generated episodes: turns, tokens per turn, which columns are written."""

    turns_min: int  # turns per episode: turns_min + Binomial(turns_spread, 0.5)
    turns_spread: int
    policy_mean: float  # policy tokens per turn: 1 + Poisson(policy_mean)
    obs_mean: float  # observation tokens per turn: 4 + Poisson(obs_mean)
    row_group: int  # trajectories per row group
    optional: bool  # write the contract's optional columns and turn fields (O), or only R and C

    @property
    def max_turns(self) -> int:
        return self.turns_min + self.turns_spread

    @property
    def tokens_per_episode(self) -> float:
        turns = self.turns_min + self.turns_spread / 2
        return 104 + turns * (4 + self.policy_mean + self.obs_mean + 4)


SHAPES = {
    # ~600 tokens and ~8 turns per episode, every column (the shape of the first benchmarks)
    "default": Shape(4, 8, 22, 32, ROW_GROUP, True),
    # agentic: ~40 turns with long tool outputs (~19k tokens per episode), required and
    # conditional columns and group_id only (no potentials, values, context digests, sampled ids)
    "long": Shape(16, 48, 60, 400, 128, False),
}

# segment kinds inside a trajectory: sys, user, then per turn: open template, policy, close template, observation
_K_SYS, _K_USER, _K_OPEN, _K_POL, _K_CLOSE, _K_OBS = range(6)
_KIND_SOURCE = np.array([0, 1, 4, 2, 4, 3], np.uint8)
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def parse_size(s: str) -> int:
    """'50M' -> 50_000_000, '200k' -> 200_000, '1.5G' -> 1_500_000_000."""
    s = s.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


# ---------------------------------------------------------------- vectorised string columns


def _strings_fixed(mat: np.ndarray) -> pa.StringArray:
    """A string array from an (n, width) uint8 matrix of ASCII codes (all of one width)."""
    n, w = mat.shape
    offsets = (np.arange(n + 1, dtype=np.int64) * w).astype(np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(mat).tobytes()))


def _digits(x: np.ndarray, width: int) -> np.ndarray:
    """(n, width) ASCII decimal digits of non-negative integers, zero padded."""
    x = x.astype(np.int64)
    out = np.empty((len(x), width), np.uint8)
    for k in range(width - 1, -1, -1):  # loop over digit positions, not rows
        out[:, k] = 48 + x % 10
        x = x // 10
    return out


def _hex_bytes(b: np.ndarray) -> np.ndarray:
    """(n, 2k) ASCII hex of an (n, k) uint8 matrix."""
    return np.stack([_HEX[b >> 4], _HEX[b & 15]], axis=-1).reshape(len(b), -1)


def _fmt(n: int, *parts) -> pa.StringArray:
    """Concatenate constant strings and (int array, width) decimal fields, row-wise."""
    cols = []
    for p in parts:
        if isinstance(p, str):
            cols.append(np.broadcast_to(np.frombuffer(p.encode(), np.uint8), (n, len(p))))
        elif isinstance(p[0], str) and p[0] == "hex":
            cols.append(_hex_bytes(p[1].astype(">u8").view(np.uint8).reshape(n, 8)))
        else:
            cols.append(_digits(p[0], p[1]))
    return _strings_fixed(np.concatenate(cols, axis=1))


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a cheap, deterministic 64-bit hash of integers."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _take_str(values: list[str], idx: np.ndarray) -> pa.Array:
    return pa.array(values, pa.string()).take(pa.array(idx.astype(np.int32)))


def _list(offsets: np.ndarray, values: pa.Array) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


# ---------------------------------------------------------------- the plan (per trajectory)


@dataclass
class Plan:
    """Trajectory-level decisions for the whole log (small: a few arrays of length N)."""

    n: int
    group: np.ndarray
    update: np.ndarray
    task: np.ndarray
    n_turns: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infra: np.ndarray
    success: np.ndarray
    fault: np.ndarray  # 0 none, else a key of FAULTS
    shape: Shape = SHAPES["default"]


def make_plan(tokens: int, seed: int, fault_share: float, shape: Shape = SHAPES["default"]) -> Plan:
    rng = np.random.default_rng([seed, 0])
    n = max(GROUP_SIZE, int(round(tokens / shape.tokens_per_episode / GROUP_SIZE)) * GROUP_SIZE)
    n_groups = n // GROUP_SIZE
    n_tasks = max(1, n_groups // 8)  # each task appears in ~8 groups over the log
    p_task = rng.uniform(0.25, 0.75, n_tasks)
    g_task = rng.integers(0, n_tasks, n_groups)
    group = np.arange(n) // GROUP_SIZE
    task = g_task[group]
    u = rng.random(n)
    infra = u < INFRA_SHARE
    truncated = (u >= INFRA_SHARE) & (u < INFRA_SHARE + TRUNCATED_SHARE)
    terminated = ~(infra | truncated)
    success = terminated & (rng.random(n) < p_task[task])
    n_turns = (shape.turns_min + rng.binomial(shape.turns_spread, 0.5, n)).astype(np.int64)  # default 4..12
    n_turns[truncated] = shape.max_turns
    fault = np.zeros(n, np.int8)
    if fault_share > 0:
        k = max(len(FAULTS), int(round(fault_share * n)))
        cand = rng.choice(n, size=min(k, n), replace=False)
        kinds = (np.arange(len(cand)) % len(FAULTS) + 1).astype(np.int8)
        # stop_reason faults need a terminated episode; give the others the rest
        ok = (kinds != 4) | terminated[cand]
        fault[cand[ok]] = kinds[ok]
    return Plan(
        n, group, group // GROUPS_PER_UPDATE, task, n_turns, terminated, truncated, infra, success, fault, shape
    )


# ---------------------------------------------------------------- one row group


def make_chunk(plan: Plan, lo: int, hi: int, seed: int) -> tuple[pa.Table, np.ndarray]:
    """Trajectories lo..hi-1 as a contract table; also their true trainable counts."""
    rng = np.random.default_rng([seed, 1, lo])
    n = hi - lo
    gidx = np.arange(lo, hi, dtype=np.int64)
    T = plan.n_turns[lo:hi]
    term = plan.terminated[lo:hi]
    trunc = plan.truncated[lo:hi]
    infra = plan.infra[lo:hi]
    success = plan.success[lo:hi]
    fault = plan.fault[lo:hi]
    version = plan.update[lo:hi].astype(np.int64)
    task = plan.task[lo:hi].astype(np.int64)

    # ---- turns (flat, nT rows)
    turn_start = _offsets(T)
    nT = int(turn_start[-1])
    t_row = np.repeat(np.arange(n), T)
    t_idx = np.arange(nT) - turn_start[:-1][t_row]
    m = 1 + rng.poisson(plan.shape.policy_mean, nT)  # policy tokens per turn (>= 1)
    o = 4 + rng.poisson(plan.shape.obs_mean, nT)  # observation tokens per turn
    is_last = t_idx == T[t_row] - 1

    # ---- segments: 2 per trajectory + 4 per turn, laid out in trajectory order
    seg_cnt = 2 + 4 * T
    seg_start = _offsets(seg_cnt)
    nS = int(seg_start[-1])
    seg_len = np.empty(nS, np.int64)
    seg_kind = np.empty(nS, np.int8)
    seg_turn = np.empty(nS, np.int16)
    s0 = seg_start[:-1]
    seg_len[s0] = rng.integers(16, 49, n)
    seg_len[s0 + 1] = rng.integers(24, 121, n)
    seg_kind[s0], seg_kind[s0 + 1] = _K_SYS, _K_USER
    seg_turn[s0] = seg_turn[s0 + 1] = -1
    base = s0[t_row] + 2 + 4 * t_idx
    for k, (kind, ln) in enumerate(((_K_OPEN, 2), (_K_POL, m), (_K_CLOSE, 1), (_K_OBS, o))):
        seg_len[base + k] = ln
        seg_kind[base + k] = kind
        seg_turn[base + k] = t_idx
    seg_row = np.repeat(np.arange(n), seg_cnt)
    seg_tok = _offsets(seg_len)

    # ---- tokens (flat)
    ntok = int(seg_tok[-1])
    kind = np.repeat(seg_kind, seg_len)
    src = _KIND_SOURCE[kind]
    turn = np.repeat(seg_turn, seg_len)
    row = np.repeat(seg_row, seg_len)
    pos_in_seg = np.arange(ntok) - np.repeat(seg_tok[:-1], seg_len)
    ids = rng.integers(1000, 50000, ntok, dtype=np.int32)
    ids[kind == _K_OPEN] = (100 + pos_in_seg[kind == _K_OPEN]).astype(np.int32)
    ids[kind == _K_CLOSE] = 102
    pol = src == S.POLICY
    lp32 = np.zeros(ntok, np.float32)
    lp32[pol] = -rng.exponential(0.8, int(pol.sum())).astype(np.float32) - np.float32(1e-4)
    mask = pol.copy()
    tok_per_traj = np.bincount(row, minlength=n)
    tok_start = _offsets(tok_per_traj)

    # per-turn values computed from the tokens
    pol_turn_start = _offsets(m)
    lp_turn = np.add.reduceat(lp32[pol].astype(np.float64), pol_turn_start[:-1]) if nT else np.zeros(0)
    ctx_len = seg_tok[base + 1] - tok_start[:-1][t_row]
    true_trainable = np.bincount(row[pol], minlength=n).astype(np.int64)

    # context_sha256: incremental per trajectory over the little-endian int32 bytes
    mv = memoryview(ids.astype("<i4").tobytes())
    begin = (tok_start[:-1][t_row] * 4).tolist()
    end = ((tok_start[:-1][t_row] + ctx_len) * 4).tolist()
    first = (t_idx == 0).tolist()
    digests = bytearray()
    sha = hashlib.sha256
    h = sha()
    cur = 0
    for b, e, f in zip(begin, end, first):
        if f:
            h = sha()
            cur = b
        h.update(mv[cur:e])
        cur = e
        digests += h.copy().digest()
    ctx_sha = _strings_fixed(_hex_bytes(np.frombuffer(bytes(digests), np.uint8).reshape(nT, 32)))

    # ---- rewards, potentials, values
    outcome = success.astype(np.float64)
    r = np.where(is_last & term[t_row], outcome[t_row], 0.0)
    phi_start = turn_start[:-1] + np.arange(n)  # T+1 potentials per trajectory
    phi = np.round(rng.uniform(0.0, 1.0, nT + n), 6)
    phi[(phi_start + T)[term | infra]] = 0.0  # zero terminal potential
    p_before = phi[phi_start[t_row] + t_idx]
    p_after = phi[phi_start[t_row] + t_idx + 1]
    shaping = GAMMA * p_after - p_before
    value = np.round(rng.uniform(-0.5, 1.0, nT), 6)
    final_value = np.where(trunc, np.round(rng.uniform(0.0, 1.0, n), 6), 0.0)
    v_next = np.where(is_last, final_value[t_row], np.append(value[1:], 0.0))
    td = r + shaping + GAMMA * v_next - value
    disc = GAMMA ** t_idx.astype(np.float64)
    ret = np.bincount(t_row, weights=disc * (r + shaping), minlength=n)

    latency = np.round(rng.uniform(0.05, 2.0, nT), 4)
    tool_latency = np.round(rng.uniform(0.001, 0.2, nT), 4)
    # actions: consecutive turns never repeat (no R409 loop)
    action = np.cumsum(1 + rng.integers(0, 5, nT)) % len(ACTIONS)
    obs_idx = rng.integers(0, 64, nT)
    finish = np.where(is_last & term[t_row], 0, 1)  # 0 stop, 1 tool_calls

    # ---- faults
    num_trainable = true_trainable.copy()
    stop_idx = np.where(term, np.where(success, 0, 1), np.where(trunc, 2, 3))  # success failure max_turns env_error
    turn_lp = lp_turn.copy()
    if fault.any():
        f_tok = fault[row]
        mask |= (f_tok == 1) & (src == 3) & (turn == 0)
        turn_lp[(fault[t_row] == 2) & (t_idx == 0)] += 0.5
        num_trainable[fault == 3] += 3
        stop_idx[fault == 4] = 4  # max_tokens on a terminated episode

    # ---- contract 1.2 loss evidence: the outcome on the last policy token, a KL penalty on policy
    # tokens only, and the reward-to-go over the policy tokens of each episode
    pidx = np.flatnonzero(pol)
    prow = row[pidx]
    ends = np.r_[prow[1:] != prow[:-1], True] if pidx.size else np.zeros(0, bool)
    tok_reward = np.zeros(ntok, np.float32)
    tok_reward[pidx[ends]] = np.where(term, outcome, 0.0)[prow[ends]]
    tok_kl = np.zeros(ntok, np.float32)
    tok_kl[pidx] = np.float32(0.01) * np.abs(lp32[pidx])
    step = tok_reward[pidx].astype(np.float64) - tok_kl[pidx]
    csum = np.cumsum(step)
    tok_ret = np.zeros(ntok, np.float32)
    tok_ret[pidx] = (csum[ends][np.cumsum(np.r_[True, ends[:-1]]) - 1] - csum + step) if pidx.size else 0.0

    tok_val, tok_target = _critic(np.random.default_rng([seed, 2, lo]), row, mask, tok_reward, tok_kl, final_value)

    # ---- arrays
    comp_keys = pa.array(np.tile(np.array(["outcome", "format"], object), nT), pa.string())
    comp_vals = np.stack([r, np.zeros(nT)], axis=1).reshape(-1)
    turn_fields = {
        "turn_id": pa.array(t_idx.astype(np.int16)),
        "policy_version": pa.array(version[t_row]),
        "logprob": pa.array(turn_lp),
        "num_policy_tokens": pa.array(m.astype(np.int32)),
        "temperature": pa.array(np.ones(nT, np.float32)),
        "top_p": pa.array(np.ones(nT, np.float32)),
        "top_k": pa.array(np.zeros(nT, np.int32)),
        "action_text": _take_str([f"<call>{a}</call>" for a in ACTIONS], action),
        "parsed_action": _take_str([json.dumps({"action": a}) for a in ACTIONS], action),
        "observation_text": _take_str([f"obs {k}" for k in range(64)], obs_idx),
        "reward": pa.array(r),
        "raw_reward": pa.array(r),  # contract 1.4: the trainer trains what the environment paid
        "reward_components": pa.MapArray.from_arrays(
            pa.array((np.arange(nT + 1) * 2).astype(np.int32)), comp_keys, pa.array(comp_vals)
        ),
        "potential_before": pa.array(p_before),
        "potential_after": pa.array(p_after),
        "shaping": pa.array(shaping),
        "value": pa.array(value),
        "td_residual": pa.array(td),
        "latency_s": pa.array(latency),
        "tool_latency_s": pa.array(tool_latency),
        "tool_status": _take_str(["ok"], np.zeros(nT, np.int32)),
        "finish_reason": _take_str(["stop", "tool_calls"], finish),
        "sampled_token_ids": _list(pol_turn_start, pa.array(ids[pol])),
        "context_length": pa.array(ctx_len.astype(np.int32)),
        "context_sha256": ctx_sha,
        "template_context_length": pa.array(ctx_len.astype(np.int32)),  # the builder renders as the template does
        "template_context_sha256": ctx_sha,
        # contract 1.5: no capture layer digested these calls (M112 judges nothing)
        "capture_digest": pa.nulls(nT, pa.string()),
        "capture_digest_scheme": pa.nulls(nT, pa.string()),
    }
    tstruct = S.turn_struct()
    turns = pa.StructArray.from_arrays([turn_fields[f.name].cast(f.type) for f in tstruct], fields=list(tstruct))
    seed_of_task = task * 7919 + 17
    reward = pa.array(np.where(term, outcome, np.nan), mask=~term)
    lp_arr = pa.array(lp32, mask=~pol)
    # a trainer's recomputation of the behaviour log-probs (`compare_logprobs`: L207, L211): relative float32 noise of mean 0
    noise = np.random.default_rng([seed, 3, lo]).normal(0.0, 1e-3, lp32.size).astype(np.float32)
    cols = {
        TRAINER_LOGPROBS: _list(tok_start, pa.array(lp32 * (np.float32(1.0) + noise), mask=~pol)),
        "trajectory_id": _fmt(n, "t", (gidx, 9)),
        "task_id": _fmt(n, "task", (task, 6)),
        "group_id": _fmt(n, "task", (task, 6), "/g", (plan.group[lo:hi], 8)),
        "environment_id": _take_str(["bench-keydoor"], np.zeros(n, np.int32)),
        "environment_version": _take_str(["1.0"], np.zeros(n, np.int32)),
        "reset_seed": pa.array(seed_of_task),
        "initial_state_id": _fmt(n, "state", (seed_of_task, 8)),
        "initial_state_checksum": _fmt(n, ("hex", _mix64(seed_of_task))),
        "final_state_checksum": _fmt(n, ("hex", _mix64(gidx + (1 << 40)))),
        "verifier_version": _take_str(["v1"], np.zeros(n, np.int32)),
        "tokenizer_id": _take_str(["bench-tok-1"], np.zeros(n, np.int32)),
        "gamma": pa.array(np.full(n, GAMMA)),
        "token_ids": _list(tok_start, pa.array(ids)),
        "token_source": _list(tok_start, pa.array(src)),
        "loss_mask": _list(tok_start, pa.array(mask)),
        "behavior_logprobs": _list(tok_start, lp_arr),
        "token_turn": _list(tok_start, pa.array(turn.astype(np.int16))),
        "turns": _list(turn_start, turns),
        "terminated": pa.array(term),
        "truncated": pa.array(trunc),
        "infra_error": pa.array(infra),
        "stop_reason": _take_str(["success", "failure", "max_turns", "env_error", "max_tokens"], stop_idx),
        "reward": reward,
        "verifier_success": pa.array(success),
        "discounted_return": pa.array(ret),
        "final_value": pa.array(final_value),
        "num_trainable_tokens": pa.array(num_trainable.astype(np.int32)),
        "wall_clock_s": pa.array(np.round(0.1 + np.bincount(t_row, weights=latency + tool_latency, minlength=n), 4)),
        "token_reward": _list(tok_start, pa.array(tok_reward)),
        "token_kl": _list(tok_start, pa.array(tok_kl)),
        "token_returns": _list(tok_start, pa.array(tok_ret)),
        # contract 1.3: every position's routes from its episode's one version, one policy loss stream
        "routed_experts_version": _list(tok_start, pa.array(version[row])),
        "loss_stream": _list(tok_start, pa.array(np.zeros(ntok, np.uint8))),
        "loss_weight": _list(tok_start, pa.array(mask.astype(np.float32))),
        "overlong_penalty": pa.array(np.zeros(n)),
        **_nucleus(ids, pol, tok_start),
        # contract 1.4: a critic's value on every position, GAE over the trainable tokens
        "token_values": _list(tok_start, pa.array(tok_val)),
        "token_value_targets": _list(tok_start, pa.array(tok_target)),
        "gae_lambda": pa.array(np.full(n, LAMBDA)),
    }
    schema = file_schema(plan.shape)
    turn_type = schema.field("turns").type.value_type
    kept = [turns.field(f.name) for f in turn_type]
    cols["turns"] = _list(turn_start, pa.StructArray.from_arrays(kept, fields=list(turn_type)))
    table = pa.Table.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema)
    return table, true_trainable


TRAINER_LOGPROBS = "trainer_logprobs"  # a second per-token log-prob column, outside the contract (ignored unless named)


# what a generated run has none of (no episode is split, none is kept out of the loss): absent columns
NOT_GENERATED = frozenset(
    {
        "split_from",
        "split_continues",
        "split_position",
        "split_sequence_id",
        "split_context_id",
        "loss_excluded",
        "routed_experts_sha256",  # no expert ids are generated to digest
        "split_exposed_position",
        "split_exposed_logprob_id",
    }
)


def _critic(
    rng: np.random.Generator,
    row: np.ndarray,
    mask: np.ndarray,
    reward: np.ndarray,
    kl: np.ndarray,
    final_value: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Contract 1.4's critic evidence (float32 per token): a value on every position and GAE's A + V
    over the trainable ones (δ = r − kl + γ·V_next − V, A = δ + γλ·A_next, V after the last one the
    row's final_value), built backwards one rank from each row's end at a time, every row at once."""
    values = rng.uniform(-1.0, 1.0, row.size).astype(np.float32)
    targets = np.zeros(row.size, np.float32)
    at = np.flatnonzero(mask)
    if not at.size:
        return values, targets
    r_at = row[at]
    last = np.r_[r_at[1:] != r_at[:-1], True]
    v = values[at].astype(np.float64)
    v_next = np.where(last, final_value[r_at], np.r_[v[1:], 0.0])
    delta = reward[at].astype(np.float64) - kl[at] + GAMMA * v_next - v
    first_of_row = np.flatnonzero(np.r_[True, r_at[1:] != r_at[:-1]])
    ends = np.flatnonzero(last)
    rank = np.repeat(ends, np.diff(np.r_[first_of_row, at.size])) - np.arange(at.size)  # 0 at a row's last
    adv = np.zeros(at.size + 1)
    order = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[order], np.arange(rank.max() + 2))
    for k in range(rank.max() + 1):  # one step per rank: the elements k from their row's end
        sel = order[bounds[k] : bounds[k + 1]]
        adv[sel] = delta[sel] + np.where(last[sel], 0.0, GAMMA * LAMBDA * adv[sel + 1])
    targets[at] = adv[:-1] + v
    return values, targets


def _nucleus(ids: np.ndarray, pol: np.ndarray, tok_start: np.ndarray) -> dict[str, pa.Array]:
    """Contract 1.3's recorded nucleus: each policy token kept with one other id (a top-p that keeps
    two), every other token an empty span; the offsets count every token of a row, one more."""
    kept = np.where(pol, 2, 0)
    flat = np.concatenate([[0], np.cumsum(kept)])
    counts = np.diff(tok_start) + 1
    first = np.repeat(tok_start[:-1], counts)
    at = first + np.arange(counts.sum()) - np.repeat(_offsets(counts)[:-1], counts)
    pairs = np.stack([ids[pol], ids[pol] + 1], axis=1).reshape(-1).astype(np.int32)
    return {
        "nucleus_ids": _list(flat[tok_start], pa.array(pairs)),
        "nucleus_offsets": _list(_offsets(counts), pa.array((flat[at] - flat[first]).astype(np.int32))),
    }


def file_schema(shape: Shape) -> pa.Schema:
    """The trajectories schema a shape writes: every column, or only required and conditional
    columns and turn fields."""
    full = S.arrow_schema("trajectories", S.CONTRACT_VERSION)
    full = pa.schema([f for f in full if f.name not in NOT_GENERATED], metadata=full.metadata)
    if shape.optional:
        return full.append(pa.field(TRAINER_LOGPROBS, pa.list_(pa.float32())))
    # group_id stays: the updates' GRPO advantages are computed per group
    keep = {c.name for t in ("trajectories", "turn") for c in S.columns(t) if c.requirement != "O"} | {"group_id"}
    turn = pa.struct([f for f in S.turn_struct() if f.name in keep])
    fields = [pa.field(f.name, pa.list_(turn)) if f.name == "turns" else f for f in full if f.name in keep]
    return pa.schema(fields, metadata=full.metadata)


# ---------------------------------------------------------------- updates


def make_updates(plan: Plan, trainable: np.ndarray) -> pa.Table:
    """One update per 64 groups: the rewarded episodes, GRPO advantages, token denominator."""
    keep = np.flatnonzero(plan.terminated)  # truncated and infra episodes are excluded
    rew = plan.success[keep].astype(np.float64)
    g = plan.group[keep]
    ng = int(plan.group.max()) + 1
    cnt = np.bincount(g, minlength=ng)
    mean = np.bincount(g, weights=rew, minlength=ng) / np.maximum(cnt, 1)
    dev = rew - mean[g]
    var = np.bincount(g, weights=dev * dev, minlength=ng) / np.maximum(cnt - 1, 1)
    adv = np.where(cnt[g] >= 2, dev / (np.sqrt(var)[g] + GRPO_EPS), 0.0)
    upd = plan.update[keep]
    nu = int(plan.update.max()) + 1
    per = np.bincount(upd, minlength=nu)
    offs = _offsets(per)
    denom = np.bincount(upd, weights=trainable[keep].astype(np.float64), minlength=nu)
    cols = {
        "update_step": pa.array(np.arange(nu, dtype=np.int64)),
        "trainer_version": pa.array(np.arange(nu, dtype=np.int64)),
        "trajectory_ids": _list(offs, _fmt(len(keep), "t", (keep, 9))),
        "reduction": _take_str(["token"], np.zeros(nu, np.int32)),
        "loss_denominator": pa.array(denom),
        "advantages": _list(offs, pa.array(adv)),
        "advantage_estimator": _take_str(["grpo"], np.zeros(nu, np.int32)),
        "max_policy_lag": pa.array(np.zeros(nu, np.int64)),
        "numerator_tokens": _list(offs, pa.array(trainable[keep])),  # the policy tokens each loss sums
        "stat_trajectory_ids": _list(offs, _fmt(len(keep), "t", (keep, 9))),  # statistics among the trained
        # contract 1.4: one record per optimizer step, its token-mean divisor, the ratio on the current weights,
        # which sampled the batch (policy_version is the update's trainer_version)
        "reducer_mode": _take_str(["token_mean_step"], np.zeros(nu, np.int32)),
        "reducer_divisor": pa.array(np.maximum(denom, 1.0)),
        "ratio_anchor": _take_str(["current"], np.zeros(nu, np.int32)),
        "ratio_correction": _take_str(["none"], np.zeros(nu, np.int32)),
        "ratio_clipping": pa.array(np.ones(nu, bool)),
    }
    v1 = S.arrow_schema("updates")
    later = ("numerator_tokens", "stat_trajectory_ids", "reducer_mode", "reducer_divisor", "ratio_anchor")
    later += ("ratio_correction", "ratio_clipping")
    evidence = [pa.field(c, S.column("updates", c).arrow_type) for c in later]
    schema = pa.schema([*v1, *evidence], metadata={**v1.metadata, S.META_VERSION: b"1.4"})
    return pa.Table.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema)


# ---------------------------------------------------------------- driver


def generate(
    tokens: int,
    out: str | os.PathLike,
    *,
    fault_share: float = 0.0,
    seed: int = 0,
    shape: str = "default",
    file_rows: int | None = None,
    row_group: int | None = None,
    verbose: bool = False,
) -> dict:
    """Write a log of about `tokens` tokens under `out` (replaced if it exists). Returns the
    parameters and counts also written to `out/_generated.json`."""
    t0 = time.perf_counter()
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    sh = SHAPES[shape]
    row_group = row_group or sh.row_group
    file_rows = file_rows or 4 * row_group
    plan = make_plan(tokens, seed, fault_share, sh)
    trainable = np.zeros(plan.n, np.int64)
    n_tokens = 0
    files = []
    for fi, flo in enumerate(range(0, plan.n, file_rows)):
        path = tmp / f"part-{fi:05d}.parquet"
        with pq.ParquetWriter(path, file_schema(sh), compression="zstd") as w:
            for lo in range(flo, min(flo + file_rows, plan.n), row_group):
                hi = min(lo + row_group, flo + file_rows, plan.n)
                table, tr = make_chunk(plan, lo, hi, seed)
                trainable[lo:hi] = tr
                n_tokens += int(pc.sum(pc.list_value_length(table.column("token_source"))).as_py())
                w.write_table(table, row_group_size=row_group)
        files.append(path.name)
        if verbose:
            print(f"  {path.name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    (tmp / "updates").mkdir()
    pq.write_table(make_updates(plan, trainable), tmp / "updates" / "updates.parquet", compression="zstd")
    faulted = np.flatnonzero(plan.fault)
    info = {
        "tokens_requested": tokens,
        "tokens": n_tokens,
        "trajectories": plan.n,
        "files": files,
        "row_group": row_group,
        "updates": int(plan.update.max()) + 1,
        "seed": seed,
        "shape": shape,
        "fault_share": fault_share,
        "faults": {f"t{i:09d}": FAULTS[int(plan.fault[i])][0] for i in faulted},
        "fault_codes": {name: code for name, code in FAULTS.values()},
        "seconds": round(time.perf_counter() - t0, 2),
    }
    (tmp / "_generated.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return info


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="50M", help="approximate number of tokens, e.g. 200k, 12M, 50M")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fault-share", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="default", help="episode shape (see SHAPES)")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    info = generate(
        parse_size(a.tokens), a.out, fault_share=a.fault_share, seed=a.seed, shape=a.shape, verbose=a.verbose
    )
    print(
        f"{a.out}: {info['trajectories']} trajectories, {info['tokens']} tokens, {len(info['files'])} files, "
        f"{len(info['faults'])} faulted, {info['seconds']} s"
    )


if __name__ == "__main__":
    main()
