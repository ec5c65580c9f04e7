"""Faults the masks and provenance checks (M) must catch."""

from __future__ import annotations

from ..contract.digests import NEMO_GYM_TOKENS, nemo_gym_entry
from .base import (
    SEPARATOR,
    Ctx,
    NoTarget,
    drop_token,
    fault,
    n_trainable,
    policy_positions,
    replace_token,
    sync_denominator,
    template_follows,
)


@fault("tool_tokens_trained", {"M101"}, group="tokens-2")
def tool_tokens_trained(ctx: Ctx) -> list[str]:
    """Tool output trained on: the mask follows the assistant role, which includes the tool reply.

    The pipeline counts those tokens as trainable everywhere (num_trainable_tokens, loss
    denominator), so only the provenance check can catch it.
    """
    t = ctx.pick(lambda t: t["trajectory_id"] in ctx.used())
    for i, s in enumerate(t["token_source"]):
        if s == 3:
            t["loss_mask"][i] = True
    t["num_trainable_tokens"] = n_trainable(t)
    sync_denominator(ctx, t["trajectory_id"])
    return [t["trajectory_id"]]


@fault("policy_tokens_unmasked", {"M102"}, group="tokens-2")
def policy_tokens_unmasked(ctx: Ctx) -> list[str]:
    """A turn's sampled tokens were left out of the loss (mask built from the wrong span)."""
    t = ctx.pick(lambda t: t["trajectory_id"] in ctx.used())
    for i in policy_positions(t, turn=0):
        t["loss_mask"][i] = False
    t["num_trainable_tokens"] = n_trainable(t)
    sync_denominator(ctx, t["trajectory_id"])
    return [t["trajectory_id"]]


@fault("trainable_count_whole_transcript", {"M103"}, group="tokens-2")
def trainable_count_whole_transcript(ctx: Ctx) -> list[str]:
    """num_trainable_tokens logged as the transcript length instead of the mask sum."""
    t = ctx.pick()
    t["num_trainable_tokens"] = len(t["token_ids"])
    return [t["trajectory_id"]]


@fault("turn_policy_count_off_by_one", {"M104"}, group="tokens-1")
def turn_policy_count_off_by_one(ctx: Ctx) -> list[str]:
    """The per-turn policy token count includes the end-of-turn marker."""
    t = ctx.pick()
    t["turns"][-1]["num_policy_tokens"] += 1
    return [t["trajectory_id"]]


@fault("template_reapplied_drops_separator", {"M105"}, group="tokens-2")
def template_reapplied_drops_separator(ctx: Ctx) -> list[str]:
    """The trainer re-applied the chat template, which drops a separator before a later turn:
    its sequence no longer extends the context the engine sampled from."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2, "trajectory with two turns")
    first = policy_positions(t, turn=1)[0]
    drop_token(t, first - 1)  # the template token just before turn 1's action
    template_follows(t)  # the re-applied template is the trainer's own: its render is the new sequence
    # context_length / context_sha256 keep what the engine saw: that is the point
    return [t["trajectory_id"]]


@fault("turn_separator_dropped", {"M107"}, group="tokens-1")
def turn_separator_dropped(ctx: Ctx) -> list[str]:
    """The sequence was built turn by turn with each tool turn rendered alone: the separator the chat template writes after every earlier action is missing."""
    from ..contract.schema import context_sha256

    t = ctx.pick(lambda t: len(t["turns"]) >= 2, "trajectory with two turns")
    ends = [policy_positions(t, turn=k)[-1] for k in range(len(t["turns"]))]
    for k, tr in enumerate(t["turns"]):
        pos = policy_positions(t, turn=k)[0]
        render = list(t["token_ids"][:pos])
        for e in reversed(ends[:k]):  # the template's separator after each earlier action
            render.insert(e + 1, SEPARATOR)
        tr["template_context_length"] = len(render)
        tr["template_context_sha256"] = context_sha256(render, len(render))
    return [t["trajectory_id"]]


@fault("retokenized_from_text", {"M106", "M105"}, group="tokens-1")
def retokenized_from_text(ctx: Ctx) -> list[str]:
    """The trainer re-tokenized the action text: turn 0's policy tokens differ from the ids the
    engine sampled (the behaviour log-probs now belong to other tokens)."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2, "trajectory with two turns")
    for i in policy_positions(t, turn=0):
        replace_token(t, i, t["token_ids"][i] + 1)
    template_follows(t)  # the template tokenizes the text as the trainer did
    return [t["trajectory_id"]]


