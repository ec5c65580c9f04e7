"""Named faults: each turns a compliant log into a broken one, the way a real pipeline bug
would (the lessons from “Success, termination, truncation, and infrastructure failure” to “A training environment is stricter than a demo environment”), and declares the codes the audit must raise.

A fault takes the log as records (lists of dicts, see `Records`), mutates a deep copy and
returns the trajectory ids it touched. Mutations stay consistent where the real bug would
be: a pipeline that trains on tool tokens also counts them in num_trainable_tokens and in
its loss denominator, so the provenance check, not a bookkeeping check, has to catch it.

    broken, touched = apply("tool_tokens_trained", trajs, updates)
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .contract.config import Config

Records = tuple[list[dict], list[dict]]  # (trajectory records, update records)


@dataclass(frozen=True)
class Fault:
    """A named way of breaking a log, with the codes the audit must raise for it."""

    name: str
    codes: frozenset[str]
    description: str
    func: Callable[[_Ctx], list[str]]
    config: dict = field(default_factory=dict)  # audit configuration the fault needs
    file_level: bool = False  # breaks the file itself (written by the caller), not records
    declares: dict = field(default_factory=dict)  # reward components the broken producer declares paid once


FAULTS: dict[str, Fault] = {}


def fault(
    name: str,
    codes: set[str] | frozenset[str],
    *,
    config: dict | None = None,
    file_level: bool = False,
    declares: dict | None = None,
) -> Callable:
    """Register a fault; its docstring's first paragraph is its description."""

    def deco(func: Callable) -> Callable:
        FAULTS[name] = Fault(
            name,
            frozenset(codes),
            " ".join((func.__doc__ or name).strip().split("\n\n")[0].split()),  # the first paragraph, whole
            func,
            config or {},
            file_level,
            declares or {},
        )
        return func

    return deco


class _Ctx:
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
            raise ValueError(f"the log has no {what} this fault can break")
        return self.rng.choice(cands)

    def update_of(self, tid: str) -> dict:
        return next(u for u in self.updates if tid in u["trajectory_ids"])


# ---------------------------------------------------------------- helpers keeping a mutation consistent


SEPARATOR = 198  # a chat template's turn separator (the newline token in Qwen's vocabulary)


def _policy_positions(t: dict, turn: int | None = None) -> list[int]:
    return [
        i for i, (s, k) in enumerate(zip(t["token_source"], t["token_turn"])) if s == 2 and (turn is None or k == turn)
    ]


def _rederive_returns(t: dict) -> None:
    """Recompute td_residual and discounted_return from rewards, shaping and values."""
    g = t.get("gamma") or 1.0
    turns = t["turns"]
    for i, tr in enumerate(turns):
        v_next = turns[i + 1]["value"] if i + 1 < len(turns) else t["final_value"]
        tr["td_residual"] = tr["reward"] + tr["shaping"] + g * v_next - tr["value"]
    t["discounted_return"] = sum(g**i * (tr["reward"] + tr["shaping"]) for i, tr in enumerate(turns))


def _drop_token(t: dict, pos: int) -> None:
    for c in ("token_ids", "token_source", "loss_mask", "behavior_logprobs", "token_turn"):
        del t[c][pos]


def _trainable(t: dict) -> int:
    return int(sum(t["loss_mask"]))


def _sync_denominator(ctx: _Ctx, tid: str) -> None:
    """A pipeline that changed the mask also counted it and summed its loss under it: keep token
    denominators (and recorded numerator counts) consistent."""
    for u in ctx.updates:
        if tid in u["trajectory_ids"] and u["reduction"] == "token":
            u["loss_denominator"] = float(sum(_trainable(ctx.by_id[i]) for i in u["trajectory_ids"]))
        if tid in u["trajectory_ids"] and u.get("numerator_tokens") is not None:
            u["numerator_tokens"][u["trajectory_ids"].index(tid)] = _trainable(ctx.by_id[tid])


def _append_member(u: dict, tid: str, trainable: int) -> None:
    """An update that trains on one more trajectory: its advantage (0) and its numerator count."""
    u["trajectory_ids"].append(tid)
    if u.get("advantages") is not None:
        u["advantages"].append(0.0)
    if u.get("numerator_tokens") is not None:
        u["numerator_tokens"].append(trainable)


# ---------------------------------------------------------------- structure


