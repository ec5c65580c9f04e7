"""NVIDIA NeMo Gym token-id capture (nemo-gym 0.7.0) to contract trajectories.

Three record kinds, told apart by their fields, from a directory (or files) of JSON Lines:

- **rebuilt rollouts**: the rollout collection's output lines (`output_jsonl_fpath`), one finished rollout
  a line, its `response.output` rebuilt from the capture: each token-bearing item carries the contiguous
  `prompt_token_ids`, the `generation_token_ids` and their `generation_log_probs`
  (`token_id_capture/builder.py:564-608`), the reward at the top level, `mask_sample` when Gym masked it
  (`delivery.py:43-57`). One line is one trajectory (`trajectory_id` = the capture key, as
  `rollout_correlation.py:41-81` derives it).
- **TokenEntry capture files** `<rollout_id>.tokens.jsonl` (`store.py:68-80`), one `TokenEntry` per model
  call (`records.py:108-220`). Each entry's `digest` is recomputed from its tokens (a second
  implementation of `records.py:79-105`; a delta prompt is rebuilt through its parent chain first, as
  `builder.py:201-261` does) and a mismatch is one line naming file, rollout, call and field (exit 2).
  Each root-to-leaf path of the recorded parent links is one trajectory (`{rollout}/capture`, and
  `/k` when the links branch); every call's turn records its own prompt as the engine context, so a
  child whose prompt does not begin with its parent's sequence is M105 at that turn. A rollout whose
  capture is incomplete (a `.tokens.incomplete` marker, or an intent with no entry: `store.py:303-338`)
  is not converted: its files are named among the files not read.
- **external-staging ledger**: `RolloutReceipt`s and the staged call records of their manifests, one
  model dump a line (`staging/records.py:139-409`). Every staged digest, extras digest, chain hash and
  the terminal's cumulative hash are recomputed (`staging/digest.py`); a mismatch, a parent missing from
  the manifest or a call that does not start where its parent ends is one line naming the rollout, the
  call and the field (exit 2). A receipt that is not poisoned becomes one trajectory, its terminal chain
  linearized (`staging/rebuild.py:238-361`), each call's `weight_version` its turn's policy version.

Gym records no stop reason, no sampling parameters and no environment identity: context options."""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..contract import schema as S
from ..contract.digests import NEMO_GYM_TOKENS
from . import nemo_gym_digest as D
from .base import (
    AdapterError,
    _regular,
    context_values,
    contract_table,
    dump_files,
    mapping,
    need,
    number,
    numbers,
    objects,
    origin,
    read_records,
    sha256_hex,
    short,
    whole,
    wholes,
    with_trainer_settings,
)
from .steps import (
    Call,
    engine_context,
    episode_rows,
    guarded,
    identity,
    identity_lacks,
    merge,
    option,
    recorded_logprobs,
    stop_columns,
)

TOKENS = ".tokens.jsonl"
# a capture store's bookkeeping beside each rollout's entries (store.py:68-83)
INCOMPLETE, INTENTS = ".tokens.incomplete", ".tokens.intents"
BOOKKEEPING = (".tokens.state.json", ".tokens.lock", INCOMPLETE, INTENTS)
FAILURES = "_failures.jsonl"  # rollout_collection.py:177: rows that never produced a rollout
ENTRY_SCHEMA_VERSION = 1  # records.py:45: a newer record is refused, not misread
LACKS = {
    **identity_lacks(
        "NeMo Gym",
        {
            "environment_id": "the environment in its capture records",
            "environment_version": "the environment version",
            "verifier_version": "the verifier version",
            "reset_seed": "a reset seed",
            "tokenizer_id": "the tokenizer identity",
        },
    ),
    "stop_reason": "NeMo Gym's capture records no stop reason; pass --context stop_reason=...",
    "terminated": "NeMo Gym's capture records no stop reason; pass --context stop_reason=...",
    "truncated": "NeMo Gym's capture records no stop reason; pass --context stop_reason=...",
    "infra_error": "NeMo Gym's capture records no stop reason; pass --context stop_reason=...",
    "reward": "a TokenEntry carries no reward (the rollout record does); pass --context reward=... for a capture "
    "without its rollout record",
    "turns.policy_version": "a TokenEntry and a rebuilt rollout carry no weight version; pass --context policy_version=...",
    "turns.temperature": "NeMo Gym's capture records no sampling parameters; pass --context temperature=...",
    "turns.top_p": "NeMo Gym's capture records no sampling parameters; pass --context top_p=...",
    "turns.finish_reason": "a TokenEntry records no finish reason",
    "turns.logprob": "NeMo Gym records token log-probs, not a per-turn log-prob",
    "turns.num_policy_tokens": "NeMo Gym does not count policy tokens per turn",
    "num_trainable_tokens": "NeMo Gym does not count trainable tokens",
    "verifier_success": "NeMo Gym records a reward, not a verifier verdict",
    "initial_state_checksum": "NeMo Gym's capture does not see environment state",
    "turns.capture_digest": "a rebuilt rollout or a staged ledger carries no TokenEntry digest (the capture files do)",
    "turns.capture_digest_scheme": "a rebuilt rollout or a staged ledger carries no TokenEntry digest",
}
MAX_TOKENS = 1 << 27  # tokens a rollout's capture may expand to (delta prompts rebuilt, branches copied)
USER, OBSERVATION = 1, 3  # token_source of the first prompt, and of what a later prompt adds
CONTEXT = {"reward": float, "policy_version": int, "stop_reason": str}


