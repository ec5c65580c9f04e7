"""What the step-based adapters (rLLM, verifiers, OpenAI-compatible logs) share: merging a
trajectory's engine calls into the trainer's cumulative sequence, the engine-context hash,
typed context options, and a contract table that names what the framework does not record."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..contract import schema as S
from .base import AdapterError, flags, numbers, short, token_ids, whole, wholes

FINISH_REASONS = frozenset(S.contract()["finish_reasons"])
IDENTITY = ("environment_id", "environment_version", "verifier_version", "reset_seed", "tokenizer_id")
_TYPES: dict[str, type] = {
    "reset_seed": int,
    "policy_version": int,
    "temperature": float,
    "top_p": float,
    "gamma": float,
    "reward": float,
    "stop_reason": str,
    "task_id": str,
    "group_id": str,
}


@dataclass
class Call:
    """One engine call of a trajectory: the ids it was given, the ids it returned, their log-probs
    (None when not recorded; a shorter list leaves the tail unrecorded) and the turn's fields."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    logprobs: Sequence[float | None] | None
    turn: dict[str, Any] = field(default_factory=dict)
    mask: Sequence[Any] | None = None  # the framework's loss mask on the sampled ids (None: all trained)
    logprob_ids: Sequence[int | None] | None = None  # per sampled id: the id its log-prob entry names (None: not named)


@dataclass
class Segment:
    """The trainer's sequence for a run of prefix-extending calls, in contract columns."""

    token_ids: list[int] = field(default_factory=list)
    token_source: list[int] = field(default_factory=list)
    behavior_logprobs: list[float | None] = field(default_factory=list)
    token_turn: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    split: dict[str, Any] = field(default_factory=dict)  # where this segment's first context left the previous one
    logprob_ids: list[int | None] = field(default_factory=list)  # per token: the id its log-prob entry names
    exposed: dict[str, Any] = field(default_factory=dict)  # where the next segment's first context left this one

    def add(
        self,
        ids: Sequence[int],
        source: int,
        lps: Sequence[float | None] | None = None,
        mask: Sequence[Any] | None = None,
    ) -> None:
        """Append tokens of one source to the sequence (log-probs null unless given; trained when
        sampled by the policy, unless the framework's mask says otherwise)."""
        turn = len(self.turns) - 1
        self.token_ids += [int(i) for i in ids]
        self.token_source += [source] * len(ids)
        self.loss_mask += [bool(m) for m in mask] if mask is not None else [source == S.POLICY] * len(ids)
        self.behavior_logprobs += list(lps) if lps is not None else [None] * len(ids)
        self.token_turn += [turn] * len(ids)
        self.logprob_ids += [None] * len(ids)

    def columns(self) -> dict[str, Any]:
        """The token-level and turn columns."""
        return {
            "token_ids": self.token_ids,
            "token_source": self.token_source,
            "loss_mask": self.loss_mask,
            "behavior_logprobs": self.behavior_logprobs,
            "token_turn": self.token_turn,
            "turns": self.turns,
        }


def recorded_logprobs(call: Call, where: str) -> list[float | None]:
    """The call's log-probs aligned with its sampled ids: null where none was recorded (rLLM's trainer
    pads a short list with 0.0, which is not a log-prob); a longer list cannot be aligned."""
    n = len(call.completion_ids)
    lps = numbers(call.logprobs or [], "logprobs", where)
    if len(lps) > n:
        raise AdapterError(f"{where}: {len(lps)} log-probs for {n} sampled tokens")
    return lps + [None] * (n - len(lps))


def divergence(sequence: Sequence[int], context: Sequence[int]) -> dict[str, Any]:
    """Where `context` first differs from `sequence` (contract 1.2 split columns): the position, the id
    the sequence had there and the id the context had (None when the context ended there)."""
    n = min(len(sequence), len(context))
    a, b = np.asarray(sequence[:n], np.int64), np.asarray(context[:n], np.int64)
    differ = np.flatnonzero(a != b)
    pos = int(differ[0]) if differ.size else n
    return {
        "split_position": pos,
        "split_sequence_id": int(sequence[pos]),
        "split_context_id": int(context[pos]) if pos < len(context) else None,
    }


def merge(calls: Sequence[Call], where: str) -> list[Segment]:
    """Cumulative merge as rLLM's and prime-rl's trainers do it: a call whose prompt extends the running
    sequence adds its new prompt tokens (observation, source 3) and its sampled ids (policy, source 2);
    any other call starts a new segment whose prompt is user context (source 1), and the segment keeps
    where that prompt left the running sequence (`Segment.split`)."""
    segments: list[Segment] = []
    seg: Segment | None = None
    for n, call in enumerate(calls):
        prompt = wholes(call.prompt_ids, "prompt_ids", f"{where} call {n}")
        if seg is not None and prompt[: len(seg.token_ids)] == seg.token_ids:
            delta, source = prompt[len(seg.token_ids) :], 3
        else:
            split = divergence(seg.token_ids, prompt) if seg is not None else {}
            if seg is not None:
                seg.exposed = exposed(seg, split["split_position"])
            seg = Segment(split=split)
            segments.append(seg)
            delta, source = prompt, 1
        seg.add(delta, source)  # tagged with the previous turn (-1 before the first)
        seg.turns.append({"turn_id": len(seg.turns), **call.turn})
        completion = wholes(call.completion_ids, "completion_ids", f"{where} call {n}")
        mask = None if call.mask is None else flags(call.mask, "completion_mask", f"{where} call {n}")
        if mask is not None and len(mask) != len(completion):
            raise AdapterError(f"{where} call {n}: a mask of {len(mask)} for {len(completion)} sampled ids")
        seg.add(completion, S.POLICY, recorded_logprobs(call, f"{where} call {n}"), mask)
        if call.logprob_ids is not None and len(call.logprob_ids) == len(completion):
            seg.logprob_ids[len(seg.logprob_ids) - len(completion) :] = list(call.logprob_ids)
    return segments


