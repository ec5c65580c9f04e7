"""The fault registry (`fault`, `FAULTS`), the mutable log a fault works on (`Ctx`), and the
helpers that keep a mutation consistent."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

Records = tuple[list[dict], list[dict]]  # (trajectory records, update records)


@dataclass(frozen=True)
class Fault:
    """A named way of breaking a log, with the codes the audit must raise for it."""

    name: str
    codes: frozenset[str]
    description: str
    func: Callable[[Ctx], list[str]]
    config: dict = field(default_factory=dict)  # how the broken run was produced: the log carries it
    file_level: bool = False  # breaks the file itself (written by the caller), not records
    declares: dict = field(default_factory=dict)  # reward components the broken producer declares paid once
    group: str = ""  # faults sharing one log in the partition and streaming tests (its own name when alone)
    user_config: dict = field(default_factory=dict)  # what the user alone states (a threshold, a list)

    @property
    def settings(self) -> dict:
        """Every setting the fault's audit needs, for an audit made in code (no file inside or
        beside a log): the log's own and the user's."""
        return {**self.config, **self.user_config}


FAULTS: dict[str, Fault] = {}


def fault(
    name: str,
    codes: set[str] | frozenset[str],
    *,
    config: dict | None = None,
    file_level: bool = False,
    declares: dict | None = None,
    group: str | None = None,
    user_config: dict | None = None,
) -> Callable:
    """Register a fault; its docstring's first paragraph is its description.

    `config`: how the broken run was produced (the trainer's settings); the broken log carries it
    in its own pyproject.toml, so only keys a log may carry (`LOG_CONTEXT`) are accepted.
    `user_config`: what only the user states (a threshold, a stop-token list, which checks run);
    a broken fixture's is a file beside its log (`fixtures/broken/<fault>.user.toml`, named in the
    manifest), which the tests and the detection matrix pass as the user's own configuration,
    never read from inside the log. `group` names the shared log the fault joins in the tests that
    need every fault under a costly setting (tests/faultgroups.py): faults of one group expect
    disjoint codes and break different trajectories. Without it the fault has a log of its own.
    """
    from ..contract.config import LOG_CONTEXT, Config

    for key in config or {}:
        if key not in LOG_CONTEXT:
            raise ValueError(
                f"fault {name}: config key {key!r} is not one a log may carry ({', '.join(LOG_CONTEXT)}); "
                "a setting the user alone states goes in user_config="
            )
    for key in user_config or {}:
        if key not in Config.model_fields or key in LOG_CONTEXT:
            raise ValueError(
                f"fault {name}: user_config key {key!r} is "
                + ("how the run was produced: it goes in config=" if key in LOG_CONTEXT else "not a configuration key")
            )

    def deco(func: Callable) -> Callable:
        if name in FAULTS:
            raise ValueError(f"fault {name} registered twice")
        FAULTS[name] = Fault(
            name,
            frozenset(codes),
            " ".join((func.__doc__ or name).strip().split("\n\n")[0].split()),  # the first paragraph, whole
            func,
            config or {},
            file_level,
            declares or {},
            group or name,
            user_config or {},
        )
        return func

    return deco


class NoTarget(ValueError):
    """A fault found nothing in the log it can break (a log without the trajectory it needs)."""


class Ctx:
    """The mutable copy of a log plus helpers to pick targets deterministically."""

    def __init__(self, trajs: list[dict], updates: list[dict], seed: int) -> None:
        self.trajs = trajs
        self.updates = updates
        self.rng = random.Random(seed)
        self.by_id = {t["trajectory_id"]: t for t in trajs}

    def used(self) -> set[str]:
        return {i for u in self.updates for i in u["trajectory_ids"]}

    def pick(self, pred: Callable[[dict], bool] = lambda t: True, what: str = "trajectory") -> dict:
        cands = [t for t in self.trajs if pred(t)]
        if not cands:
            raise NoTarget(f"the log has no {what} this fault can break")
        return self.rng.choice(cands)

    def update_of(self, tid: str) -> dict:
        return next(u for u in self.updates if tid in u["trajectory_ids"])


# ---------------------------------------------------------------- helpers keeping a mutation consistent


SEPARATOR = 198  # a chat template's turn separator (the newline token in Qwen's vocabulary)


def policy_positions(t: dict, turn: int | None = None) -> list[int]:
    return [
        i for i, (s, k) in enumerate(zip(t["token_source"], t["token_turn"])) if s == 2 and (turn is None or k == turn)
    ]


def template_follows(t: dict) -> None:
    """The producer's chat template renders what the trainer's sequence now holds (a trainer that
    re-applied it, or re-tokenized the text as the template does): each turn's recorded render,
    where the log has one, follows the sequence up to the turn's first policy token."""
    from ..contract.schema import context_sha256

    for k, tr in enumerate(t["turns"]):
        pos = policy_positions(t, turn=k)
        if tr.get("template_context_length") is not None and pos:
            tr["template_context_length"] = pos[0]
            tr["template_context_sha256"] = context_sha256(t["token_ids"], pos[0])


