"""Faults the rewards and credit checks (R) must catch."""

from __future__ import annotations

import json

import numpy as np

from .base import Ctx, fault, insert_tokens, loss_evidence, policy_positions, rederive_returns


@fault("reward_components_mismatch", {"R401"}, group="episodes-1")
def reward_components_mismatch(ctx: Ctx) -> list[str]:
    """A format bonus was logged as a component but never added to the turn reward."""
    t = ctx.pick()
    tr = t["turns"][-1]
    tr["reward_components"] = list(tr["reward_components"] or []) + [("format", 0.1)]
    return [t["trajectory_id"]]


@fault("progress_bonus_not_potential", {"R402", "R404"}, group="episodes-1")
def progress_bonus_not_potential(ctx: Ctx) -> list[str]:
    """A "+0.1 per useful step" bonus was added to the shaping term (farmable in a loop).

    Returns and TD residuals are computed with the bonus, consistently; only the potential
    form and the telescoping identity expose it.
    """
    t = ctx.pick(lambda t: len(t["turns"]) >= 2)
    for tr in t["turns"]:
        tr["shaping"] = tr["shaping"] + 0.1
    rederive_returns(t)
    return [t["trajectory_id"]]


@fault("potential_chain_broken", {"R403", "R404"}, group="episodes-2")
def potential_chain_broken(ctx: Ctx) -> list[str]:
    """The potential was recomputed from the observation at each turn, not carried from the
    previous transition: Φ(s_{t+1}) of turn t differs from Φ(s_t) of turn t+1."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2)
    g = t.get("gamma") or 1.0
    tr = t["turns"][1]
    tr["potential_before"] = tr["potential_before"] + 0.3
    tr["shaping"] = g * tr["potential_after"] - tr["potential_before"]
    rederive_returns(t)
    return [t["trajectory_id"]]


@fault("terminal_potential_nonzero", {"R405"}, group="episodes-2")
def terminal_potential_nonzero(ctx: Ctx) -> list[str]:
    """The potential of the terminal state was left at its last value instead of 0."""
    t = ctx.pick(lambda t: t["terminated"])
    g = t.get("gamma") or 1.0
    tr = t["turns"][-1]
    tr["potential_after"] = 0.5
    tr["shaping"] = g * 0.5 - tr["potential_before"]
    rederive_returns(t)
    return [t["trajectory_id"]]


@fault("td_terminal_value_zeroed", {"R406"}, group="episodes-2")
def td_terminal_value_zeroed(ctx: Ctx) -> list[str]:
    """The critic zeroed the value after a truncated episode's last turn (premature zeroing):
    δ_{T-1} ignores the recorded V(h_T) = final_value."""
    t = ctx.pick(lambda t: t["truncated"] and (t["final_value"] or 0) > 0.01, "truncated trajectory")
    tr = t["turns"][-1]
    tr["td_residual"] = tr["reward"] + tr["shaping"] - tr["value"]
    return [t["trajectory_id"]]


@fault("return_without_shaping", {"R407"}, group="episodes-2")
def return_without_shaping(ctx: Ctx) -> list[str]:
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
    group="episodes-3",
)
def first_visit_paid_twice(ctx: Ctx) -> list[str]:
    """A first-visit milestone (key found) was paid on two turns: farmable by repetition.

    The producer declares key_found first-visit in its file metadata (`declares`); an audit of
    the records alone gets the same from configuration (`config`)."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 2 and t["reward"] is None, "excluded trajectory with two turns")
    for tr in t["turns"][:2]:
        comps = dict(tr["reward_components"] or [])
        comps["key_found"] = 0.2
        tr["reward_components"] = list(comps.items())
        tr["reward"] = float(sum(comps.values()))
    rederive_returns(t)
    return [t["trajectory_id"]]


@fault("action_loop", {"R409"}, group="episodes-2")
def action_loop(ctx: Ctx) -> list[str]:
    """The agent repeated the same tool call four times in a row (a loop a bonus could farm)."""
    t = ctx.pick(lambda t: len(t["turns"]) >= 4, "trajectory with four turns")
    for tr in t["turns"][:4]:
        tr["parsed_action"] = json.dumps({"action": "inspect"})
    return [t["trajectory_id"]]