def read_dump(paths: Sequence[str | os.PathLike]) -> tuple[list[Path], list[Path], list[Mapping[str, Any]]]:
    """The JSON Lines files at `paths` and their records; a capture store's bookkeeping files, the
    failures sidecar and every file of a rollout whose capture is incomplete are named, not read."""
    files: list[Path] = []
    other: list[Path] = []
    for p in paths:
        if Path(p).is_dir():
            found, rest = _listing(Path(p))
        else:
            found, rest = [Path(p)], []
        files += found
        other += rest
    lost = _incomplete(files, other)
    read = [f for f in files if _rollout_of(f) not in lost]
    other += [f for f in files if _rollout_of(f) in lost]
    records: list[Mapping[str, Any]] = [r for f in read for r in read_records(f)]
    return read, sorted(other), records


def _listing(root: Path) -> tuple[list[Path], list[Path]]:
    """Every dump file under `root`, with the bookkeeping files and the failures sidecar set apart."""
    try:
        found, other = dump_files(root)
    except AdapterError:
        found, other = [], []
        for d, dirs, names in os.walk(root):
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            other += [Path(d) / n for n in sorted(names) if not n.startswith(".")]
        if not any(f.name.endswith(BOOKKEEPING) for f in other):
            raise
    keep = [f for f in found if not f.name.endswith(BOOKKEEPING) and not f.name.endswith(FAILURES)]
    return keep, other + [f for f in found if f not in keep]


def _rollout_of(f: Path) -> str | None:
    for end in (TOKENS, *BOOKKEEPING):
        if f.name.endswith(end):
            return f.name[: -len(end)]
    return None


def _incomplete(files: Sequence[Path], other: Sequence[Path]) -> set[str]:
    """Rollouts whose capture lost a call: an incomplete marker, or an intent with no entry."""
    lost = {_rollout_of(f) for f in other if f.name.endswith(INCOMPLETE)}
    entries = {_rollout_of(f): f for f in files if f.name.endswith(TOKENS)}
    for f in other:
        if not f.name.endswith(INTENTS):
            continue
        rid = _rollout_of(f)
        _regular(f)
        try:
            intents = {ln.strip() for ln in f.read_text("utf-8", errors="replace").splitlines() if ln.strip()}
        except OSError as e:
            raise AdapterError(f"{f}: cannot read: {e.strerror or e}") from None
        recorded = {str(r.get("model_call_id")) for r in read_records(entries[rid])} if rid in entries else set()
        if intents - recorded:
            lost.add(rid)
    return {r for r in lost if r is not None}


# ---------------------------------------------------------------- record kinds


def _kind(rec: Mapping[str, Any], where: str) -> str:
    if "token_ids_delta" in rec:
        return "staged"
    if "manifest" in rec:
        return "receipt"
    if "model_call_id" in rec and "generation_token_ids" in rec:
        return "entry"
    if "response" in rec:
        return "rollout"
    raise AdapterError(
        f"{where}: not a NeMo Gym record (a rollout has 'response', a TokenEntry 'model_call_id' and "
        "'generation_token_ids', a receipt 'manifest', a staged call 'token_ids_delta')"
    )