@fault("missing_loss_mask", {"S001"})
def missing_loss_mask(ctx: _Ctx) -> list[str]:
    """The exporter dropped the loss_mask column (the trainer would rebuild it from roles)."""
    for t in ctx.trajs:
        del t["loss_mask"]
    return []


@fault("duplicate_shard_row", {"S002"})
def duplicate_shard_row(ctx: _Ctx) -> list[str]:
    """A retried writer emitted an excluded episode twice under the same trajectory_id."""
    t = ctx.pick(lambda t: t["reward"] is None, "excluded trajectory")
    ctx.trajs.append(copy.deepcopy(t))
    return [t["trajectory_id"]]


@fault("mask_length_mismatch", {"S003"})
def mask_length_mismatch(ctx: _Ctx) -> list[str]:
    """The loss mask was built from a different tokenization: one element short."""
    t = ctx.pick()
    t["loss_mask"] = t["loss_mask"][:-1]
    return [t["trajectory_id"]]


@fault("token_turn_out_of_range", {"S004"})
def token_turn_out_of_range(ctx: _Ctx) -> list[str]:
    """The last observation is tagged with a turn that does not exist."""
    t = ctx.pick()
    t["token_turn"][-1] = len(t["turns"]) + 1
    return [t["trajectory_id"]]


@fault("corrupt_file", {"S005", "U605"}, file_level=True)
def corrupt_file(ctx: _Ctx) -> list[str]:
    """A shard was truncated mid-write (no atomic publish): the Parquet footer is gone.

    The updates still name the shard's trajectories, which the log no longer holds (U605).
    """
    return []


# ---------------------------------------------------------------- masks and provenance


@fault("tool_tokens_trained", {"M101"})
def tool_tokens_trained(ctx: _Ctx) -> list[str]:
    """Tool output trained on: the mask follows the assistant role, which includes the tool reply.

    The pipeline counts those tokens as trainable everywhere (num_trainable_tokens, loss
    denominator), so only the provenance check can catch it.
    """
    t = ctx.pick(lambda t: t["trajectory_id"] in ctx.used())
    for i, s in enumerate(t["token_source"]):
        if s == 3:
            t["loss_mask"][i] = True
    t["num_trainable_tokens"] = _trainable(t)
    _sync_denominator(ctx, t["trajectory_id"])
    return [t["trajectory_id"]]


@fault("policy_tokens_unmasked", {"M102"})
def policy_tokens_unmasked(ctx: _Ctx) -> list[str]:
    """A turn's sampled tokens were left out of the loss (mask built from the wrong span)."""
    t = ctx.pick(lambda t: t["trajectory_id"] in ctx.used())
    for i in _policy_positions(t, turn=0):
        t["loss_mask"][i] = False
    t["num_trainable_tokens"] = _trainable(t)
    _sync_denominator(ctx, t["trajectory_id"])
    return [t["trajectory_id"]]


@fault("trainable_count_whole_transcript", {"M103"})
def trainable_count_whole_transcript(ctx: _Ctx) -> list[str]:
    """num_trainable_tokens logged as the transcript length instead of the mask sum."""
    t = ctx.pick()
    t["num_trainable_tokens"] = len(t["token_ids"])
    return [t["trajectory_id"]]


@fault("turn_policy_count_off_by_one", {"M104"})
def turn_policy_count_off_by_one(ctx: _Ctx) -> list[str]:
    """The per-turn policy token count includes the end-of-turn marker."""
    t = ctx.pick()
    t["turns"][-1]["num_policy_tokens"] += 1
    return [t["trajectory_id"]]