@fault("retokenization_split", {"M108"}, group="splits")
def retokenization_split(ctx: Ctx) -> list[str]:
    """Retokenization drift: the agent loop sent the conversation back as text, the server tokenized
    an earlier action differently, and the trainer started a new sequence at the second turn (this
    trajectory, the segment it starts; the episode's outcome on it, once)."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2, "trajectory with two turns")
    at = policy_positions(t, turn=0)[0]
    t["split_from"] = t["trajectory_id"] + "@episode"
    t["split_continues"] = False
    t["split_position"] = at
    t["split_sequence_id"] = t["token_ids"][at] + 1  # the id the earlier segment had sampled there
    t["split_context_id"] = t["token_ids"][at]
    return [t["trajectory_id"]]


@fault("masked_truncation_not_applied", {"M109"}, group="splits")
def masked_truncation_not_applied(ctx: Ctx) -> list[str]:
    """A truncated completion is declared excluded from the loss (TRL mask_truncated_completions)
    but its mask was never zeroed: its tokens are trained with a reward that was kept only for the
    group statistics."""
    t = ctx.pick(lambda t: any(t["loss_mask"]), "trajectory with trainable tokens")
    t["loss_excluded"] = True
    return [t["trajectory_id"]]


def echo_stream(ctx: Ctx) -> list[dict]:
    """prime-rl's echo, as a compliant trainer records it: the tool bodies of the trajectories
    in an update are trained on purpose in the echo stream (contract 1.3 loss_stream 1), counted
    with the trainable tokens, with weight 1 on every trained token."""
    out = []
    used = ctx.used()
    for t in ctx.trajs:
        if t["trajectory_id"] not in used or 3 not in t["token_source"]:
            continue
        t["loss_mask"] = [m or s == 3 for m, s in zip(t["loss_mask"], t["token_source"])]
        t["loss_stream"] = [1 if s == 3 else 0 for s in t["token_source"]]
        t["loss_weight"] = [1.0 if m else 0.0 for m in t["loss_mask"]]
        t["num_trainable_tokens"] = n_trainable(t)
        sync_denominator(ctx, t["trajectory_id"])
        out.append(t)
    if not out:
        raise NoTarget("the log has no trained trajectory with a tool reply")
    return out


@fault("echo_stream_takes_next_action", {"M110"})
def echo_stream_takes_next_action(ctx: Ctx) -> list[str]:
    """The echo stream's span was cut at the next message boundary instead of the tool body's
    end: the first action token after a tool reply is trained in the cross-entropy stream, with
    the environment's text, instead of in the policy-gradient loss."""

    def next_action(t: dict) -> int | None:
        tool = t["token_source"].index(3)
        return next((i for i in range(tool, len(t["token_source"])) if t["token_source"][i] == 2), None)

    cands = [t for t in echo_stream(ctx) if t["loss_mask"][next_action(t) or 0] and next_action(t) is not None]
    if not cands:
        raise NoTarget("the log has no trained action after a tool reply this fault can break")
    t = ctx.rng.choice(cands)
    t["loss_stream"][next_action(t)] = 1
    return [t["trajectory_id"]]


@fault("loss_weight_on_masked_token", {"M110"})
def loss_weight_on_masked_token(ctx: Ctx) -> list[str]:
    """Per-token loss weights built before the mask was edited: a tool token outside the loss
    keeps weight 1 and is trained anyway (a verifiers node's loss_weights)."""
    for t in ctx.trajs:
        t["loss_weight"] = [1.0 if m else 0.0 for m in t["loss_mask"]]
    t = ctx.pick(
        lambda t: t["trajectory_id"] in ctx.used() and 3 in t["token_source"], "trained trajectory with a tool reply"
    )
    t["loss_weight"][t["token_source"].index(3)] = 1.0
    return [t["trajectory_id"]]


@fault("control_token_id_replaced", {"M111"})
def control_token_id_replaced(ctx: Ctx) -> list[str]:
    """The server returned a wrong id for a control token it sampled (microsoft/agent-lightning#326:
    vLLM return_token_ids under streaming with a tool parser): the segment trains that id with the
    log-prob of the sampled one, and the next context, rendered from the text, has the sampled id,
    so the trainer split the episode there; the engine's log-prob entry names the sampled id.

    The replaced token opens the segment's last turn, so no later turn of this row holds it; the
    turn's returned ids (sampled_token_ids) carry the wrong id too, as the server returned them."""

    def target(t: dict) -> int | None:
        pos = policy_positions(t, turn=len(t["turns"]) - 1)
        ok = [i for i in pos if t["loss_mask"][i] and t["behavior_logprobs"][i] is not None]
        return ok[0] if ok else None

    t = ctx.pick(lambda t: bool(t["turns"]) and target(t) is not None, "trajectory with a trained last turn")
    at = target(t)
    assert at is not None
    sampled = t["token_ids"][at]
    replace_token(t, at, sampled + 1)
    tr = t["turns"][t["token_turn"][at]]
    if tr.get("sampled_token_ids"):
        tr["sampled_token_ids"][policy_positions(t, turn=t["token_turn"][at]).index(at)] = sampled + 1
    t["split_exposed_position"] = at
    t["split_exposed_logprob_id"] = sampled
    return [t["trajectory_id"]]


@fault("token_rewritten_after_capture", {"M112"})
def token_rewritten_after_capture(ctx: Ctx) -> list[str]:
    """A capture layer (NeMo Gym's token-id capture) stamped every engine call with its digest of the
    call's context and sampled ids when the call returned; afterwards one sampled id of a trajectory's
    last call was rewritten (a parser normalising a control token, a record edited in staging) in
    everything that carries it, the trainer's tokens and the turn's sampled ids alike, but not in the
    stamp. Only the stamp still holds the id the engine returned.

    The rewritten id is in the trajectory's last turn, so no later context holds it (M105 stays
    silent); the turn's sampled ids follow the tokens (M106 too)."""

    def stampable(t: dict) -> bool:
        return bool(t["turns"]) and all(
            tr.get("context_length") is not None and tr.get("sampled_token_ids") is not None for tr in t["turns"]
        )

    for t in ctx.trajs:
        for tr in t["turns"] if stampable(t) else []:
            seq = [*t["token_ids"][: tr["context_length"]], *tr["sampled_token_ids"]]
            tr["capture_digest"], tr["capture_digest_scheme"] = nemo_gym_entry(seq), NEMO_GYM_TOKENS

    def target(t: dict) -> int | None:
        pos = policy_positions(t, turn=len(t["turns"]) - 1)
        return pos[0] if pos and stampable(t) else None

    t = ctx.pick(lambda t: target(t) is not None, "trajectory whose last turn records its context and sampled ids")
    at = target(t)
    assert at is not None
    last = t["turns"][-1]
    new = t["token_ids"][at] + 1
    replace_token(t, at, new)
    last["sampled_token_ids"][policy_positions(t, turn=len(t["turns"]) - 1).index(at)] = new
    return [t["trajectory_id"]]
