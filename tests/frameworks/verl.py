"""verl fixtures: `AgentLoopOutput` records of the tool agent loop as the dump hook writes them
(`rollout_audit.integrations.verl.dump`), with the hook's `engine_calls`. Cases: `compliant`,
`tool_separator_dropped` (verl-project/verl#6501, fixed by PR #6921: ToolAgentLoop appends each
tool turn rendered in isolation, so the `\\n` the chat template writes after `<|im_end|>` is missing
at every assistant-to-tool boundary; the engine and the trainer agree, the template's render of
the conversation, which the hook records as `template_ids`, does not), and
`searchr1_mask_after_reencoding` (Search-R1, built on verl, PeterGriffinJin/Search-R1#20/#21: the
mask of retrieved text was built on a re-encoding of the transcript, so it is shifted against the
tokens the engine sampled and the observation tokens it returned).

Every engine call carries what `rollout_audit.integrations.verl.engine_call` takes from verl's
`TokenOutput` (verl/workers/rollout/replica.py): `stop_reason` and the weight versions of
`extra_fields` (`global_steps`, `min_global_steps`, `max_global_steps`; llm_server.py). More cases:
`fully_async` (FullyAsyncLLMServerClient, llm_server.py: a call resumed across a weight update has
min < max; a call whose cumulative tokens reach the budget ends with stop_reason "length"),
`fully_async_versions_decrease` (a later turn recorded with an older version than the turn before it),
`glm_boundary` (GLMContinuousTokenBuilder, utils/tokenizer/continuous_token.py: the sampled
`<|observation|>` that ends a tool-calling turn is dropped and the tool message's own opens the
context, mask 0) and `glm_boundary_dropped_answer` (a builder that also drops a token that is not a
boundary id: a real mismatch)."""

from __future__ import annotations

import random

from .chat import Episode, episode

STEP = 4  # the weight version of the synchronous fixtures (verl's global_steps when they were sampled)


def steps(first: int = STEP, last: int = STEP) -> dict[str, int]:
    """TokenOutput.extra_fields' weight versions of a call sampled from version `first` to `last`
    (llm_server.py: global_steps is the last call's)."""
    return {"global_steps": last, "min_global_steps": first, "max_global_steps": last}


def extra_fields() -> dict:
    """The JSON-safe extra_fields ToolAgentLoop returns for a synchronous episode."""
    return {"turn_scores": [], "tool_rewards": [], **steps()}


def record(
    ep: Episode,
    request_id: str,
    uid: str,
    reward: float,
    mask: list[int] | None = None,
    template: Episode | None = None,
) -> dict:
    """One sample as the hook writes it: AgentLoopOutput's fields, request_id, uid and engine_calls
    (with the chat template's render of each call's conversation: `template`'s contexts, or the
    episode's own when the builder is right)."""
    renders = (template or ep).contexts()
    return {
        "request_id": request_id,
        "uid": uid,
        "prompt_ids": ep.prompt,
        "response_ids": ep.response(),
        "response_mask": ep.mask() if mask is None else mask,
        "response_logprobs": ep.response_logprobs(),
        "reward_score": reward,
        "num_turns": 2 * len(ep.outputs),  # user + assistant + tool turns + 1, as ToolAgentLoop counts
        "extra_fields": extra_fields(),
        "engine_calls": [
            {
                "prompt_ids": c,
                "token_ids": o,
                "stop_reason": "completed",  # vLLM folds stop and length into "completed"
                **steps(),
                "template_ids": r,
            }
            for c, o, r in zip(ep.contexts(), ep.outputs, renders)
        ],
    }


def shifted(mask: list[int], by: int = 1) -> list[int]:
    """The mask moved right by `by` positions at every boundary: what a mask computed on a
    re-encoding whose tokens merge one position differently looks like against the real tokens."""
    return [mask[0]] * by + mask[:-by]


def _batch(bug: str | None = None) -> list[dict]:
    """Two prompts, two samples each; sample 1 of the tool prompt carries `bug`: `reencoded` (the
    mask built on the re-encoded transcript) or `separator` (built without the turn separator)."""
    out = []
    for k, (uid, turns) in enumerate((("7c1f", 1), ("e2a9", 3))):
        for rep in range(2):
            seed, hit = 100 + 10 * k + rep, k == 1 and rep == 1
            ep = episode(seed, turns, separator=not (hit and bug == "separator"))
            mask = shifted(ep.mask()) if hit and bug == "reencoded" else None
            out.append(record(ep, f"{uid}{rep:02d}", uid, float(rep), mask, episode(seed, turns)))
    return out


# fully-async: per record, the versions of each engine call as (min_global_steps, max_global_steps)
# and the last call's stop_reason; RESPONSE_LENGTH is the budget (actor_rollout_ref.rollout.response_length)
RESPONSE_LENGTH = 64
_ASYNC = (
    ("a1", [(7, 7)], "completed"),
    ("a2", [(7, 7), (7, 8)], "completed"),  # the second call was aborted and resumed on version 8
    ("a3", [(8, 8), (8, 8), (9, 9)], "length"),  # the budget ran out in the last call
)