@fault("verifier_inverted", {"R410"}, group="episodes-2")
def verifier_inverted(ctx: Ctx) -> list[str]:
    """The reward was computed from the agent's claim, not the world state: within a task a
    verified success scores below a verified failure."""

    def ok(task):
        ts = [t for t in ctx.trajs if t["task_id"] == task and t["reward"] is not None]
        return any(t["verifier_success"] for t in ts) and any(not t["verifier_success"] for t in ts)

    s = ctx.pick(lambda t: t["verifier_success"] and t["reward"] is not None and ok(t["task_id"]), "mixed task")
    f = ctx.pick(lambda t: t["task_id"] == s["task_id"] and t["reward"] is not None and not t["verifier_success"])
    s["verifier_success"], f["verifier_success"] = False, True
    return [s["trajectory_id"], f["trajectory_id"]]


def _returns_over_every_token(t: dict) -> None:
    """The return recursion of a trainer that runs it over every position, masked or not."""
    acc, ret = 0.0, [0.0] * len(t["token_ids"])
    for i in reversed(range(len(ret))):
        acc += t["token_reward"][i] - t["token_kl"][i]
        ret[i] = acc
    t["token_returns"] = ret


PAD = 0  # the padding id of a right-padded batch


@fault("reward_on_padding_token", {"R411", "R413"}, group="evidence-1")
def reward_on_padding_token(ctx: Ctx) -> list[str]:
    """The PPO score is written at the first token after the end-of-sequence token (the first
    padding position of the right-padded batch) instead of on the last sampled token, and the
    returns carry it from there (huggingface/trl#3750)."""
    loss_evidence(ctx)
    t = ctx.pick(lambda t: bool(t.get("reward")) and bool(policy_positions(t)), "rewarded trajectory with an action")
    i = policy_positions(t)[-1] + 1
    if i == len(t["token_ids"]):  # the sequence ends on its last action: the batch pads it
        insert_tokens(ctx, t, i, [PAD], source=4, turn=t["token_turn"][-1])
    t["token_reward"] = [0.0] * len(t["token_ids"])
    t["token_reward"][i] = float(t["reward"])
    _returns_over_every_token(t)
    return [t["trajectory_id"]]


@fault("kl_accumulated_over_tool_tokens", {"R412", "R413"}, group="evidence-2")
def kl_accumulated_over_tool_tokens(ctx: Ctx) -> list[str]:
    """The KL penalty is computed on every token, tool observations included, and the return
    recursion runs over every position, so the observations' KL flows into the returns of the
    actions before them (THUDM/slime#1370)."""
    loss_evidence(ctx)
    t = ctx.pick(lambda t: 3 in t["token_source"] and 2 in t["token_source"], "trajectory with a tool observation")
    t["token_kl"] = [v if s == 2 else 0.02 for s, v in zip(t["token_source"], t["token_kl"])]
    _returns_over_every_token(t)
    return [t["trajectory_id"]]


@fault("rewards_normalised_to_zero", {"G703"})
def rewards_normalised_to_zero(ctx: Ctx) -> list[str]:
    """Reward normalisation applied before grouping zeroed every reward (each episode centred on
    itself), and with it every advantage, while the verifier's verdicts still vary: no group
    carries signal (alibaba/ROLL#397). The rewards of the turns and the returns follow the
    normalised reward, as the pipeline recorded them."""
    for t in ctx.trajs:
        if t["reward"] is None:
            continue
        t["reward"] = 0.0
        for tr in t["turns"]:
            tr["reward"] = 0.0
            tr["reward_components"] = [(k, 0.0) for k, _ in tr.get("reward_components") or []] or tr.get(
                "reward_components"
            )
        if t.get("discounted_return") is not None:
            rederive_returns(t)
    for u in ctx.updates:
        if u.get("advantages") is not None:
            u["advantages"] = [0.0] * len(u["advantages"])
    return []