def _at(rec: Mapping[str, Any], n: int) -> str:
    return getattr(rec, "origin", None) or f"record {n}"


@guarded("nemo_gym")
def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """Contract trajectories from NeMo Gym's rebuilt rollouts, capture files and ledger."""
    ctx = context_values(context, CONTEXT)
    kinds: dict[str, list[Mapping[str, Any]]] = {"rollout": [], "entry": [], "receipt": [], "staged": []}
    for n, rec in enumerate(records, 1):
        kinds[_kind(rec, _at(rec, n))].append(rec)
    rows: list[dict[str, Any]] = []
    rewards: dict[str, Any] = {}
    tokenless: list[str] = []  # masked rollouts Gym could not rebuild: nothing of them is trained
    for n, rec in enumerate(kinds["rollout"], 1):
        built = _rollout(rec, _at(rec, n), ctx)
        if built is None:
            tokenless.append(_at(rec, n))
            continue
        row, reward = built
        rows.append(row)
        rewards[row["trajectory_id"]] = reward
    rows += _captures(kinds["entry"], rewards, ctx)
    rows += _ledger(kinds["receipt"], kinds["staged"], ctx)
    table = contract_table(rows, LACKS, "nemo_gym")
    if not tokenless:
        return table
    said = (
        f"{len(tokenless)} rollout record(s) masked by NeMo Gym with no token ids in their output (mask_sample, "
        f"not rebuilt: nothing of them is trained), not audited: {', '.join(tokenless[:5])}"
        + (", ..." if len(tokenless) > 5 else "")
    )
    return with_trainer_settings(table, said)


def _common(rid: str, task: str, ctx: Mapping[str, Any], reward: Any) -> dict[str, Any]:
    stop = option(ctx, "stop_reason")
    out: dict[str, Any] = {"task_id": task, **identity(ctx)}
    if stop is not None:
        out |= stop_columns(S.stop_reasons().get(stop), stop)
    if reward is not None:
        out["reward"] = reward
    return out


def _turn(prompt: Sequence[int], ctx: Mapping[str, Any], version: Any = None) -> dict[str, Any]:
    turn = {**engine_context(prompt), **{k: option(ctx, k) for k in ("temperature", "top_p") if k in ctx}}
    version = option(ctx, "policy_version") if version is None else version
    return turn | ({"policy_version": version} if version is not None else {})