@fault("template_reapplied_drops_separator", {"M105"})
def template_reapplied_drops_separator(ctx: _Ctx) -> list[str]:
    """The trainer re-applied the chat template, which drops a separator before a later turn:
    its sequence no longer extends the context the engine sampled from."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2, "trajectory with two turns")
    first = _policy_positions(t, turn=1)[0]
    _drop_token(t, first - 1)  # the template token just before turn 1's action
    # context_length / context_sha256 keep what the engine saw: that is the point
    return [t["trajectory_id"]]


@fault("turn_separator_dropped", {"M107"})
def turn_separator_dropped(ctx: _Ctx) -> list[str]:
    """The sequence was built turn by turn with each tool turn rendered alone: the separator the chat template writes after every earlier action is missing."""
    from .synth import context_sha256

    t = ctx.pick(lambda t: len(t["turns"]) >= 2, "trajectory with two turns")
    ends = [_policy_positions(t, turn=k)[-1] for k in range(len(t["turns"]))]
    for k, tr in enumerate(t["turns"]):
        pos = _policy_positions(t, turn=k)[0]
        render = list(t["token_ids"][:pos])
        for e in reversed(ends[:k]):  # the template's separator after each earlier action
            render.insert(e + 1, SEPARATOR)
        tr["template_context_length"] = len(render)
        tr["template_context_sha256"] = context_sha256(render, len(render))
    return [t["trajectory_id"]]


@fault("retokenized_from_text", {"M106", "M105"})
def retokenized_from_text(ctx: _Ctx) -> list[str]:
    """The trainer re-tokenized the action text: turn 0's policy tokens differ from the ids the
    engine sampled (the behaviour log-probs now belong to other tokens)."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2, "trajectory with two turns")
    for i in _policy_positions(t, turn=0):
        t["token_ids"][i] += 1
    return [t["trajectory_id"]]


# ---------------------------------------------------------------- log-probabilities


@fault("positive_logprob", {"L201"})
def positive_logprob(ctx: _Ctx) -> list[str]:
    """A log-prob was logged as a probability-like positive number; the turn sum follows it."""
    t = ctx.pick()
    i = _policy_positions(t)[0]
    t["behavior_logprobs"][i] = 0.25
    k = t["token_turn"][i]
    t["turns"][k]["logprob"] = float(sum(t["behavior_logprobs"][j] for j in _policy_positions(t, k)))
    return [t["trajectory_id"]]


@fault("turn_logprob_from_base_softmax", {"L202"})
def turn_logprob_from_base_softmax(ctx: _Ctx) -> list[str]:
    """The per-turn log-prob was taken from the base softmax (temperature 1) while tokens
    were sampled at another temperature: it no longer equals the sum of the token log-probs.

    Scaling by 0.7 moves a log-prob by 0.3·|logprob|; the fault picks a turn where that is at
    least 10× L202's default tolerance (logprob_atol 1e-3), so a near-certain turn (log-prob
    −0.002) never hides it."""
    big = 10 * Config().logprob_atol / 0.3

    def turns(t: dict) -> list[dict]:
        return [tr for tr in t["turns"] if tr.get("logprob") is not None and abs(tr["logprob"]) >= big]

    t = ctx.pick(lambda t: bool(turns(t)), f"turn with a recorded log-prob of magnitude >= {big:.3g}")
    tr = turns(t)[0]
    tr["logprob"] = tr["logprob"] * 0.7
    return [t["trajectory_id"]]


@fault("logprob_on_template_tokens", {"L203"})
def logprob_on_template_tokens(ctx: _Ctx) -> list[str]:
    """The engine's prompt log-probs were stored for controller-inserted template tokens."""
    t = ctx.pick()
    for i, s in enumerate(t["token_source"]):
        if s == 4:
            t["behavior_logprobs"][i] = -0.01
    return [t["trajectory_id"]]


@fault("placeholder_logprob_on_eos", {"L208"})
def placeholder_logprob_on_eos(ctx: _Ctx) -> list[str]:
    """A trained end-of-turn token carries the framework's 0.0 placeholder log-prob (top_p 1).

    The token was appended after sampling and trained on, in a turn sampled over the full
    vocabulary; the turn's log-prob sum follows it."""
    t = ctx.pick(lambda t: t["loss_mask"][_policy_positions(t)[-1]], "trajectory with a trained last policy token")
    i = _policy_positions(t)[-1]
    k = t["token_turn"][i]
    t["behavior_logprobs"][i] = 0.0
    t["turns"][k]["top_p"] = 1.0
    t["turns"][k]["logprob"] = float(sum(t["behavior_logprobs"][j] for j in _policy_positions(t, k)))
    return [t["trajectory_id"]]


@fault("decoding_params_dropped", {"L204"})
def decoding_params_dropped(ctx: _Ctx) -> list[str]:
    """The collector did not record the temperature of a turn."""
    t = ctx.pick()
    t["turns"][0]["temperature"] = None
    return [t["trajectory_id"]]


# ---------------------------------------------------------------- termination