@fault(
    "overlong_penalty_counts_tool_tokens",
    {"R414"},
    config={"max_response_tokens": 4096, "overlong_buffer": 4092, "overlong_penalty_factor": 1.0},
)
def overlong_penalty_counts_tool_tokens(ctx: Ctx) -> list[str]:
    """The DAPO-style overlong penalty was computed from the response length counted from the
    first agent turn on, tool outputs and templates included, instead of from the policy's own
    tokens (OpenRLHF#1243, #1252). The other episodes carry the penalty of their policy tokens."""
    cut, buf, factor = 4096, 4092, 1.0  # the penalty starts after 4 tokens: the agent's episodes reach it

    def penalty(n: int) -> float:
        return min(0.0, -(n - (cut - buf)) / buf * factor)

    for t in ctx.trajs:
        t["overlong_penalty"] = penalty(t["token_source"].count(2))
    t = ctx.pick(
        lambda t: abs(penalty(sum(k >= 0 for k in t["token_turn"])) - t["overlong_penalty"]) > 1e-3,
        "trajectory whose response length and policy-token count give different penalties",
    )
    t["overlong_penalty"] = penalty(sum(k >= 0 for k in t["token_turn"]))
    return [t["trajectory_id"]]


@fault("bootstrapped_through_terminal", {"R415"}, group="episodes-2")
def bootstrapped_through_terminal(ctx: Ctx) -> list[str]:
    """The advantage computation ignored the done flag: a terminated episode bootstraps from the
    critic's value of its last state (final_value 0.5 instead of 0), and its TD residuals and
    return are computed with it, consistently."""
    t = ctx.pick(lambda t: t["terminated"] and t["final_value"] is not None, "terminated trajectory")
    t["final_value"] = 0.5
    rederive_returns(t)
    return [t["trajectory_id"]]


def gae_evidence(ctx: Ctx) -> None:
    """Record the contract 1.4 GAE evidence a compliant critic-based trainer would write."""
    from ..synth import record_gae_evidence

    loss_evidence(ctx)
    record_gae_evidence(ctx.trajs)


@fault("gae_bootstraps_from_masked_values", {"R416"})
def gae_bootstraps_from_masked_values(ctx: Ctx) -> list[str]:
    """The GAE recursion runs over every position and reads the critic's values unmasked, so the
    last action before a tool observation bootstraps from the value of an observation token the
    policy never chose, and every earlier advantage carries it (alibaba/ROLL#447: the values were
    masked only after the advantages were computed)."""
    from ..synth import gae_value_targets

    gae_evidence(ctx)
    t = ctx.pick(lambda t: 3 in t["token_source"] and 2 in t["token_source"], "trajectory with a tool observation")
    t["token_value_targets"] = [float(np.float32(x)) for x in gae_value_targets(t, every_position=True)]
    return [t["trajectory_id"]]


@fault("step_rewards_broadcast", {"R417"})
def step_rewards_broadcast(ctx: Ctx) -> list[str]:
    """Group normalisation wrote the episode's normalised terminal reward on every turn of a
    multi-turn episode, over the step reward an earlier turn earned (areal-project/AReaL#1674,
    "broadcast"); the raw rewards the environment paid are kept beside them. Returns and TD
    residuals follow the trained rewards, as the trainer computed them."""
    for tr in (tr for t in ctx.trajs for tr in t["turns"]):
        tr["raw_reward"] = tr["reward"]  # a compliant pipeline trains what was paid
    t = ctx.pick(lambda t: len(t["turns"]) >= 2 and t["terminated"], "terminated trajectory of two turns or more")
    first = t["turns"][0]
    first["raw_reward"] = first["reward"] + 0.25  # a step reward the environment paid for a useful tool call
    first["reward_components"] = list(first["reward_components"] or []) + [("progress", 0.25)]
    normalised = 0.7071
    for tr in t["turns"]:
        tr["reward"] = normalised
    rederive_returns(t)
    return [t["trajectory_id"]]


@fault("action_loop_of_three", {"R409"}, user_config={"loop_length": 3})
def action_loop_of_three(ctx: Ctx) -> list[str]:
    """The agent repeated the same tool call three times in a row, a loop for a team whose
    environment never needs one action more than twice (its own `loop_length = 3`).

    How long a run of identical calls is a loop is the team's judgement of its environment, not
    something a log can state about itself: the broken fixture's `loop_length` is the user's
    configuration beside the log (fixtures/broken/action_loop_of_three.user.toml), and under
    the default (4) the loop goes unreported."""
    t = ctx.pick(lambda t: len(t["turns"]) == 3, "trajectory with three turns")
    for tr in t["turns"]:
        tr["parsed_action"] = json.dumps({"action": "inspect"})
    return [t["trajectory_id"]]
