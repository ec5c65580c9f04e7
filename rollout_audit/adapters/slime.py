"""slime: `Sample.to_dict()` (slime/utils/types.py) and slime's train data and actor batches to
contract tables.

Sampler side: one record per sample, written by the dump hook (docs/frameworks/slime.md) with
slime's own field names: `index`, `group_index`, `tokens` (prompt then response), `response_length`,
`loss_mask` and `rollout_log_probs` over the response, `reward`, `status`, `weight_versions` (one
per engine call), `metadata.engine_calls` (the generate hook's: per engine call the sample's
`response_length` before it, the `tokens` SGLang returned and its `weight_version`).

Provenance comes from `engine_calls`, independently of `loss_mask` (the mask under test), so
M101/M102 compare the mask with what the engine sampled. A sample without them has no provenance:
`token_source` is declared not recorded. A call that resumes the previous one where it stopped
(`--partial-rollout`) with the same weights is the same turn; resumed under other weights it is a
turn of its own, with the version that sampled its tokens. Without engine calls the
turns are the runs of mask 1 and `weight_versions` is placed on them: turn t's version is the
version of its first call where the list fixes it, else the oldest of the calls that can have
started it (it never understates staleness).

`remove_sample` (set by `--rollout-sample-filter-path` before the dump) is applied by slime after
the dump point (`loss_mask` all 0, slime/ray/rollout.py:680-681) while the sample stays in reward
normalisation: the adapter writes its loss mask all false and the sample `loss_excluded`.

Routing replay (contract 1.3): `rollout_routed_experts` gives `routed_experts_sha256`, and with the
generate hook's per-call route fields `routed_experts_version` (`_routes`, routes.py).

Trainer side: the train data record (`sample_indices`, `rollout_ids`, `rollout_mask_sums`, and
`rewards`, `raw_reward`, `loss_masks`, `args`) becomes one token-reduced update per rollout id with
its denominator, numerator tokens, advantages and normalisation groups (`updates`); the actor record
(`sample_indices`, `loss_masks`, `kl`, `returns`, `rewards`, `args`) of `reinforce_plus_plus` at
gamma 1 becomes the token columns `token_reward`, `token_kl`, `token_returns`; of `ppo`, with the
critic's `values`, `token_reward`, `token_kl`, `token_values`, `token_value_targets`, `gamma` and
`gae_lambda` (contract 1.4).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from ..contract import schema as S
from ..contract.schema import STOP_FLAGS
from ..reading.records import records_to_table
from .base import (
    AdapterError,
    aligned,
    context_values,
    contract_table,
    declared,
    flags,
    integer,
    ints,
    lacks,
    logprobs_column,
    mapping,
    need,
    number,
    numbers,
    objects,
    rows_of,
    runs,
    short,
    token_columns,
    whole,
    with_context,
)
from .routes import call_routes, digest, expert_array, replayed

# Sample.Status value -> (flag, contract stop_reason)
STATUS = {
    "completed": ("terminated", "end_of_sequence"),  # the last engine call finished with "stop"
    "truncated": ("truncated", "max_tokens"),  # the last engine call finished with "length", or no budget left
    "aborted": ("infra_error", "engine_error"),  # the engine aborted the request
    "failed": ("infra_error", "tool_error"),  # slime: tool call failure, external API or parsing error
}
# slime's own options the dump does not carry (--reward-key, --mask-offpolicy-in-partial-rollout)
CONTEXT = {"reward_key": str, "mask_offpolicy_in_partial_rollout": bool}
TRAIN_DATA = ("sample_indices", "rollout_ids", "rollout_mask_sums")  # the second hook's record
ACTOR = ("sample_indices", "loss_masks", "kl", "returns")  # the actor hook's record (rollout_data)
_NO_CALLS = "the samples carry no metadata.engine_calls (add the hook's line in slime's generate)"
_NO_ACTOR = (
    "no actor record with advantage_estimator reinforce_plus_plus and gamma 1 (the --rollout-data-postprocess-path "
    "hook): slime builds token-level rewards, KL and returns only there"
)

_NO_ROUTES = "the samples carry no rollout_routed_experts (slime records them with --use-rollout-routing-replay)"
ROUTE_LACKS = {
    "routed_experts_sha256": _NO_ROUTES,
    "routed_experts_version": _NO_ROUTES + ", or their engine calls no routed_experts_start_len, "
    "routed_experts_rows and routed_experts_len (the generate hook's lines)",
    "overlong_penalty": "slime adds no overlong penalty to the reward (slime/ray/rollout.py:608-633)",
    "loss_weight": "slime weighs every loss-mask token alike: no per-token loss weight (slime/utils/types.py:93-146)",
}
LACKS = {
    **lacks("slime"),
    "turns.policy_version": "the records carry no weight_versions (SGLang returned no weight_version)",
    "behavior_logprobs": "slime records rollout_log_probs only when the engine returned them",
    "turns.finish_reason": "slime keeps the last engine call's finish reason only, as the sample's status",
    "turns.context_length": "slime does not record the context the engine was given for each call",
    "turns.context_sha256": "slime does not record the context the engine was given for each call",
    "turns.sampled_token_ids": _NO_CALLS,
    "token_source": "provenance not recorded: " + _NO_CALLS + "; slime's loss_mask is the mask under test",
    **{k: _NO_ACTOR for k in ("token_reward", "token_kl", "token_returns")},
    **ROUTE_LACKS,
}


def _reward(value: Any, where: str, key: str | None) -> float | None:
    """The scalar reward; a dict reward needs slime's --reward-key (context reward_key)."""
    if isinstance(value, Mapping):
        if key is None:
            raise AdapterError(f"{where}: reward is a dict; pass --context reward_key=KEY (slime's --reward-key)")
        value = need(value, key, f"{where} reward")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise AdapterError(f"{where}: reward must be a number, not {type(value).__name__}")
    return None if value is None else number(value, "reward", where)