@fault("two_stop_flags", {"T301", "R405"})
def two_stop_flags(ctx: _Ctx) -> list[str]:
    """A truncated episode is also marked terminated.

    Its last state now counts as terminal while it carries the non-zero potential of a
    non-terminal state, so R405 fires with T301.
    """
    t = ctx.pick(lambda t: t["truncated"], "truncated trajectory")
    t["terminated"] = True
    return [t["trajectory_id"]]


@fault("stop_reason_contradicts_flag", {"T302"})
def stop_reason_contradicts_flag(ctx: _Ctx) -> list[str]:
    """A terminated episode carries the collector's stop reason max_turns."""
    t = ctx.pick(lambda t: t["terminated"] and t["stop_reason"] == "failure", "terminated failure")
    t["stop_reason"] = "max_turns"
    return [t["trajectory_id"]]


@fault("engine_crash_scored_zero", {"T303", "U606", "U608"})
def engine_crash_scored_zero(ctx: _Ctx) -> list[str]:
    """An engine crash was scored 0 and trained on, masquerading as a task failure; its 0 also
    entered its group's statistics."""
    _evidence(ctx)
    t = ctx.pick(
        lambda t: t["trajectory_id"] in ctx.used() and t["reward"] == 0.0 and not t["verifier_success"],
        "failed trajectory used in an update",
    )
    t.update(terminated=False, infra_error=True, stop_reason="engine_error")
    return [t["trajectory_id"]]


@fault("truncation_scored_as_failure", {"T304"})
def truncation_scored_as_failure(ctx: _Ctx) -> list[str]:
    """A collector-truncated episode was given reward 0 instead of being excluded."""
    t = ctx.pick(lambda t: t["truncated"], "truncated trajectory")
    t["reward"] = 0.0
    return [t["trajectory_id"]]


@fault("length_cap_logged_as_success", {"T305"})
def length_cap_logged_as_success(ctx: _Ctx) -> list[str]:
    """The last generation hit the length cap but the episode is recorded as terminated."""
    t = ctx.pick(lambda t: t["terminated"])
    t["turns"][-1]["finish_reason"] = "length"
    return [t["trajectory_id"]]


@fault("budget_cut_logged_as_terminated", {"T306"}, config={"max_response_tokens": 40})
def budget_cut_logged_as_terminated(ctx: _Ctx) -> list[str]:
    """The collector's response budget was 40 tokens; the episodes that filled it were cut but are recorded as terminated."""
    # the records are what such a collector writes (OpenRLHF's multi-turn agent never sets
    # truncated): the fault is the budget they were collected under, stated in the configuration
    cut = [t["trajectory_id"] for t in ctx.trajs if t["terminated"] and sum(x >= 0 for x in t["token_turn"]) >= 40]
    if not cut:
        raise ValueError("the log has no terminated trajectory of 40 response tokens this fault can break")
    return cut


# ---------------------------------------------------------------- reward and credit


@fault("reward_components_mismatch", {"R401"})
def reward_components_mismatch(ctx: _Ctx) -> list[str]:
    """A format bonus was logged as a component but never added to the turn reward."""
    t = ctx.pick()
    tr = t["turns"][-1]
    tr["reward_components"] = list(tr["reward_components"] or []) + [("format", 0.1)]
    return [t["trajectory_id"]]


@fault("progress_bonus_not_potential", {"R402", "R404"})
def progress_bonus_not_potential(ctx: _Ctx) -> list[str]:
    """A "+0.1 per useful step" bonus was added to the shaping term (farmable in a loop).

    Returns and TD residuals are computed with the bonus, consistently; only the potential
    form and the telescoping identity expose it.
    """
    t = ctx.pick(lambda t: len(t["turns"]) >= 2)
    for tr in t["turns"]:
        tr["shaping"] = tr["shaping"] + 0.1
    _rederive_returns(t)
    return [t["trajectory_id"]]