def exposed(seg: Segment, position: int) -> dict[str, Any]:
    """What a split exposes on the segment it leaves (contract 1.3): the position and the id the
    engine's log-prob entry names there, when the engine sampled that position and its entry names
    an id (from the engine's response, never from the mask); empty otherwise."""
    named = seg.logprob_ids[position] if position < len(seg.logprob_ids) else None
    if named is None:
        return {}
    return {"split_exposed_position": position, "split_exposed_logprob_id": named}


def episode_rows(episode_id: str, segments: Sequence[Segment], outcome: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per segment of an episode: `{episode_id}#{j}` when the trainer split it, with the split
    evidence (contract 1.2: split_from, split_position and the two ids) and the episode's outcome
    (stop flags, stop_reason, reward, verdict) on the last segment only: the others are `split_continues`, their outcome null,
    so that a split episode's reward, stop cause and verdict count once."""
    if len(segments) == 1:
        return [{"trajectory_id": episode_id, **segments[0].columns(), **outcome}]
    last = len(segments) - 1
    return [
        {
            "trajectory_id": f"{episode_id}#{j}",
            **seg.columns(),
            "split_from": episode_id,
            "split_continues": j < last,
            **seg.split,
            **seg.exposed,
            **(outcome if j == last else dict.fromkeys(outcome)),
        }
        for j, seg in enumerate(segments)
    ]


def guarded(framework: str) -> Callable[[Callable[..., pa.Table]], Callable[..., pa.Table]]:
    """A converter whose records of the wrong shape (a string where ids are, an object where a list is)
    fail with one AdapterError line naming the framework, not an internal error."""

    def wrap(fn: Callable[..., pa.Table]) -> Callable[..., pa.Table]:
        def run(records: Any, **context: Any) -> pa.Table:
            try:
                return fn(records, **context)
            except AdapterError:
                raise
            except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, pa.ArrowException) as e:
                raise AdapterError(f"{framework}: malformed record ({type(e).__name__}: {e})") from None

        run.__doc__, run.__name__ = fn.__doc__, fn.__name__
        return run

    return wrap


def engine_context(ids: Sequence[int] | None, field: str = "prompt_token_ids") -> dict[str, Any]:
    """Turn fields describing the context the engine was given (empty when not recorded)."""
    if ids is None:
        return {}
    ids = token_ids(ids, field, "the engine's context")
    return {"context_length": len(ids), "context_sha256": S.context_sha256(ids)}


def finish_reason(value: Any) -> str | None:
    """The engine's finish reason when it is one the contract knows; null otherwise (not guessed)."""
    return value if isinstance(value, str) and value in FINISH_REASONS else None


def option(context: Mapping[str, Any], key: str, where: str | None = None) -> Any:
    """A context option in its contract type (CLI values arrive as strings); None when not given.
    `where` names the record the values come from (a session's `end`, a call's sampling), else they
    are the command line's context. A number where an integer belongs must be a whole one."""
    value = context.get(key)
    if value is None or key not in _TYPES:
        return value
    kind = _TYPES[key]
    what = {int: "an integer", float: "a number", str: "a string"}[kind]
    if kind is int and not isinstance(value, str):
        return whole(value, key, where or "context")
    try:
        if isinstance(value, (bool, list, Mapping)) and kind is not str:
            raise TypeError
        if kind is str and where is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
            raise TypeError  # a record's identifier or reason is text (or a number), not any value shown as text
        return kind(value)
    except (TypeError, ValueError):
        if where is None:
            raise AdapterError(f"context {key}={value!r} is not a {kind.__name__}") from None
        raise AdapterError(f"{where}: {key}: expected {what}, got {type(value).__name__} {short(value)}") from None


def identity(context: Mapping[str, Any]) -> dict[str, Any]:
    """Environment, verifier and tokenizer identity from the context: only the keys given."""
    return {k: option(context, k) for k in IDENTITY if context.get(k) is not None}


def stop_columns(flag: str | None, stop_reason: str) -> dict[str, Any]:
    """The three stop flags (only `flag` true; none when the framework did not say) and stop_reason."""
    return {f: f == flag for f in S.STOP_FLAGS} | {"stop_reason": stop_reason}


def outcome(sid: str, end: Mapping[str, Any], context: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A session's outcome columns (stop flags, stop_reason, reward: the last segment's) and the columns
    every segment shares (task, group, identity), from its end record or else the context."""
    stop = end.get("stop_reason", option(context, "stop_reason"))
    reward = end.get("reward", option(context, "reward"))
    extra: dict[str, Any] = {} if stop is None else stop_columns(S.stop_reasons().get(stop), stop)
    extra |= {} if reward is None else {"reward": reward}
    group = end.get("group_id", option(context, "group_id"))
    common = {
        "task_id": end.get("task_id", option(context, "task_id") or sid),
        **({"group_id": group} if group is not None else {}),
        **identity(context),
    }
    return extra, common


def identity_lacks(framework: str, what: Mapping[str, str]) -> dict[str, str]:
    """Why identity columns may be absent: the framework does not record them (`what` names each as the
    framework would), and the context option that supplies it."""
    return {k: f"{framework} does not record {w}; pass --context {k}=..." for k, w in what.items()}
