"""Faults the termination checks (T) must catch."""

from __future__ import annotations

from .base import Ctx, NoTarget, fault, insert_tokens, loss_evidence, policy_positions, recredit, remove_tokens


@fault("two_stop_flags", {"T301", "R405", "R415"}, group="episodes-1")
def two_stop_flags(ctx: Ctx) -> list[str]:
    """A truncated episode is also marked terminated.

    Its last state now counts as terminal while it carries the non-zero potential and the
    non-zero bootstrap value V(h_T) of a non-terminal state, so R405 and R415 (in preview) fire
    with T301.
    """
    t = ctx.pick(lambda t: t["truncated"], "truncated trajectory")
    t["terminated"] = True
    return [t["trajectory_id"]]


@fault("stop_reason_contradicts_flag", {"T302"}, group="episodes-1")
def stop_reason_contradicts_flag(ctx: Ctx) -> list[str]:
    """A terminated episode carries the collector's stop reason max_turns."""
    t = ctx.pick(lambda t: t["terminated"] and t["stop_reason"] == "failure", "terminated failure")
    t["stop_reason"] = "max_turns"
    return [t["trajectory_id"]]


@fault("engine_crash_scored_zero", {"T303", "U606", "U608"}, group="episodes-1")
def engine_crash_scored_zero(ctx: Ctx) -> list[str]:
    """An engine crash was scored 0 and trained on, masquerading as a task failure; its 0 also
    entered its group's statistics."""
    loss_evidence(ctx)
    t = ctx.pick(
        lambda t: t["trajectory_id"] in ctx.used() and t["reward"] == 0.0 and not t["verifier_success"],
        "failed trajectory used in an update",
    )
    t.update(terminated=False, infra_error=True, stop_reason="engine_error")
    return [t["trajectory_id"]]


@fault("truncation_scored_as_failure", {"T304"}, group="episodes-1")
def truncation_scored_as_failure(ctx: Ctx) -> list[str]:
    """A collector-truncated episode was given reward 0 instead of being excluded."""
    t = ctx.pick(lambda t: t["truncated"], "truncated trajectory")
    t["reward"] = 0.0
    return [t["trajectory_id"]]


@fault("length_cap_logged_as_success", {"T305"}, group="episodes-1")
def length_cap_logged_as_success(ctx: Ctx) -> list[str]:
    """The last generation hit the length cap but the episode is recorded as terminated."""
    t = ctx.pick(lambda t: t["terminated"])
    t["turns"][-1]["finish_reason"] = "length"
    return [t["trajectory_id"]]


@fault("budget_cut_logged_as_terminated", {"T306"}, config={"max_response_tokens": 40}, group="episodes-1")
def budget_cut_logged_as_terminated(ctx: Ctx) -> list[str]:
    """The collector's response budget was 40 tokens; the episodes that filled it were cut but are recorded as terminated."""
    # the records are what such a collector writes (OpenRLHF's multi-turn agent never sets
    # truncated): the fault is the budget they were collected under, stated in the configuration
    cut = [t["trajectory_id"] for t in ctx.trajs if t["terminated"] and sum(x >= 0 for x in t["token_turn"]) >= 40]
    if not cut:
        raise NoTarget("the log has no terminated trajectory of 40 response tokens this fault can break")
    return cut


@fault("truncation_paid_as_success", {"T307"}, config={"truncation": "penalize"}, group="evidence-2")
def truncation_paid_as_success(ctx: Ctx) -> list[str]:
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
    recredit(t)
    return [t["trajectory_id"]]


@fault("outcome_paid_at_bootstrap_cut", {"T308"}, config={"truncation": "bootstrap"})
def outcome_paid_at_bootstrap_cut(ctx: Ctx) -> list[str]:
    """Under truncation = bootstrap, an episode cut at the turn limit is paid the success reward on
    top of the critic's value of the state it was cut at: its turns earned nothing, the
    environment scored the partial transcript as a finished one."""
    success = max(
        (
            o["reward"]
            for o in ctx.trajs
            if o["terminated"] and o["stop_reason"] == "success" and o["reward"] is not None
        ),
        default=None,
    )

    def earned_less(t: dict) -> bool:
        paid = [x.get("reward") for x in t["turns"]]
        return (
            t["truncated"]
            and t.get("final_value") is not None  # bootstraps (T304 holds)
            and success is not None
            and None not in paid
            and sum(paid) < success
        )

    t = ctx.pick(earned_less, "truncated episode with a final_value whose turns earned less than a success")
    t["reward"] = float(success)  # type: ignore[arg-type]
    recredit(t)
    return [t["trajectory_id"]]


STOP = 15  # the reference agent's `finish` action: its engine ends the turn on it (finish_reason stop)
CONTENT = 10  # its `inspect` action, the content a stop turn is given before its stop token


def _stop_turn(t: dict) -> int | None:
    """The turn the engine ended with finish_reason stop, when it holds a policy token."""
    return next(
        (k for k, tr in enumerate(t["turns"]) if tr.get("finish_reason") == "stop" and policy_positions(t, k)), None
    )


@fault("stop_token_stripped", {"T309"}, user_config={"stop_token_ids": [STOP]})
def stop_token_stripped(ctx: Ctx) -> list[str]:
    """The rollout worker strips the stop token the engine sampled from the response before the
    trainer records it (a response cut one token short, a decode with skip_special_tokens
    re-encoded): the turn the engine stopped on it ends on the token before, so the policy is
    never trained to stop.

    The log is first written as an engine that stops on STOP writes it (the agent's already is:
    its `finish` ends the turn; a synthetic log's stop turns get it appended, compliantly). The
    broken turn's engine sampled a content token and then the stop token; the record the trainer
    keeps (token lists, sampled_token_ids, the turn's counts and log-prob, the reward on its last
    policy token, the update's denominator) holds the content alone.
    """
    for o in ctx.trajs:
        if (k := _stop_turn(o)) is not None and o["token_ids"][end := policy_positions(o, k)[-1]] != STOP:
            insert_tokens(ctx, o, end + 1, [STOP], source=2, turn=k, logprobs=[-0.015625])
    t = ctx.pick(
        lambda t: _stop_turn(t) is not None, "turn with a policy token that the engine ended with finish_reason stop"
    )
    k = _stop_turn(t)
    assert k is not None
    pos = policy_positions(t, k)[-1]
    if len(policy_positions(t, k)) == 1:  # the stop token alone: the engine sampled content before it
        insert_tokens(ctx, t, pos, [CONTENT], source=2, turn=k, logprobs=[t["behavior_logprobs"][pos]])
        pos += 1
    remove_tokens(ctx, t, pos)  # what the worker stripped, and with it the turn's record
    return [t["trajectory_id"]]