@fault("potential_chain_broken", {"R403", "R404"})
def potential_chain_broken(ctx: _Ctx) -> list[str]:
    """The potential was recomputed from the observation at each turn, not carried from the
    previous transition: Φ(s_{t+1}) of turn t differs from Φ(s_t) of turn t+1."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2)
    g = t.get("gamma") or 1.0
    tr = t["turns"][1]
    tr["potential_before"] = tr["potential_before"] + 0.3
    tr["shaping"] = g * tr["potential_after"] - tr["potential_before"]
    _rederive_returns(t)
    return [t["trajectory_id"]]


@fault("terminal_potential_nonzero", {"R405"})
def terminal_potential_nonzero(ctx: _Ctx) -> list[str]:
    """The potential of the terminal state was left at its last value instead of 0."""
    t = ctx.pick(lambda t: t["terminated"])
    g = t.get("gamma") or 1.0
    tr = t["turns"][-1]
    tr["potential_after"] = 0.5
    tr["shaping"] = g * 0.5 - tr["potential_before"]
    _rederive_returns(t)
    return [t["trajectory_id"]]


@fault("td_terminal_value_zeroed", {"R406"})
def td_terminal_value_zeroed(ctx: _Ctx) -> list[str]:
    """The critic zeroed the value after a truncated episode's last turn (premature zeroing):
    δ_{T-1} ignores the recorded V(h_T) = final_value."""
    t = ctx.pick(lambda t: t["truncated"] and (t["final_value"] or 0) > 0.01, "truncated trajectory")
    tr = t["turns"][-1]
    tr["td_residual"] = tr["reward"] + tr["shaping"] - tr["value"]
    return [t["trajectory_id"]]


@fault("return_without_shaping", {"R407"})
def return_without_shaping(ctx: _Ctx) -> list[str]:
    """discounted_return logged from environment rewards only, without the shaping terms."""

    def shaped(t: dict) -> float:  # Σγ^t F_t: zero when Φ(s_0) = Φ(s_T) = 0, and then the bug is invisible
        g = t.get("gamma") or 1.0
        return sum(g**i * tr["shaping"] for i, tr in enumerate(t["turns"]))

    t = ctx.pick(lambda t: abs(shaped(t)) > 1e-3, "trajectory whose shaping does not cancel")
    g = t.get("gamma") or 1.0
    t["discounted_return"] = sum(g**i * tr["reward"] for i, tr in enumerate(t["turns"]))
    return [t["trajectory_id"]]


@fault(
    "first_visit_paid_twice",
    {"R408"},
    config={"first_visit_components": ["key_found"]},
    declares={"key_found": "first_visit"},
)
def first_visit_paid_twice(ctx: _Ctx) -> list[str]:
    """A first-visit milestone (key found) was paid on two turns: farmable by repetition.

    The producer declares key_found first-visit in its file metadata (`declares`); an audit of
    the records alone gets the same from configuration (`config`)."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2 and t["reward"] is None, "excluded trajectory with two turns")
    for tr in t["turns"][:2]:
        comps = dict(tr["reward_components"] or [])
        comps["key_found"] = 0.2
        tr["reward_components"] = list(comps.items())
        tr["reward"] = float(sum(comps.values()))
    _rederive_returns(t)
    return [t["trajectory_id"]]


@fault("action_loop", {"R409"})
def action_loop(ctx: _Ctx) -> list[str]:
    """The agent repeated the same tool call four times in a row (a loop a bonus could farm)."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 4, "trajectory with four turns")
    for tr in t["turns"][:4]:
        tr["parsed_action"] = json.dumps({"action": "inspect"})
    return [t["trajectory_id"]]


@fault("verifier_inverted", {"R410"})
def verifier_inverted(ctx: _Ctx) -> list[str]:
    """The reward was computed from the agent's claim, not the world state: within a task a
    verified success scores below a verified failure."""

    def ok(task):
        ts = [t for t in ctx.trajs if t["task_id"] == task and t["reward"] is not None]
        return any(t["verifier_success"] for t in ts) and any(not t["verifier_success"] for t in ts)

    s = ctx.pick(lambda t: t["verifier_success"] and t["reward"] is not None and ok(t["task_id"]), "mixed task")
    f = ctx.pick(lambda t: t["task_id"] == s["task_id"] and t["reward"] is not None and not t["verifier_success"])
    s["verifier_success"], f["verifier_success"] = False, True
    return [s["trajectory_id"], f["trajectory_id"]]


# ---------------------------------------------------------------- policy versions


@fault("policy_version_missing", {"P501"})
def policy_version_missing(ctx: _Ctx) -> list[str]:
    """A turn was sampled by a worker that did not report its weight version."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2)
    t["turns"][-1]["policy_version"] = None
    return [t["trajectory_id"]]