def rollout_id(rec: Mapping[str, Any], where: str) -> str:
    """The capture key of a rollout record: `_ng_rollout_id`, else `{task}-{rollout}` from the indices,
    with `-a{n}` for a re-dispatch attempt n > 0 (rollout_correlation.py:41-81)."""
    explicit = rec.get("_ng_rollout_id")
    if explicit is not None:
        if not isinstance(explicit, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", explicit):
            raise AdapterError(f"{where}: _ng_rollout_id: not a capture key: {short(explicit)}")
        rid = explicit
    else:
        task, index = rec.get("_ng_task_index"), rec.get("_ng_rollout_index")
        if task is None or index is None:
            raise AdapterError(f"{where}: no _ng_rollout_id and no _ng_task_index/_ng_rollout_index")
        rid = f"{whole(task, '_ng_task_index', where)}-{whole(index, '_ng_rollout_index', where)}"
    attempt = rec.get("_ng_attempt_index")
    if attempt is not None and whole(attempt, "_ng_attempt_index", where) > 0:
        rid = f"{rid}-a{int(attempt)}"
    return rid


def _text(item: Mapping[str, Any]) -> str | None:
    content = item.get("content")
    parts = [c.get("text") for c in content if isinstance(c, Mapping)] if isinstance(content, list) else []
    text = "".join(p for p in parts if isinstance(p, str))
    return text or (item.get("arguments") if isinstance(item.get("arguments"), str) else None)


def _rollout(rec: Mapping[str, Any], where: str, ctx: Mapping[str, Any]) -> tuple[dict[str, Any], Any] | None:
    """One rebuilt rollout as a trajectory: each token-bearing output item one engine call; None for a
    rollout Gym masked without rebuilding it (`delivery.py:74-84`: no token ids, `mask_sample`)."""
    rid = rollout_id(rec, where)
    response = mapping(need(rec, "response", where), "response", where)
    items = objects(need(response, "output", f"{where}: response"), "response.output", where)
    calls = []
    for i, item in enumerate(items):
        if item.get("generation_token_ids") is None:
            continue
        at = f"{where}: rollout {rid}: response.output[{i}]"
        gen = wholes(item["generation_token_ids"], "generation_token_ids", at)
        lps = numbers(need(item, "generation_log_probs", at), "generation_log_probs", at)
        if len(lps) != len(gen):
            raise AdapterError(f"{at}: generation_log_probs: {len(lps)} log-probs for {len(gen)} generated tokens")
        prompt = wholes(need(item, "prompt_token_ids", at), "prompt_token_ids", at)
        turn = _turn(prompt, ctx) | {"sampled_token_ids": gen, "action_text": _text(item)}
        calls.append(Call(prompt, gen, lps, turn))
    if not calls and rec.get("mask_sample") is True:
        return None
    if not calls:
        raise AdapterError(f"{where}: rollout {rid}: no output item carries generation_token_ids (not rebuilt)")
    reward = rec.get("reward", option(ctx, "reward"))
    if reward is not None:
        reward = option({"reward": reward}, "reward", where)
    rows = episode_rows(rid, merge(calls, f"rollout {rid}"), {})
    if len(rows) != 1:  # builder.py:641-657: a rebuilt response is prefix-contiguous by construction
        raise AdapterError(f"{where}: rollout {rid}: the rebuilt output items are not prefix-contiguous")
    row = {**_common(rid, str(rec.get("_ng_task_index", rid)), ctx, reward), **rows[0], **origin(rec)}
    if rec.get("mask_sample") is True:  # delivery.py:47-49: the consumer excludes it from the loss
        row["loss_mask"] = [False] * len(row["loss_mask"])
        row["loss_excluded"] = True
    return row, reward


# ---------------------------------------------------------------- TokenEntry capture files


def _token_ids(values: Any, field: str, at: str) -> list[int]:
    """Token ids as Gym's digests encode them: unsigned 64-bit integers (records.py:79-93)."""
    ids = wholes(values, field, at)
    if ids and min(ids) < 0:
        raise AdapterError(f"{at}: {field}: a negative token id ({min(ids)})")
    return ids


def _entry(rec: Mapping[str, Any], where: str) -> dict[str, Any]:
    version = whole(rec.get("schema_version", ENTRY_SCHEMA_VERSION), "schema_version", where)
    if version > ENTRY_SCHEMA_VERSION:
        raise AdapterError(f"{where}: schema_version {version}: newer than the TokenEntry version 1 this reads")
    cid = need(rec, "model_call_id", where)
    at = f"{where}: rollout {rec.get('rollout_id')} call {cid}"
    gen = _token_ids(rec["generation_token_ids"], "generation_token_ids", at)
    lps = numbers(need(rec, "generation_log_probs", at), "generation_log_probs", at)
    if len(lps) != len(gen):  # records.py:202-206 refuses it too
        raise AdapterError(f"{at}: generation_log_probs: {len(lps)} log-probs for {len(gen)} generated tokens")
    prompt = _token_ids(need(rec, "prompt_token_ids", at), "prompt_token_ids", at)
    parent = rec.get("parent_call_id")
    if rec.get("prompt_is_delta") and parent is None:
        raise AdapterError(f"{at}: prompt_is_delta without a parent_call_id")
    digest = rec.get("digest")
    return {
        "id": str(cid),
        "rollout": str(need(rec, "rollout_id", at)),
        "prompt": prompt,
        "gen": gen,
        "lps": lps,
        "parent": None if parent is None else str(parent),
        "delta": bool(rec.get("prompt_is_delta")),
        "digest": None if digest is None else sha256_hex(digest, "digest", at),
        "cum_len": None if rec.get("cum_len") is None else whole(rec["cum_len"], "cum_len", at),
        "created": number(rec.get("created_at") or 0.0, "created_at", at),
        "at": at,
        "rec": rec,
    }


def _full_prompts(entries: dict[str, dict[str, Any]]) -> None:
    """A delta entry's full prompt, rebuilt through its parent chain (builder.py:201-261), within a
    budget of MAX_TOKENS rebuilt tokens per rollout (a long chain of tiny deltas would otherwise grow
    quadratically)."""
    budget = MAX_TOKENS
    for e in [e for e in entries.values() if e["delta"]]:
        chain, cursor, seen = [], e, set()
        while cursor["delta"]:  # up to the nearest stored-whole (or already rebuilt) ancestor
            chain.append(cursor)
            seen.add(cursor["id"])
            parent = entries.get(cursor["parent"])
            if parent is None or parent["id"] in seen:
                raise AdapterError(f"{e['at']}: prompt_is_delta: the parent chain is broken at call {cursor['parent']}")
            cursor = parent
        full = cursor["prompt"] + cursor["gen"]
        for link in reversed(chain):
            full = full + link["prompt"]
            budget -= len(full)
            if budget < 0:
                raise AdapterError(f"{e['at']}: prompt_is_delta: the chain rebuilds more than {MAX_TOKENS} tokens")
            link["prompt"], link["delta"] = full, False
            full = full + link["gen"]


def _verify_entry(e: dict[str, Any]) -> None:
    """The entry's recorded cum_len against its own tokens (records.py:151-152); its digest is recorded
    on its turn (capture_digest) for M112 to recompute."""
    seq = e["prompt"] + e["gen"]
    if e["cum_len"] is not None and e["cum_len"] != len(seq):
        raise AdapterError(f"{e['at']}: cum_len: {e['cum_len']} recorded, the call's sequence has {len(seq)} tokens")


def _captures(recs: Sequence[Mapping[str, Any]], rewards: Mapping[str, Any], ctx: Mapping[str, Any]) -> list:
    by_rollout: dict[str, dict[str, dict[str, Any]]] = {}
    for n, rec in enumerate(recs, 1):
        e = _entry(rec, _at(rec, n))
        calls = by_rollout.setdefault(e["rollout"], {})
        if e["id"] in calls and (calls[e["id"]]["prompt"], calls[e["id"]]["gen"]) != (e["prompt"], e["gen"]):
            raise AdapterError(f"{e['at']}: model_call_id: a second entry of this call with other tokens")
        calls.setdefault(e["id"], e)
    rows: list[dict[str, Any]] = []
    for rid, entries in by_rollout.items():
        _full_prompts(entries)
        for e in entries.values():
            _verify_entry(e)
        rows += _capture_rows(rid, entries, rewards.get(rid, option(ctx, "reward")), ctx)
    return rows


def _capture_rows(rid: str, entries: dict[str, dict[str, Any]], reward: Any, ctx: Mapping[str, Any]) -> list:
    """One trajectory per root-to-leaf path of the recorded parent links (calls with no generated
    token carry no signal and are left out, as builder.py:299-305 does)."""
    live = {k: e for k, e in entries.items() if e["gen"]}
    children: dict[str | None, list[str]] = {}
    for cid, e in sorted(live.items(), key=lambda kv: (kv[1]["created"], kv[0])):
        parent = e["parent"] if e["parent"] in live else None
        children.setdefault(parent, []).append(cid)
    paths: list[list[str]] = []
    stack = [[c] for c in reversed(children.get(None, []))]
    while stack:
        path = stack.pop()
        kids = children.get(path[-1], [])
        if not kids:
            paths.append(path)
        stack += [[*path, k] for k in reversed(kids)]
    if sum(len(live[c]["prompt"]) + len(live[c]["gen"]) for path in paths for c in path[-1:]) > MAX_TOKENS:
        raise AdapterError(f"rollout {rid}: its capture's branches expand to more than {MAX_TOKENS} tokens")
    rows = []
    for k, path in enumerate(paths):
        tid = f"{rid}/capture" + (f"/{k}" if len(paths) > 1 else "")
        rows.append({**_common(tid, rid, ctx, reward), **_along(tid, [live[c] for c in path], ctx)})
    return rows


@dataclass
class _Chain:
    """A sequence built call by call: each call's new prompt tokens (user context on the first call,
    observation after), then its generated tokens (policy) with their log-probs, and its turn."""

    seq: list[int] = field(default_factory=list)
    source: list[int] = field(default_factory=list)
    lps: list[float | None] = field(default_factory=list)
    token_turn: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)

    def add(self, new: Sequence[int], gen: Sequence[int], lps: Sequence[float | None], turn: dict[str, Any]) -> None:
        t = len(self.turns)
        self.seq += [*new, *gen]
        self.source += [USER if not t else OBSERVATION] * len(new) + [S.POLICY] * len(gen)
        self.token_turn += [t - 1] * len(new) + [t] * len(gen)
        self.lps += [None] * len(new) + list(lps)
        self.turns.append({"turn_id": t, **turn, "sampled_token_ids": list(gen)})

    def row(self, tid: str) -> dict[str, Any]:
        return {
            "trajectory_id": tid,
            "token_ids": self.seq,
            "token_source": self.source,
            "loss_mask": [s == S.POLICY for s in self.source],
            "behavior_logprobs": self.lps,
            "token_turn": self.token_turn,
            "turns": self.turns,
        }


