"""Faults the log-probabilities checks (L) must catch."""

from __future__ import annotations

from ..contract.config import Config
from .base import Ctx, fault, policy_positions


@fault("positive_logprob", {"L201"}, group="tokens-2")
def positive_logprob(ctx: Ctx) -> list[str]:
    """A log-prob was logged as a probability-like positive number; the turn sum follows it."""
    t = ctx.pick()
    i = policy_positions(t)[0]
    t["behavior_logprobs"][i] = 0.25
    k = t["token_turn"][i]
    t["turns"][k]["logprob"] = float(sum(t["behavior_logprobs"][j] for j in policy_positions(t, k)))
    return [t["trajectory_id"]]


@fault("turn_logprob_from_base_softmax", {"L202"}, group="tokens-1")
def turn_logprob_from_base_softmax(ctx: Ctx) -> list[str]:
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


@fault("logprob_on_template_tokens", {"L203"}, group="tokens-1")
def logprob_on_template_tokens(ctx: Ctx) -> list[str]:
    """The engine's prompt log-probs were stored for controller-inserted template tokens."""
    t = ctx.pick()
    for i, s in enumerate(t["token_source"]):
        if s == 4:
            t["behavior_logprobs"][i] = -0.01
    return [t["trajectory_id"]]


@fault("placeholder_logprob_on_eos", {"L208"}, group="tokens-2")
def placeholder_logprob_on_eos(ctx: Ctx) -> list[str]:
    """A trained end-of-turn token carries the framework's 0.0 placeholder log-prob (top_p 1).

    The token was appended after sampling and trained on, in a turn sampled over the full
    vocabulary; the turn's log-prob sum follows it."""
    t = ctx.pick(lambda t: t["loss_mask"][policy_positions(t)[-1]], "trajectory with a trained last policy token")
    i = policy_positions(t)[-1]
    k = t["token_turn"][i]
    t["behavior_logprobs"][i] = 0.0
    t["turns"][k]["top_p"] = 1.0
    t["turns"][k]["logprob"] = float(sum(t["behavior_logprobs"][j] for j in policy_positions(t, k)))
    return [t["trajectory_id"]]


@fault("decoding_params_dropped", {"L204"}, group="tokens-2")
def decoding_params_dropped(ctx: Ctx) -> list[str]:
    """The collector did not record the temperature of a turn."""
    t = ctx.pick()
    t["turns"][0]["temperature"] = None
    return [t["trajectory_id"]]