def rederive_returns(t: dict) -> None:
    """Recompute td_residual and discounted_return from rewards, shaping and values."""
    g = t.get("gamma") or 1.0
    turns = t["turns"]
    for i, tr in enumerate(turns):
        v_next = turns[i + 1]["value"] if i + 1 < len(turns) else t["final_value"]
        tr["td_residual"] = tr["reward"] + tr["shaping"] + g * v_next - tr["value"]
    t["discounted_return"] = sum(g**i * (tr["reward"] + tr["shaping"]) for i, tr in enumerate(turns))


# the optional per-token lists of contract 1.2 to 1.4, aligned with token_ids when a log records them
PER_TOKEN = (
    "token_reward",
    "token_kl",
    "token_returns",
    "routed_experts_version",
    "loss_stream",
    "loss_weight",
    "token_values",
    "token_value_targets",
)


def drop_token(t: dict, pos: int) -> None:
    for c in ("token_ids", "token_source", "loss_mask", "behavior_logprobs", "token_turn"):
        del t[c][pos]
    for c in PER_TOKEN:  # the trainer built its per-token terms on the sequence it holds
        if t.get(c) is not None:
            del t[c][pos]
    off = t.get("nucleus_offsets")
    if off is not None:  # the token's recorded nucleus goes with it (offsets: one more than the tokens)
        lo, hi = off[pos], off[pos + 1]
        if t.get("nucleus_ids") is not None:
            del t["nucleus_ids"][lo:hi]
        t["nucleus_offsets"] = off[: pos + 1] + [o - (hi - lo) for o in off[pos + 2 :]]


def _recount_turn(t: dict, k: int) -> None:
    """Turn `k`'s record of its policy tokens follows the sequence: num_policy_tokens, logprob (the
    sum of their behaviour log-probs) and sampled_token_ids (the engine returned them)."""
    tr, own = t["turns"][k], policy_positions(t, turn=k)
    if tr.get("num_policy_tokens") is not None:
        tr["num_policy_tokens"] = len(own)
    if tr.get("logprob") is not None:
        tr["logprob"] = float(sum(t["behavior_logprobs"][i] or 0.0 for i in own))
    if tr.get("sampled_token_ids") is not None:
        tr["sampled_token_ids"] = [t["token_ids"][i] for i in own]