def _along(tid: str, path: Sequence[dict[str, Any]], ctx: Mapping[str, Any]) -> dict[str, Any]:
    """The sequence the recorded links claim: each child continues its parent's sequence with the
    part of its own prompt past that sequence; its turn records its own prompt as the engine context."""
    chain = _Chain()
    for e in path:
        lps = recorded_logprobs(Call(e["prompt"], e["gen"], e["lps"]), e["at"])
        turn = _turn(e["prompt"], ctx)
        if e["digest"] is not None:  # Gym's stamp of the call's prompt + generation (records.py:79-105)
            turn |= {"capture_digest": e["digest"], "capture_digest_scheme": NEMO_GYM_TOKENS}
        chain.add(e["prompt"][len(chain.seq) :], e["gen"], lps, turn)
    return {**chain.row(tid), **origin(path[0]["rec"])}


# ---------------------------------------------------------------- external-staging ledger


def _ledger(receipts: Sequence[Mapping[str, Any]], staged: Sequence[Mapping[str, Any]], ctx: Mapping[str, Any]) -> list:
    by_key: dict[tuple[str, str], Mapping[str, Any]] = {}
    for n, rec in enumerate(staged, 1):
        where = _at(rec, n)
        key = (str(need(rec, "rollout_id", where)), str(need(rec, "model_call_id", where)))
        _verify_staged(rec, f"{where}: rollout {key[0]} call {key[1]}")
        by_key[key] = rec
    rows = []
    for n, rec in enumerate(receipts, 1):
        row = _receipt(rec, _at(rec, n), by_key, ctx)
        if row is not None:
            rows.append(row)
    return rows