def _versions(rec: Mapping[str, Any], n_turns: int, where: str) -> list[int] | list[None] | None:
    """Each turn's policy version from the per-call `weight_versions` (module docstring): the version
    of the turn's first call where the list fixes it, else the oldest version that call can have."""
    wv = rec.get("weight_versions")
    if not wv:
        return None
    if not isinstance(wv, list):
        raise AdapterError(f"{where}: weight_versions must be a list")
    calls: list[int] = []
    for v in wv:
        if isinstance(v, (int, float)):  # a number is a whole one within int64 (bools and 2.5 refused)
            calls.append(whole(v, "weight_versions", where))
            continue
        try:
            calls.append(int(v))
        except (TypeError, ValueError):
            return [None] * n_turns  # SGLang's version is a free string: not a number the audit can order
    if n_turns == 0:
        return []
    if len(set(calls)) == 1:
        return [calls[0]] * n_turns
    extra = len(calls) - n_turns
    if extra < 0:  # fewer calls than runs of mask 1: any call may have started a later turn
        return [calls[0]] + [min(calls)] * (n_turns - 1)
    # turn t's first call is one of calls t .. t + extra: the oldest of them never understates staleness
    return [calls[0]] + [min(calls[t : t + extra + 1]) for t in range(1, n_turns)]


