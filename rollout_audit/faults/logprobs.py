"""Faults the log-probabilities checks (L) must catch."""

from __future__ import annotations

import math

from ..contract.config import Config
from .base import Ctx, NoTarget, fault, policy_positions


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


def record_nucleus(t: dict, shift: int = 0) -> None:
    """The engine's nucleus record of a trajectory sampled at top_p 0.9 (contract 1.3 nucleus_ids,
    nucleus_offsets): each policy token's kept ids, the sampled id first and two others; the spans
    sit `shift` positions earlier than the tokens they were sampled for (0: aligned)."""
    n = len(t["token_ids"])
    spans: list[list[int]] = [[] for _ in range(n)]
    for i in policy_positions(t):
        if 0 <= i - shift < n:
            spans[i - shift] = [t["token_ids"][i], t["token_ids"][i] + 7, t["token_ids"][i] + 13]
    t["nucleus_ids"] = [k for s in spans for k in s]
    t["nucleus_offsets"] = [0]
    for s in spans:
        t["nucleus_offsets"].append(t["nucleus_offsets"][-1] + len(s))
    for tr in t["turns"]:
        tr["top_p"] = 0.9


@fault("nucleus_shifted_one", {"L210"})
def nucleus_shifted_one(ctx: Ctx) -> list[str]:
    """The recorded nucleus is aligned with the logits rows instead of the tokens: the kept ids of
    the token at position p sit at p − 1 (the row whose logits predict it), so sampled tokens lie
    outside the support recorded for them (the token before each sampled one is judged against
    the sampled one's nucleus), and a trainer that masks its logits to the recorded
    ids gives them probability zero."""

    def distinct(t: dict) -> bool:
        ids = t["token_ids"]
        return any(i >= 1 and ids[i - 1] - ids[i] not in (0, 7, 13) for i in policy_positions(t))

    t = ctx.pick(distinct, "trajectory whose policy tokens differ from the tokens before them")
    record_nucleus(t, shift=1)
    return [t["trajectory_id"]]


TRAINER_LOGPROBS = "trainer_logprobs"  # the second per-token log-prob column the fault's trainer writes
TOP_P = 0.95  # the sampler's nucleus in the fault


@fault("top_p_against_full_vocab_trainer", {"L211"}, config={"compare_logprobs": TRAINER_LOGPROBS})
def top_p_against_full_vocab_trainer(ctx: Ctx) -> list[str]:
    """Half of the groups were sampled at top-p 0.95 and their engine returned log-probs renormalised
    over each token's nucleus, while the trainer recomputes them over the full vocabulary
    (`trainer_logprobs`, named in `compare_logprobs`): every such token is scored lower by the trainer
    by log(mass) of its nucleus (0.95 to 0.99 of the probability, or the token's own probability when
    it fills the nucleus alone), at most 0.05 nats a token, so no turn's ratio is extreme (L207) but
    every one leans the same way (PrimeIntellect-ai/prime-rl#2600).

    The other groups' trainer reproduces the engine's log-probs. The turn log-probs follow the
    renormalised tokens."""
    import numpy as np

    groups = sorted({t["group_id"] for t in ctx.trajs})
    chosen = set(ctx.rng.sample(groups, max(1, len(groups) // 2)))
    touched = []
    for t in ctx.trajs:
        full = list(t["behavior_logprobs"])
        t[TRAINER_LOGPROBS] = full
        if t["group_id"] not in chosen:
            continue
        lps = list(full)
        for i in policy_positions(t):
            lp = full[i]
            if lp is None:
                continue
            mass = max(math.exp(lp), TOP_P + 0.04 * ctx.rng.random())  # the nucleus holds the sampled token
            lps[i] = float(np.float32(min(lp - math.log(mass), 0.0)))  # as the engine's float32 entry
        t["behavior_logprobs"] = lps
        for k, tr in enumerate(t["turns"]):
            tr["top_p"] = TOP_P
            if tr.get("logprob") is not None:
                tr["logprob"] = float(sum(lps[j] for j in policy_positions(t, k) if lps[j] is not None))
        touched.append(t["trajectory_id"])
    return touched


@fault("trainer_temperature_not_the_samplers", {"L212"}, config={"trainer_temperature": 0.7})
def trainer_temperature_not_the_samplers(ctx: Ctx) -> list[str]:
    """The trainer records its sampler at temperature 0.7 and recomputes log-probs there, while a
    proxy between the agents and the engine replaced every request's temperature with its own
    (agent-lightning's `default_proxy.train.temperature` against verl's
    `actor_rollout_ref.rollout.temperature`): every turn ran at the log's own temperature, so every
    trajectory's importance ratios compare two distributions. The records are the compliant run's;
    the trainer's setting is the bug."""
    if any(tr.get("temperature") in (None, 0.7) for t in ctx.trajs for tr in t["turns"]):
        raise NoTarget("a log whose every turn records a temperature other than 0.7")
    return [t["trajectory_id"] for t in ctx.trajs]