def _versions(rec: Mapping[str, Any], at: str) -> None:
    expect = {
        "schema_version": D.STAGING_SCHEMA_VERSION,
        "digest_version": D.STAGING_DIGEST_VERSION,
        "extras_digest_version": D.EXTRAS_DIGEST_VERSION,
    }
    for key, version in expect.items():
        if rec.get(key, version) != version:
            raise AdapterError(f"{at}: {key}: {short(rec.get(key))}, this reads version {version}")


def _verify_staged(rec: Mapping[str, Any], at: str) -> None:
    """A staged call's own digests against its contents (staging/records.py:139-207)."""
    _versions(rec, at)
    for key in ("rollout_id", "model_call_id", "mode", "parent_call_id"):
        if not isinstance(rec.get(key), str) and not (key == "parent_call_id" and rec.get(key) is None):
            raise AdapterError(f"{at}: {key}: expected a string, got {short(rec.get(key))}")
    for key in ("prev_len", "delta_len", "cum_len", "weight_version"):
        if whole(need(rec, key, at), key, at) < 0:
            raise AdapterError(f"{at}: {key}: expected an unsigned integer, got {short(rec[key])}")
    full = {
        "schema_version": D.STAGING_SCHEMA_VERSION,
        "digest_version": D.STAGING_DIGEST_VERSION,
        "extras_digest_version": D.EXTRAS_DIGEST_VERSION,
        "extras_digest": D.extras_digest(None),
        **rec,
    }
    ids = _token_ids(need(rec, "token_ids_delta", at), "token_ids_delta", at)
    for key in ("token_mask_delta", "generation_log_probs_delta"):
        values = numbers(need(rec, key, at), key, at)
        if len(values) != len(ids):
            raise AdapterError(f"{at}: {key}: {len(values)} values for {len(ids)} tokens")
    if "extras" in rec and D.extras_digest(mapping(rec["extras"], "extras", at) or None) != full["extras_digest"]:
        raise AdapterError(f"{at}: extras_digest: does not match the extras it carries")
    for key in ("digest", "chain_hash", "cumulative_hash", "extras_digest"):
        sha256_hex(full.get(key), key, at)
    try:
        found = D.staged_digest(full)
    except (KeyError, TypeError, ValueError, OverflowError, struct.error) as e:
        raise AdapterError(f"{at}: the staged record cannot be digested ({e})") from None
    if found != full["digest"]:
        raise AdapterError(
            f"{at}: digest: recorded {full['digest'][:16]}..., the staged contents hash to {found[:16]}..."
        )