@fault("policy_version_decreasing", {"P502"})
def policy_version_decreasing(ctx: _Ctx) -> list[str]:
    """Versions go backwards inside an episode (a turn routed to a replica one version ahead,
    the next one back to a stale one)."""
    t = ctx.pick(
        lambda t: len(t["turns"]) >= 2 and t["trajectory_id"] not in ctx.used(), "excluded trajectory with two turns"
    )
    t["turns"][0]["policy_version"] = t["turns"][0]["policy_version"] + 1
    return [t["trajectory_id"]]


@fault("stale_batch_beyond_lag", {"P503"})
def stale_batch_beyond_lag(ctx: _Ctx) -> list[str]:
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


# ---------------------------------------------------------------- updates and reduction


@fault("denominator_batch_size_for_token_reduction", {"U601"})
def denominator_batch_size_for_token_reduction(ctx: _Ctx) -> list[str]:
    """The update declares token reduction but divides by the number of trajectories."""
    u = ctx.updates[0]
    u["loss_denominator"] = float(len(u["trajectory_ids"]))
    return []


@fault("loss_over_whole_transcript", {"U601", "U602"})
def loss_over_whole_transcript(ctx: _Ctx) -> list[str]:
    """The loss was divided by the whole transcript length (system, user, tool and template
    tokens included), diluting every policy token's gradient."""
    u = ctx.updates[0]
    u["loss_denominator"] = float(sum(len(ctx.by_id[i]["token_ids"]) for i in u["trajectory_ids"]))
    return []


@fault("advantages_population_std", {"U603"})
def advantages_population_std(ctx: _Ctx) -> list[str]:
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


@fault("advantages_on_degenerate_group", {"U603", "U604"})
def advantages_on_degenerate_group(ctx: _Ctx) -> list[str]:
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


@fault("update_names_missing_trajectory", {"U605"})
def update_names_missing_trajectory(ctx: _Ctx) -> list[str]:
    """An update names a trajectory whose shard never reached the log."""
    _append_member(ctx.updates[-1], "ghost-000", 0)
    return ["ghost-000"]


@fault("excluded_trajectory_trained", {"U606"})
def excluded_trajectory_trained(ctx: _Ctx) -> list[str]:
    """A truncated episode that the exclude policy keeps out of training entered an update."""
    t = ctx.pick(lambda t: t["reward"] is None and t["truncated"], "excluded trajectory")
    v = t["turns"][0]["policy_version"]
    u = next((u for u in ctx.updates if u["trainer_version"] == v), ctx.updates[0])
    _append_member(u, t["trajectory_id"], _trainable(t))
    _sync_denominator(ctx, t["trajectory_id"])
    return [t["trajectory_id"]]


# ---------------------------------------------------------------- environment contract


@fault("environment_version_missing", {"E801"})
def environment_version_missing(ctx: _Ctx) -> list[str]:
    """The collector did not record which environment image produced the episode."""
    t = ctx.pick()
    t["environment_version"] = None
    return [t["trajectory_id"]]


@fault("reset_not_reproducible", {"E802"})
def reset_not_reproducible(ctx: _Ctx) -> list[str]:
    """Two resets with the same seed produced different initial states (shared mutable state
    between rollouts)."""
    t = ctx.pick(lambda t: sum(o["reset_seed"] == t["reset_seed"] for o in ctx.trajs) > 1, "reset seed used twice")
    t["initial_state_checksum"] = "f" * 16
    return [t["trajectory_id"]]


# ---------------------------------------------------------------- what the loss was built from (contract 1.2)


def _evidence(ctx: _Ctx) -> None:
    """Record the 1.2 loss evidence a compliant trainer would write, where the log lacks it."""
    from .synth import record_loss_evidence

    record_loss_evidence(ctx.trajs, ctx.updates)


@fault("masked_tokens_in_numerator", {"U607"})
def masked_tokens_in_numerator(ctx: _Ctx) -> list[str]:
    """The token-mean loss sums every token's loss but divides by the masked count: prompt,
    template and tool tokens enter the numerator (alibaba/ROLL#444)."""
    _evidence(ctx)
    u = next((u for u in ctx.updates if u["trajectory_ids"]), None)
    if u is None:
        raise ValueError("the log has no update with a batch this fault can break")
    k = ctx.rng.randrange(len(u["trajectory_ids"]))
    tid = u["trajectory_ids"][k]
    u["numerator_tokens"][k] = len(ctx.by_id[tid]["token_ids"])
    return [tid]