def _engine_calls(rec: Mapping[str, Any], n_resp: int, where: str) -> tuple[list[bool], list[dict], list[int]] | None:
    """(response positions the engine sampled, the turns, where each starts) from the `engine_calls`
    the generate hook keeps in `metadata`; None when the sample has none. Call t's `tokens` start at
    the sample's `response_length` when it was made; a call that continues the previous one where it
    stopped (a partial rollout resuming an aborted call) is the same turn, whose version is its first
    call's (the oldest weights that sampled any of it)."""
    meta = rec.get("metadata")
    calls = meta.get("engine_calls") if isinstance(meta, Mapping) else None
    if calls is None:
        return None
    sampled = [False] * n_resp
    turns: list[dict[str, Any]] = []
    starts: list[int] = []
    end = -1
    for t, call in enumerate(objects(calls, "metadata.engine_calls", where)):
        w = f"{where} metadata.engine_calls[{t}]"
        start, ids = integer(call, "response_length", w), ints(call, "tokens", w)
        if not 0 <= start <= n_resp:
            raise AdapterError(f"{w}: response_length {start} outside the sample's {n_resp} response tokens")
        if not ids:
            continue  # an aborted call that returned nothing sampled nothing
        sampled[start : min(start + len(ids), n_resp)] = [True] * (min(start + len(ids), n_resp) - start)
        version = _call_version(call, w)
        if start == end and version == turns[-1].get("policy_version"):  # resumed by the same weights
            turns[-1]["sampled_token_ids"] += ids
            end += len(ids)
            continue
        turn: dict[str, Any] = {"turn_id": len(turns), "sampled_token_ids": list(ids)}
        if version is not None:
            turn["policy_version"] = version
        turns.append(turn)
        starts.append(start)
        end = start + len(ids)
    return sampled, turns, starts


def _call_version(call: Mapping[str, Any], where: str) -> int | None:
    """An engine call's `weight_version` as an integer; None when absent or not a number (SGLang's
    version is a free string: not a number the audit can order)."""
    version = call.get("weight_version")
    if version is None:
        return None
    if isinstance(version, (int, float)):  # a number is a whole one within int64 (bools, 2.5 and inf refused)
        return whole(version, "weight_version", where)
    try:
        return whole(int(version), "weight_version", where)
    except (TypeError, ValueError):
        return None