def _receipt(
    rec: Mapping[str, Any], where: str, staged: Mapping[tuple[str, str], Mapping[str, Any]], ctx: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A receipt's terminal chain, verified and linearized (staging/rebuild.py:176-361); a poisoned
    receipt trains nothing and becomes no trajectory."""
    rid = str(need(rec, "rollout_id", where))
    at = f"{where}: receipt of rollout {rid}"
    _versions(rec, at)
    manifest = {str(need(m, "model_call_id", at)): m for m in objects(need(rec, "manifest", at), "manifest", at)}
    for cid, m in manifest.items():
        parent = m.get("parent_call_id")
        if parent is not None:
            if not isinstance(parent, str):  # the ids are strings (manifest keys); a list is not even hashable
                raise AdapterError(
                    f"{at}: call {cid}: parent_call_id: expected a call id, got {type(parent).__name__} {short(parent)}"
                )
            if parent not in manifest:
                raise AdapterError(f"{at}: call {cid}: parent_call_id: {short(parent)} is not in the manifest")
            if whole(m.get("prev_len"), "prev_len", at) != whole(manifest[parent].get("cum_len"), "cum_len", at):
                raise AdapterError(
                    f"{at}: call {cid}: prev_len: starts at {m.get('prev_len')}, its parent ends at "
                    f"{manifest[parent].get('cum_len')}"
                )
    if rec.get("capture_poisoned") or rec.get("failure_reason") is not None:
        return None
    terminal = rec.get("terminal_model_call_id")
    if terminal not in manifest:
        raise AdapterError(f"{at}: terminal_model_call_id: {short(terminal)} is not in the manifest")
    chain: list[str] = []
    cursor: Any = terminal
    while cursor is not None:
        if cursor in chain:
            raise AdapterError(f"{at}: call {cursor}: parent_call_id: the lineage is a cycle")
        chain.append(cursor)
        cursor = manifest[cursor].get("parent_call_id")
    chain.reverse()
    built = _Chain()
    running: str | None = None
    for cid in chain:
        m, s = manifest[cid], staged.get((rid, cid))
        if s is None:
            raise AdapterError(f"{at}: call {cid}: no staged record of this call among the files read")
        for key in ("parent_call_id", "prev_len", "delta_len", "cum_len", "weight_version", "digest", "chain_hash"):
            if m.get(key) != s.get(key):
                raise AdapterError(
                    f"{at}: call {cid}: {key}: {short(m.get(key))} in the manifest, {short(s.get(key))} staged"
                )
        ids = wholes(s["token_ids_delta"], "token_ids_delta", at)
        running = D.chain_hash(running, ids)
        if running != m["chain_hash"]:
            raise AdapterError(f"{at}: call {cid}: chain_hash: does not chain its staged delta onto its parent's")
        mask = numbers(s["token_mask_delta"], "token_mask_delta", at)
        carry = next((i for i, v in enumerate(mask) if v != 0.0), len(mask))
        if carry == len(mask) or any(v != 1.0 for v in mask[carry:]):
            raise AdapterError(f"{at}: call {cid}: token_mask_delta: not a prompt carry then a generation")
        gen_lps = numbers(s["generation_log_probs_delta"], "generation_log_probs_delta", at)
        version = whole(m.get("weight_version"), "weight_version", at)
        built.add(ids[:carry], ids[carry:], gen_lps[carry:], _turn(built.seq + ids[:carry], ctx, version))
    if D.prefix_hash(built.seq) != manifest[chain[-1]].get("cumulative_hash"):
        raise AdapterError(f"{at}: call {chain[-1]}: cumulative_hash: does not cover the linearized tokens")
    reward = rec.get("reward", option(ctx, "reward"))
    row = built.row(rid)
    return {
        **_common(rid, rid, ctx, None if reward is None else option({"reward": reward}, "reward", at)),
        **row,
        **origin(rec),
    }


__all__ = ["read_dump", "rollout_id", "to_contract"]