def _returns_over_every_token(t: dict) -> None:
    """The return recursion of a trainer that runs it over every position, masked or not."""
    acc, ret = 0.0, [0.0] * len(t["token_ids"])
    for i in reversed(range(len(ret))):
        acc += t["token_reward"][i] - t["token_kl"][i]
        ret[i] = acc
    t["token_returns"] = ret


PAD = 0  # the padding id of a right-padded batch


@fault("reward_on_padding_token", {"R411", "R413"})
def reward_on_padding_token(ctx: _Ctx) -> list[str]:
    """The PPO score is written at the first token after the end-of-sequence token (the first
    padding position of the right-padded batch) instead of on the last sampled token, and the
    returns carry it from there (huggingface/trl#3750)."""
    _evidence(ctx)
    t = ctx.pick(lambda t: bool(t.get("reward")) and bool(_policy_positions(t)), "rewarded trajectory with an action")
    i = _policy_positions(t)[-1] + 1
    if i == len(t["token_ids"]):  # the sequence ends on its last action: the batch pads it
        pad: dict[str, object] = {"token_ids": PAD, "token_source": 4, "loss_mask": False, "behavior_logprobs": None}
        pad |= {"token_turn": t["token_turn"][-1], "token_reward": 0.0, "token_kl": 0.0, "token_returns": 0.0}
        for c, v in pad.items():
            t[c].append(v)
    t["token_reward"] = [0.0] * len(t["token_ids"])
    t["token_reward"][i] = float(t["reward"])
    _returns_over_every_token(t)
    return [t["trajectory_id"]]


@fault("kl_accumulated_over_tool_tokens", {"R412", "R413"})
def kl_accumulated_over_tool_tokens(ctx: _Ctx) -> list[str]:
    """The KL penalty is computed on every token, tool observations included, and the return
    recursion runs over every position, so the observations' KL flows into the returns of the
    actions before them (THUDM/slime#1370)."""
    _evidence(ctx)
    t = ctx.pick(lambda t: 3 in t["token_source"] and 2 in t["token_source"], "trajectory with a tool observation")
    t["token_kl"] = [v if s == 2 else 0.02 for s, v in zip(t["token_source"], t["token_kl"])]
    _returns_over_every_token(t)
    return [t["trajectory_id"]]


@fault("rejected_in_group_statistics", {"U608", "U603"})
def rejected_in_group_statistics(ctx: _Ctx) -> list[str]:
    """A rejected episode (reward null: truncated under exclude, or an infrastructure failure)
    is dropped from the batch, but its reward, filled with 0, still enters its group's GRPO
    mean and std, shifting every trained member's advantage (verl-project/verl#6452)."""
    _evidence(ctx)
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
    raise ValueError("the log has no excluded episode whose group is trained with GRPO advantages")


@fault("truncation_paid_as_success", {"T307"}, config={"truncation": "penalize"})
def truncation_paid_as_success(ctx: _Ctx) -> list[str]:
    """Under truncation = penalize, an episode cut at the generation limit is paid the success
    reward: the environment scored the partial transcript (SkyRL at max_generate_length)."""
    done = [o for o in ctx.trajs if o["terminated"] and o["reward"] is not None]
    success = max((o["reward"] for o in done if o["stop_reason"] == "success"), default=None)
    failure: dict[str, float] = {}
    for o in done:
        if o["stop_reason"] == "failure":
            failure[o["task_id"]] = max(failure.get(o["task_id"], o["reward"]), o["reward"])

    def pays_more(t: dict) -> bool:
        return t["truncated"] and success is not None and t["task_id"] in failure and success > failure[t["task_id"]]

    t = ctx.pick(pays_more, "truncated episode of a task with a failure, in a log with a success")
    t["reward"] = float(success)  # type: ignore[arg-type]
    return [t["trajectory_id"]]


# ---------------------------------------------------------------- API


def apply(name: str, trajs: list[dict], updates: list[dict], seed: int = 0) -> tuple[Records, list[str]]:
    """Apply fault `name` to a deep copy of (trajs, updates): ((trajs, updates), touched ids)."""
    if name not in FAULTS:
        raise KeyError(f"unknown fault {name!r}; see `rollout-audit faults --list`")
    ctx = _Ctx(copy.deepcopy(trajs), copy.deepcopy(updates), seed)
    touched = FAULTS[name].func(ctx)
    return (ctx.trajs, ctx.updates), touched