def insert_tokens(
    ctx: Ctx,
    t: dict,
    pos: int,
    ids: list[int],
    *,
    source: int,
    turn: int,
    logprobs: list[float | None] | None = None,
    mask: bool | None = None,
) -> None:
    """Tokens `ids` inserted before position `pos` (`len(token_ids)` appends), from `source`, in turn
    `turn` (-1: before the first agent turn), recorded as a producer whose sequence holds them would
    record them, so that only the check the fault targets sees a difference (the inverse of
    `drop_token`):

    - the token lists (token_ids, token_source, token_turn, loss_mask, behavior_logprobs) and every
      per-token list the log records (`PER_TOKEN`: no reward or KL on the new tokens, the returns
      the recursion gives them, weight 1 on a trained token, the policy-gradient stream, the turn's
      routed version), and the nucleus record (a policy token's span holds its own id);
    - its turn (policy tokens): num_policy_tokens, logprob (the sum of its behaviour log-probs) and
      sampled_token_ids (the engine returned them);
    - the context each later turn was sampled from (context_length and template_context_length
      grow where the new tokens precede them, and their SHA-256 follow the new sequence);
    - the counts: num_trainable_tokens, and each update's loss denominator and numerator count.

    `logprobs` (one per id) is required for policy tokens; `mask` defaults to "trained when the
    policy sampled it" (`source == 2`). The token-level reward moves to the new last policy token
    when the insertion extends the last action (`recredit`)."""
    from ..contract.schema import context_sha256

    n = len(ids)
    policy = source == 2
    if policy and (logprobs is None or len(logprobs) != n):
        raise ValueError("insert_tokens: policy tokens need one behaviour log-prob each")
    if not policy and logprobs is None:
        logprobs = [None] * n
    assert logprobs is not None
    trained = policy if mask is None else mask
    last_policy = max(policy_positions(t), default=-1)
    later = [i for i in policy_positions(t) if i >= pos]
    ret_at = t["token_returns"][later[0]] if t.get("token_returns") is not None and later else 0.0
    fills: dict[str, list] = {
        "token_ids": list(ids),
        "token_source": [source] * n,
        "token_turn": [turn] * n,
        "loss_mask": [trained] * n,
        "behavior_logprobs": list(logprobs),
        "token_reward": [0.0] * n,
        "token_kl": [0.0] * n,
        "token_returns": [ret_at if policy else 0.0] * n,
        "loss_stream": [0] * n,
        "loss_weight": [1.0 if trained else 0.0] * n,
    }
    if t.get("routed_experts_version") is not None:
        near = t["routed_experts_version"][min(pos, len(t["routed_experts_version"]) - 1)] if t["token_ids"] else None
        version = t["turns"][turn].get("policy_version") if policy and turn >= 0 else near
        fills["routed_experts_version"] = [version] * n
    for c, v in fills.items():
        if c in ("token_ids", "token_source", "token_turn", "loss_mask", "behavior_logprobs") or t.get(c) is not None:
            t[c][pos:pos] = v
    off = t.get("nucleus_offsets")
    if off is not None:
        spans = [[i] if policy else [] for i in ids]
        at = off[pos]
        if t.get("nucleus_ids") is not None:
            t["nucleus_ids"][at:at] = [i for s in spans for i in s]
        grown = [at + sum(len(s) for s in spans[: k + 1]) for k in range(n)]
        shift = grown[-1] - at if grown else 0
        t["nucleus_offsets"] = off[: pos + 1] + grown + [o + shift for o in off[pos + 1 :]]
    if policy and turn >= 0:
        _recount_turn(t, turn)
    for j, tr in enumerate(t["turns"]):
        for length, sha in (
            ("context_length", "context_sha256"),
            ("template_context_length", "template_context_sha256"),
        ):
            c = tr.get(length)
            if c is None or not (pos < c or (pos == c and not (policy and turn == j))):
                continue
            tr[length] = c + n
            if tr.get(sha) is not None:
                tr[sha] = context_sha256(t["token_ids"], c + n)
    if policy and pos > last_policy:
        recredit(t)
    if t.get("num_trainable_tokens") is not None:
        t["num_trainable_tokens"] = n_trainable(t)
    sync_denominator(ctx, t["trajectory_id"])