def _fully_async(decrease: bool = False) -> list[dict]:
    """Samples of a fully-async run (one group); with `decrease` the last turn of a3 is recorded with
    an older version than the turn before it."""
    out = []
    for k, (rid, versions, last_stop) in enumerate(_ASYNC):
        ep = episode(300 + k, len(versions))
        if last_stop == "length":  # pad the last output up to the budget: no end-of-turn token
            need = RESPONSE_LENGTH - len(ep.response()) + len(ep.outputs[-1])
            rng = random.Random(k)
            ep.outputs[-1] = [rng.randrange(1000, 30000) for _ in range(need)]
            ep.logprobs[-1] = [round(-rng.uniform(0.01, 2.0), 4) for _ in range(need)]
        if decrease and rid == "a3":
            versions = [*versions[:-1], (7, 7)]
        rec = record(ep, rid, "f00d", float(k == 0))
        for call, (lo, hi), stop in zip(
            rec["engine_calls"], versions, ["completed"] * (len(versions) - 1) + [last_stop]
        ):
            call.update(stop_reason=stop, **steps(lo, hi))
        first, last = rec["engine_calls"][0], rec["engine_calls"][-1]
        rec["extra_fields"].update(
            global_steps=first["global_steps"],
            min_global_steps=first["min_global_steps"],
            max_global_steps=last["max_global_steps"],
        )
        out.append(rec)
    return out


# GLM's special ids (illustrative values): <|user|>, <|assistant|>, <|observation|>, <|endoftext|>
GLM_USER, GLM_ASSISTANT, GLM_OBSERVATION, GLM_EOS = 151336, 151337, 151338, 151329


def glm_episode(seed: int, n_turns: int) -> Episode:
    """A GLM tool episode as the engine saw it: each tool-calling turn ends with the sampled
    `<|observation|>` (a stop token), the tool message opens with its own, the last turn ends with
    `<|endoftext|>`. Contexts are what verl gave the engine (the trainer's sequence)."""
    rng = random.Random(seed)

    def text(k: int) -> list[int]:
        return [rng.randrange(1000, 30000) for _ in range(k)]

    ep = Episode(prompt=[GLM_USER, *text(9), GLM_ASSISTANT])
    for t in range(n_turns):
        last = t == n_turns - 1
        out = [*text(5), GLM_EOS] if last else [*text(5), GLM_OBSERVATION]
        ep.outputs.append(out)
        ep.logprobs.append([round(-rng.uniform(0.01, 2.0), 4) for _ in out])
        ep.observations.append([] if last else [GLM_OBSERVATION, *text(4), GLM_ASSISTANT])
    return ep


def glm_record(ep: Episode, request_id: str, uid: str, reward: float, drop: set[int] | None = None) -> dict:
    """The sample as ToolAgentLoop builds it with GLMContinuousTokenBuilder (continuous_token.py,
    _merge_context_token_ids and align_response_metadata): before a context message is appended, the
    runtime sequence's last token is dropped, with its mask and log-prob, when it is in `drop`
    (default <|observation|> and <|user|>); the engine's contexts are that edited sequence."""
    drop = {GLM_OBSERVATION, GLM_USER} if drop is None else drop
    resp: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    calls = []
    for o, lp, obs in zip(ep.outputs, ep.logprobs, ep.observations):
        calls.append({"prompt_ids": ep.prompt + resp, "token_ids": o, "stop_reason": "completed", **steps()})
        resp, mask, lps = resp + o, mask + [1] * len(o), lps + lp
        if obs:
            if resp[-1] in drop:
                resp, mask, lps = resp[:-1], mask[:-1], lps[:-1]
            resp, mask, lps = resp + obs, mask + [0] * len(obs), lps + [0.0] * len(obs)
    return {
        "request_id": request_id,
        "uid": uid,
        "prompt_ids": ep.prompt,
        "response_ids": resp,
        "response_mask": mask,
        "response_logprobs": lps,
        "reward_score": reward,
        "num_turns": 2 * len(ep.outputs),
        "extra_fields": extra_fields(),
        "engine_calls": calls,
        "boundary_ids": sorted({GLM_OBSERVATION, GLM_USER}),
    }


def _glm(bug: bool = False) -> list[dict]:
    """One GLM group of two tool episodes; with `bug` the second one's builder also dropped the
    answer's last token before the tool message (a sampled token that is no boundary id)."""
    out = []
    for rep in range(2):
        ep = glm_episode(500 + rep, 3)
        if bug and rep == 1:
            ep.outputs[0][-1] = 4242  # the turn ended on an ordinary token, which the builder dropped
        drop = {GLM_OBSERVATION, GLM_USER, 4242} if bug else None
        out.append(glm_record(ep, f"glm{rep:02d}", "9b3e", float(rep), drop))
    return out


def cases() -> dict[str, list[dict]]:
    """The verl fixture cases."""
    return {
        "compliant": _batch(),
        "tool_separator_dropped": _batch("separator"),
        "searchr1_mask_after_reencoding": _batch("reencoded"),
        "fully_async": _fully_async(),
        "fully_async_versions_decrease": _fully_async(decrease=True),
        "glm_boundary": _glm(),
        "glm_boundary_dropped_answer": _glm(bug=True),
    }