def read_records(path) -> Records:
    """Every trajectory and update record of a log, as dicts (for small logs: fixtures, tests)."""
    import pyarrow.parquet as pq

    from .reading.io import discover

    disc = discover([path])
    if disc.broken:
        raise ValueError(f"cannot read {disc.broken[0][0]}: {disc.broken[0][1]}")
    out = []
    for kind in ("trajectories", "updates"):
        rows: list[dict] = []
        for f in disc.of_kind(kind):
            rows += pq.read_table(f.path).to_pylist()
        out.append(rows)
    return out[0], out[1]


def declared_components(path) -> dict[str, str]:
    """The reward components the trajectory files under `path` declare (file metadata)."""
    from .contract import schema as S
    from .reading.io import discover

    out: dict[str, str] = {}
    for f in discover([path]).of_kind("trajectories"):
        out.update(S.reward_components(f.schema.metadata))
    return out


def write_records(
    dst,
    trajs: list[dict],
    updates: list[dict],
    *,
    parts: int = 1,
    corrupt: bool = False,
    tokenizer=None,
    reward_components: dict[str, str] | None = None,
) -> None:
    """Write records as a log under `dst` (trajectories/…, updates/…), without validation so
    that broken records reach the file; `corrupt` truncates the first shard's footer; `tokenizer`
    and `reward_components` are the producer's declarations written into each trajectory file."""
    from pathlib import Path

    from .writer import RolloutWriter

    dst = Path(dst)
    size = -(-len(trajs) // parts)
    for i in range(parts):
        chunk = trajs[i * size : (i + 1) * size]
        if chunk:
            sub = dst / "trajectories" / (f"step={i}" if parts > 1 else "")
            with RolloutWriter(
                sub / f"part-{i:04d}.parquet", validate=False, tokenizer=tokenizer, reward_components=reward_components
            ) as w:
                w.write(chunk)
    if updates:
        with RolloutWriter(dst / "updates" / "updates.parquet", kind="updates", validate=False) as w:
            w.write(updates)
    if corrupt:
        shard = sorted((dst / "trajectories").rglob("*.parquet"))[0]
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2])


@dataclass
class MatrixRow:
    """What the audit found for one fault."""

    fault: str
    expected: frozenset[str]
    found: frozenset[str]  # error and warning codes found
    touched: list[str]
    named: bool  # every touched trajectory is named by an expected finding

    @property
    def missed(self) -> frozenset[str]:
        return self.expected - self.found

    @property
    def unexpected(self) -> frozenset[str]:
        return self.found - self.expected

    @property
    def ok(self) -> bool:
        return not self.missed and not self.unexpected and self.named


def detect(name: str, trajs: list[dict], updates: list[dict], workdir, *, seed: int = 0, parts: int = 1) -> MatrixRow:
    """Apply one fault, write the broken log under `workdir`, audit it, compare codes."""
    import polars as pl

    from .running.engine import audit

    f = FAULTS[name]
    (bt, bu), touched = apply(name, trajs, updates, seed)
    out = f"{workdir}/{name}"
    write_records(out, bt, bu, parts=parts, corrupt=f.file_level, reward_components=f.declares)
    rep = audit(out, config=Config.from_mapping(f.config))
    serious = rep.findings.filter(pl.col("severity").is_in(["error", "warning"]))
    found = frozenset(serious["code"].to_list())
    hit = set(serious.filter(pl.col("code").is_in(list(f.codes)))["trajectory_id"].drop_nulls().to_list())
    return MatrixRow(name, f.codes, found, touched, set(touched) <= hit)


def render_matrix(rows: list[MatrixRow]) -> str:
    """A Markdown table: fault, expected codes, found codes, caught, false positives."""
    lines = [
        "| fault | expected | found (error/warning) | caught | trajectories named | false positives |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.fault} | {', '.join(sorted(r.expected))} | {', '.join(sorted(r.found)) or '-'} | "
            f"{'yes' if not r.missed else 'MISSED ' + ', '.join(sorted(r.missed))} | "
            f"{'yes' if r.named else 'no'} | {', '.join(sorted(r.unexpected)) or '-'} |"
        )
    caught = sum(not r.missed for r in rows)
    fp = sum(bool(r.unexpected) for r in rows)
    lines.append(f"\n{caught}/{len(rows)} faults caught, {fp} with false positives")
    return "\n".join(lines)