def remove_tokens(ctx: Ctx, t: dict, pos: int, n: int = 1) -> None:
    """Tokens `pos` to `pos + n - 1` removed, recorded as a producer whose sequence never held them
    would record the rest (the inverse of `insert_tokens`; `drop_token` removes one token from the
    lists alone): every per-token list and the nucleus record, each turn that lost policy tokens
    (num_policy_tokens, logprob, sampled_token_ids), the contexts of the turns after them (lengths
    and SHA-256), the token-level reward (on the new last policy token when the last one went,
    `recredit`), num_trainable_tokens and the updates' loss denominators and numerator counts."""
    from ..contract.schema import context_sha256

    gone = range(pos, pos + n)
    policy_turns = {t["token_turn"][i] for i in gone if t["token_source"][i] == 2 and t["token_turn"][i] >= 0}
    last_policy = max(policy_positions(t), default=-1)
    for i in reversed(gone):
        drop_token(t, i)
    for k in policy_turns:
        _recount_turn(t, k)
    for tr in t["turns"]:
        for length, sha in (
            ("context_length", "context_sha256"),
            ("template_context_length", "template_context_sha256"),
        ):
            c = tr.get(length)
            if c is None or c <= pos:
                continue
            tr[length] = c - min(n, c - pos)
            if tr.get(sha) is not None:
                tr[sha] = context_sha256(t["token_ids"], tr[length])
    if pos <= last_policy < pos + n:
        recredit(t)
    if t.get("num_trainable_tokens") is not None:
        t["num_trainable_tokens"] = n_trainable(t)
    sync_denominator(ctx, t["trajectory_id"])


def replace_token(t: dict, pos: int, new_id: int) -> None:
    """Token `pos` holds `new_id` where the producer's record says which id was sampled: in token_ids and,
    where the log records the nucleus it was sampled from, in its span (the record that returned the
    id names the same one), so that no other check sees a sampled token outside its recorded nucleus."""
    old = t["token_ids"][pos]
    t["token_ids"][pos] = new_id
    off, ids = t.get("nucleus_offsets"), t.get("nucleus_ids")
    if off is not None and ids is not None and pos + 1 < len(off):
        for k in range(off[pos], off[pos + 1]):
            if ids[k] == old:
                ids[k] = new_id


def recredit(t: dict) -> None:
    """A trainer that paid the episode another reward placed that one on its last policy token, and
    its returns follow (where the log records the per-token terms; the KL penalties are kept)."""
    if t.get("token_reward") is None:
        return
    pol = [i for i, s in enumerate(t["token_source"]) if s == 2]
    t["token_reward"] = [0.0] * len(t["token_source"])
    if pol and t["reward"]:
        t["token_reward"][pol[-1]] = float(t["reward"])
    kl = t.get("token_kl") or [0.0] * len(t["token_source"])
    acc, ret = 0.0, [0.0] * len(t["token_source"])
    for i in reversed(pol):
        acc += t["token_reward"][i] - (kl[i] or 0.0)
        ret[i] = acc
    t["token_returns"] = ret


def n_trainable(t: dict) -> int:
    return int(sum(t["loss_mask"]))


def sync_denominator(ctx: Ctx, tid: str) -> None:
    """A pipeline that changed the mask also counted it and summed its loss under it: keep token
    denominators (and recorded numerator counts, and per-token loss weights) consistent."""
    t = ctx.by_id[tid]
    if t.get("loss_weight") is not None:
        t["loss_weight"] = [w if (w > 0) == m else float(m) for w, m in zip(t["loss_weight"], t["loss_mask"])]
    for u in ctx.updates:
        if tid in u["trajectory_ids"] and u["reduction"] == "token":
            u["loss_denominator"] = float(sum(n_trainable(ctx.by_id[i]) for i in u["trajectory_ids"]))
        if tid in u["trajectory_ids"] and u.get("numerator_tokens") is not None:
            u["numerator_tokens"][u["trajectory_ids"].index(tid)] = n_trainable(ctx.by_id[tid])


def append_member(u: dict, tid: str, trainable: int) -> None:
    """An update that trains on one more trajectory: its advantage (0) and its numerator count."""
    u["trajectory_ids"].append(tid)
    if u.get("advantages") is not None:
        u["advantages"].append(0.0)
    if u.get("numerator_tokens") is not None:
        u["numerator_tokens"].append(trainable)


def loss_evidence(ctx: Ctx) -> None:
    """Record the contract 1.2 loss evidence a compliant trainer would write, where the log lacks it."""
    from ..synth import record_loss_evidence

    record_loss_evidence(ctx.trajs, ctx.updates)