def row(rec: Mapping[str, Any], n: int, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """One slime sample as a contract row."""
    index = need(rec, "index", f"record {n}")
    where = f"record {n} (index {index})"
    tokens = ints(rec, "tokens", where)
    n_resp = integer(rec, "response_length", where)
    if not 0 <= n_resp <= len(tokens):
        raise AdapterError(f"{where}: response_length {n_resp} outside the {len(tokens)} tokens")
    n_prompt = len(tokens) - n_resp
    raw_mask = rec.get("loss_mask")
    mask = (
        [True] * n_resp
        if raw_mask is None
        else flags(aligned(rec, "loss_mask", range(n_resp), where), "loss_mask", where)
    )
    removed = rec.get("remove_sample", False)
    if not isinstance(removed, bool):
        raise AdapterError(f"{where}: remove_sample must be true or false")
    engine = _engine_calls(rec, n_resp, where)
    spans = runs(mask)
    versions = _versions(rec, len(spans), where)  # read (and checked) either way
    if engine is not None:
        sampled, turns, starts = engine
    else:  # no provenance: the turns are the runs of the mask, token_source is not written
        sampled, turns, starts = mask, [{"turn_id": t} for t in range(len(spans))], [a for a, _ in spans]
        if versions is not None:
            for t, v in zip(turns, versions):
                t["policy_version"] = v
    status = need(rec, "status", where)
    if not isinstance(status, str) or status not in STATUS:
        raise AdapterError(f"{where}: status {status!r} is not a finished sample ({', '.join(STATUS)})")
    flag, stop = STATUS[status]
    out: dict[str, Any] = {
        "trajectory_id": str(index),
        "task_id": str(need(rec, "group_index", where)),
        "group_id": str(rec["group_index"]),
        **token_columns(tokens[:n_prompt], tokens[n_prompt:], sampled, [m and not removed for m in mask], starts),
        "turns": turns,
        **{f: f == flag for f in STOP_FLAGS},
        "stop_reason": stop,
        "reward": _reward(need(rec, "reward", where), where, ctx.get("reward_key")),
    }
    if engine is None:
        del out["token_source"]
    if removed:  # out of the loss, still in its group's reward normalisation (contract 1.2)
        out["loss_excluded"] = True
    if rec.get("rollout_log_probs") is not None:
        lp = numbers(aligned(rec, "rollout_log_probs", mask, where), "rollout_log_probs", where)
        out["behavior_logprobs"] = logprobs_column(n_prompt, lp, sampled)
    out.update(_routes(rec, len(tokens), where))
    out.update(nucleus_columns(rec, n_prompt, n_resp, where))
    return with_context(out, ctx)


def _routes(rec: Mapping[str, Any], n_tokens: int, where: str) -> dict[str, Any]:
    """Routing replay (contract 1.3) from `rollout_routed_experts` (slime/utils/types.py:126): one row
    per token but the last (types.py:361), the trainer appending one padding row for it
    (slime/backends/megatron_utils/cp_utils.py:264-268). The digest of the rows always; each row's
    version when every engine call carries the generate hook's `routed_experts_start_len` (SGLang's,
    0 when absent as slime reads it, types.py:356), `routed_experts_rows` (the rows SGLang returned)
    and `routed_experts_len` (the sample's row count after slime applied them) with its
    `weight_version` (routes.py says how they place the rows)."""
    value = rec.get("rollout_routed_experts")
    if value is None:
        return {}
    arr = expert_array(value, "rollout_routed_experts", where)
    out: dict[str, Any] = {"routed_experts_sha256": digest(arr)}
    meta = rec.get("metadata")
    calls = meta.get("engine_calls") if isinstance(meta, Mapping) else None
    if calls:
        calls = objects(calls, "metadata.engine_calls", where)
        versions = [_call_version(c, f"{where} metadata.engine_calls[{t}]") for t, c in enumerate(calls)]
        keys = ("routed_experts_start_len", "routed_experts_rows", "routed_experts_len")
        rows = call_routes(calls, versions, keys, where, n_tokens + len(arr))
        if rows is not None:
            out["routed_experts_version"] = replayed(rows, len(arr), n_tokens, False, where)
    return out


def _trainer_side(rec: Mapping[str, Any]) -> bool:
    return all(k in rec for k in TRAIN_DATA) or all(k in rec for k in ACTOR)


def _samples(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Sample records of a dump (the train data and actor records of the trainer-side hooks left out)."""
    return [r for r in records if not _trainer_side(r)]


def _token_terms(rows: list[dict[str, Any]], records: Iterable[Mapping[str, Any]]) -> None:
    """The actor's token-level terms on the rows they belong to, from each actor record of the
    reinforce_plus_plus estimator at gamma 1 (slime/utils/ppo_utils.py:371-445): the KL penalty
    kl_coef·kl on the loss-mask tokens (:416-417), the reward on the last of them (:418-419), and the
    `returns` slime computed, as recorded."""
    at = {r["trajectory_id"]: r for r in rows}
    for n, rec in enumerate(records, 1):
        if not all(k in rec for k in ACTOR):
            continue
        where = f"{getattr(rec, 'origin', None) or f'record {n}'}: actor record"
        args = mapping(rec.get("args"), "args", where)
        if args.get("advantage_estimator") == "ppo" and rec.get("values") is not None:
            _critic_terms(at, rec, args, where)
            continue
        if args.get("advantage_estimator") != "reinforce_plus_plus" or args.get("gamma", 1.0) != 1.0:
            continue  # other estimators put no token reward; returns at another gamma are not reward-to-go
        coef = number(need(args, "kl_coef", where), "kl_coef", where)
        index = ints(rec, "sample_indices", where)
        masks, kls, rets = (objects_of(rec, k, len(index), where) for k in ("loss_masks", "kl", "returns"))
        rewards = numbers(need(rec, "rewards", where), "rewards", where)
        for i, m, kl, ret, r in zip(index, masks, kls, rets, rewards):
            row = at.get(str(i))
            if row is None:
                raise AdapterError(f"{where}: sample index {i} is not among the dump's samples")
            w = f"{where} (index {i})"
            mask = flags(m, "loss_masks", w)
            kl_v, ret_v = numbers(kl, "kl", w), numbers(ret, "returns", w)
            if not len(mask) == len(kl_v) == len(ret_v):
                raise AdapterError(f"{w}: loss_masks, kl and returns differ in length")
            n_prompt = len(row["token_ids"]) - len(mask)
            if n_prompt < 0:
                raise AdapterError(f"{w}: {len(mask)} loss_masks for a sample of {len(row['token_ids'])} tokens")
            reward = [0.0] * len(mask)
            last = max((k for k, x in enumerate(mask) if x), default=None)
            if last is not None and r is not None:
                reward[last] = r
            pad = [0.0] * n_prompt
            row["token_reward"] = pad + reward
            row["token_kl"] = pad + [coef * (v or 0.0) * x for v, x in zip(kl_v, mask)]
            row["token_returns"] = pad + ret_v


def _critic_terms(at: dict[str, dict[str, Any]], rec: Mapping[str, Any], args: Mapping[str, Any], where: str) -> None:
    """--advantage-estimator ppo: the critic's `values` and GAE's `returns` (A + V) on the response,
    with the reward on the last response token and the KL penalty kl_coef·kl on every response token,
    as slime builds the rewards GAE reads (loss.py:769-781 at 624b824), and --gamma and --lambd
    (arguments.py:1002-1003)."""
    coef = number(need(args, "kl_coef", where), "kl_coef", where)
    gamma = number(need(args, "gamma", where), "gamma", where)
    lambd = number(need(args, "lambd", where), "lambd", where)
    index = ints(rec, "sample_indices", where)
    per = {k: objects_of(rec, k, len(index), where) for k in ("loss_masks", "kl", "returns", "values")}
    rewards = numbers(need(rec, "rewards", where), "rewards", where)
    for k, (i, r) in enumerate(zip(index, rewards)):
        row = at.get(str(i))
        if row is None:
            raise AdapterError(f"{where}: sample index {i} is not among the dump's samples")
        w = f"{where} (index {i})"
        mask = flags(per["loss_masks"][k], "loss_masks", w)
        kl_v, ret_v, val_v = (numbers(per[f][k], f, w) for f in ("kl", "returns", "values"))
        if not len(mask) == len(kl_v) == len(ret_v) == len(val_v):
            raise AdapterError(f"{w}: loss_masks, kl, returns and values differ in length")
        n_prompt = len(row["token_ids"]) - len(mask)
        if n_prompt < 0 or not mask:
            raise AdapterError(f"{w}: {len(mask)} loss_masks for a sample of {len(row['token_ids'])} tokens")
        pad = [0.0] * n_prompt
        row["token_reward"] = pad + [0.0] * (len(mask) - 1) + [r or 0.0]
        row["token_kl"] = pad + [coef * (v or 0.0) for v in kl_v]
        row["token_values"] = [None] * n_prompt + val_v
        row["token_value_targets"] = [None] * n_prompt + ret_v
        row["gamma"], row["gae_lambda"] = gamma, lambd


def objects_of(rec: Mapping[str, Any], field: str, n: int, where: str) -> list[Any]:
    """`rec[field]`: one list per sample of the record."""
    values = need(rec, field, where)
    if not isinstance(values, list) or len(values) != n:
        raise AdapterError(f"{where}: {field} must hold one list per sample_indices entry ({n})")
    return values


def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """slime per-sample records as contract trajectories (context reward_key picks a dict reward), with
    the actor's token-level terms when the dump holds its records."""
    ctx = context_values(context, CONTEXT)
    records = list(records)
    samples = _samples(records)
    rows = rows_of(samples, row, ctx)
    _token_terms(rows, records)
    return contract_table(rows, declared(samples, LACKS))


_NO_TRAINER_VERSION = "slime's train data does not record the actor's weight version"
_NO_DIVISOR = (
    "slime computes the loss reducer's divisor inside its loss function, after every hook: per sample "
    "max(loss mask sum, 1), summed by Megatron over micro-batches and ranks (slime/backends/megatron_utils/"
    "loss.py:1317, :1363-1366)"
)
UPDATE_LACKS = {
    "trainer_version": _NO_TRAINER_VERSION,
    "updates.trainer_version": _NO_TRAINER_VERSION,
    "reducer_divisor": _NO_DIVISOR,
    "updates.reducer_divisor": _NO_DIVISOR,
}


def loss_settings(args: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Contract 1.4 update columns from the slime arguments the train data record carries, where it
    carries them (an older hook's record has none): the reducer's mode, `--calculate-per-token-loss`
    (the step's loss-mask tokens, loss.py:1317 and :1363-1366; else the per-rollout mean divided by
    the step's samples, :1353-1360); the ratio's anchor, `--use-rollout-logprobs` (the engine's
    log-probs, loss.py:965) or else the log-probs slime recomputes with `--keep-old-actor`'s retained
    rollout weights or the current actor (actor.py:460, loss.py:985-986); and `--use-tis`, whose
    weight exp(recomputed − rollout) is clamped at `--tis-clip` (loss.py:893-897). The recomputing
    weights' version is not in the record (null)."""
    out: dict[str, Any] = {}

    def flag(name: str) -> bool | None:
        v = args.get(name)
        if v is not None and not isinstance(v, bool):
            raise AdapterError(f"{where}: args.{name}: expected true or false, got {short(v)}")
        return v

    per_token = flag("calculate_per_token_loss")
    if per_token is not None:
        out["reducer_mode"] = "token_mean_step" if per_token else "seq_mean_step"
    rollout, old_actor, tis = flag("use_rollout_logprobs"), flag("keep_old_actor"), flag("use_tis")
    if rollout is not None:
        out["ratio_anchor"] = "behavior" if rollout else "proximal" if old_actor else "current"
    if tis is not None:
        out["ratio_correction"] = "truncated_is" if tis else "none"
        if tis and args.get("tis_clip") is not None:
            out["ratio_correction_cap"] = number(args["tis_clip"], "args.tis_clip", where)
    return out


# --advantage-estimator values whose advantage is the normalised reward broadcast over the tokens
# (slime/backends/megatron_utils/loss.py:763-767), and the estimators slime group-normalises for
GRPO_LIKE = ("grpo", "gspo", "cispo")
NORMALISED = (*GRPO_LIKE, "reinforce_plus_plus_baseline")  # slime/ray/rollout.py:613-616


def _statistics(args: Mapping[str, Any], n: int, where: str) -> list[list[int]] | None:
    """The positions of each group slime normalises rewards over (rollout.py:612-631): consecutive
    blocks of --n-samples-per-prompt when the batch holds exactly that times --rollout-batch-size
    samples, else the whole batch as one group; None when slime normalises nothing."""
    if args.get("advantage_estimator") not in NORMALISED or not args.get("rewards_normalization", True):
        return None
    per = integer(args, "n_samples_per_prompt", where)
    size = integer(args, "rollout_batch_size", where)
    if per > 0 and n == per * size:
        return [list(range(k, k + per)) for k in range(0, n, per)]
    return [list(range(n))]


def updates(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table | None:
    """One update per rollout id of each train data record: the samples slime divides by one
    denominator (`rollout_mask_sums`, the same for every sample of the rollout) as a `token`
    reduction over their trajectories; with the record's `loss_masks`, `rewards` and `args`, each
    member's trainable tokens (`numerator_tokens`), its advantage (the normalised reward, for the
    GRPO-like estimators), and the samples whose rewards formed its group statistics. None when the
    dump has no train data record."""
    context_values(context, CONTEXT)
    rows: list[Mapping[str, Any]] = []
    for n, rec in enumerate(records, 1):
        if not all(k in rec for k in TRAIN_DATA):
            continue
        where = f"{getattr(rec, 'origin', None) or f'record {n}'}: train data record"
        index, rid, sums = (ints(rec, k, where) for k in TRAIN_DATA)
        if not len(index) == len(rid) == len(sums):
            raise AdapterError(f"{where}: sample_indices, rollout_ids and rollout_mask_sums differ in length")
        step = integer(rec, "rollout_id", where) if "rollout_id" in rec else len(rows)
        args = mapping(rec.get("args"), "args", where)
        masks = objects_of(rec, "loss_masks", len(index), where) if "loss_masks" in rec else None
        rewards = numbers(rec["rewards"], "rewards", where) if "rewards" in rec else None
        if rewards is not None and len(rewards) != len(index):
            raise AdapterError(f"{where}: rewards must hold one value per sample_indices entry ({len(index)})")
        groups = _statistics(args, len(index), where) if rewards is not None and args else None
        group_of = {p: g for g in groups or () for p in g}
        advantages = (
            args.get("advantage_estimator") in GRPO_LIKE
            and groups is not None
            and not args.get("normalize_advantages", False)
        )
        members: dict[tuple[int, int], list[int]] = {}
        for p, (r, d) in enumerate(zip(rid, sums)):  # a rollout whose samples disagree on D is an update per D
            members.setdefault((r, d), []).append(p)
        for (_, d), pos in members.items():
            upd: dict[str, Any] = {
                "update_step": step,
                "trajectory_ids": [str(index[p]) for p in pos],
                "reduction": "token",
                "loss_denominator": float(d),
            }
            upd.update(loss_settings(args, where))
            if masks is not None:
                upd["numerator_tokens"] = [sum(flags(masks[p], "loss_masks", where)) for p in pos]
            if groups is not None:
                stat = sorted({q for p in pos for q in group_of[p]})
                upd["stat_trajectory_ids"] = [str(index[q]) for q in stat]
            if advantages and rewards is not None:
                upd["advantages"] = [rewards[p] for p in pos]
                upd["advantage_estimator"] = "grpo" if args.get("grpo_std_normalization", True) else "grpo_no_std"
                upd["window_trajectory_ids"] = [str(i) for i in index]
            rows.append(upd)
    if not rows:
        return None
    table = records_to_table(rows, kind="updates")
    meta = {**(table.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps(UPDATE_LACKS, sort_keys=True).encode()}
    return table.replace_schema_metadata(meta)


def nucleus_columns(rec: Mapping[str, Any], n_prompt: int, n_resp: int, where: str) -> dict[str, Any]:
    """slime's recorded top-p nucleus as contract 1.3 nucleus_ids / nucleus_offsets (empty when the
    sample has none: top_p 1, or top-p replay off). `Sample.rollout_top_p_token_ids` holds the kept
    ids of every response token, flattened, and `rollout_top_p_token_offsets` one offset more than the
    response (slime/utils/types.py:122-125; SGLang's meta_info merged call by call, :325-350, a tool
    output's tokens padded with empty spans, :304-314; slime asserts the shape, ray/rollout.py:720-729).
    The prompt's tokens get empty spans in front: the offsets then count every token. The values are
    carried as recorded (L210 names offsets that do not fit); only a length that cannot be aligned
    with the response is refused."""
    ids, offsets = rec.get("rollout_top_p_token_ids"), rec.get("rollout_top_p_token_offsets")
    if ids is None and offsets is None:
        return {}
    if ids is None or offsets is None:
        raise AdapterError(f"{where}: rollout_top_p_token_ids and rollout_top_p_token_offsets come together")
    kept = ints(rec, "rollout_top_p_token_ids", where)
    at = ints(rec, "rollout_top_p_token_offsets", where)
    if len(at) != n_resp + 1:
        raise AdapterError(
            f"{where}: {len(at)} rollout_top_p_token_offsets for {n_resp} response tokens (want one more)"
        )
    return {"nucleus_ids": kept, "nucleus_offsets": [0] * n_prompt + at}
