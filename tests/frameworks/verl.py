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
boundary id: a real mismatch).

Contract 1.3, written through the hooks (`rollout_audit.integrations.verl`): `compliant_routes_vllm`
(R3 routes of a synchronous vLLM run), `fully_async_routes` (a call resumed across a weight update,
routes merged as at HEAD), `routes_resumed_duplicated` (verl#6029) and `routes_resumed_replaced`
(verl#6046); `compliant_dapo` (DAPO's overlong penalty on single-turn samples) and
`dapo_overlong_counts_tool_tokens` (verl's DAPO manager on tool episodes: the length spans tool tokens).

Contract 1.4: `compliant_gae` (PPO with a critic: values, GAE returns and algorithm.lam in the
trainer-side record, GAE as verl 0.9.1 runs it) and `trainer_gae_over_every_position` (verl 0.4.1's GAE,
which bootstraps each action before a tool output from the critic's value of that output)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np

from rollout_audit.adapters.base import UNRECORDED
from rollout_audit.integrations import verl as hook
from rollout_audit.integrations.verl_v1 import NOT_RECORDED

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


# ---------------------------------------------------------------- the trainer side (dump_batch)

TRAIN_STEP = STEP + 1  # the synchronous trainer trains at step k what version k - 1 sampled
ALGORITHM = {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "gamma": 1.0, "use_kl_in_reward": False}
OLD_ON_OBSERVATION = -5.0  # the actor scores every response token; the adapter keeps the sampled ones


def grpo(scores: list[float], uids: list[str], eps: float = 1e-6) -> list[float]:
    """verl's compute_grpo_outcome_advantage on outcome scores (core_algos.py): per uid, (R - mean) /
    (unbiased std + eps); a group of one gets mean 0 and std 1."""
    out = []
    for s, u in zip(scores, uids):
        g = [x for x, v in zip(scores, uids) if v == u]
        mean = sum(g) / len(g) if len(g) > 1 else 0.0
        std = (sum((x - mean) ** 2 for x in g) / (len(g) - 1)) ** 0.5 if len(g) > 1 else 1.0
        out.append((s - mean) / (std + eps))
    return out


def batch_record(rec: dict, advantage: float, mask: list[int], old: list[float]) -> dict:
    """The trainer-side record of one sample, as `dump_batch` writes a row of the DataProto after
    compute_advantage: the score on the last response token (agent_loop.py `_postprocess`: rm_scores
    at attention length - 1), the outcome advantage on every token of the (rejection-applied) mask,
    returns = advantages (GRPO), the actor's old log-probs and the engine's rollout log-probs."""
    n = len(rec["response_ids"])
    scores = [0.0] * (n - 1) + [rec["reward_score"]]
    adv = [round(advantage, 6) * m for m in mask]
    return {
        "request_id": rec["request_id"],
        "uid": rec["uid"],
        "global_steps": TRAIN_STEP,
        **ALGORITHM,
        "responses": rec["response_ids"],
        "response_mask": mask,
        "token_level_scores": scores,
        "token_level_rewards": scores,
        "advantages": adv,
        "returns": adv,
        "old_log_probs": old,
        "rollout_log_probs": rec["response_logprobs"],
    }


def _trainer(bug: str | None = None) -> list[dict]:
    """The compliant batch's sampler records, then the trainer-side record of each row. `bug`:
    `rejected` (rollout correction rejects e2a901 whole, verl zeroes its response_mask, yet GRPO's
    statistics still read its reward: verl-project/verl#6452), `attention_mask` (the trainer's
    response_mask is compute_response_mask's, the attention mask past the prompt, so tool tokens enter
    the loss), `stale_old_log_probs` (the actor's old log-probs of e2a901 are 1.5 nats above the
    engine's on every token: the engine sampled with other weights), `group_of_one` (7c1f01 is
    the only sample of its prompt in the step: verl's GRPO gives it its raw score)."""
    samples = _batch()
    if bug == "group_of_one":
        samples = [r for r in samples if r["request_id"] != "7c1f00"]
    uids = [r["uid"] for r in samples]
    advantages = grpo([r["reward_score"] for r in samples], uids)
    out = list(samples)
    for rec, adv in zip(samples, advantages):
        hit = rec["request_id"] == "e2a901"
        mask = list(rec["response_mask"])
        if bug == "rejected" and hit:
            mask = [0] * len(mask)
        if bug == "attention_mask":
            mask = [1] * len(mask)
        shift = 1.5 if bug == "stale_old_log_probs" and hit else 0.0
        old = [
            round(lp + shift, 4) if m else OLD_ON_OBSERVATION
            for lp, m in zip(rec["response_logprobs"], rec["response_mask"])
        ]
        out.append(batch_record(rec, adv, mask, old))
    return out


# ---------------------------------------------------------------- the V1 trainer (integrations.verl_v1)

V1_MODE = "sync"  # trainer.v1.trainer_mode the audited trainer runs (rollout_audit_sync)
# a draw of compute_pf_ppo_reweight_data's `pow` weighting (|score|^2, core_algos.py:2285-2303): the
# unrewarded rows (0 and 2) weigh 1e-8, so the resample takes the rewarded rows 1 and 3 only
PF_PPO_DRAW = [1, 3, 3, 1]


def _v1(bug: str | None = None) -> list[dict]:
    """One V1 `sync` step, as the three writers leave it under trainer.rollout_data_dir: the agent-loop
    wrapper's records, keyed by the TransferQueue key `{uid}_{session_id}_0` with no reward_score (verl
    scores after the loop returns, v1/agent_loop_tq.py:160); the V1 trainer's record of each key
    (`integrations.verl_v1.v1_records`: rm_scores as token_level_scores, GRPO advantages broadcast on the
    mask, v1/utils.py:208-216); verl's own generations rows (`{step}.jsonl`: score = rm_scores.sum(1),
    uid = the key, sorted by it, trainer_base.py:1297-1339). `bug="mispaired"` is verl#7956's mechanism:
    the batch resampled with replacement (`PF_PPO_DRAW`, core_algos.py:2303-2305) and its advantages
    and returns written back under the original keys, each cut at its own response length
    (`response_to_nested`, trainer_base.py:1786-1800)."""
    samples = _batch()
    keys, sessions = [], {}
    for rec in samples:
        sessions[rec["uid"]] = sessions.get(rec["uid"], -1) + 1
        keys.append(f"{rec['uid']}_{sessions[rec['uid']]}_0")
    scores = [rec["reward_score"] for rec in samples]
    advantages = grpo(scores, [r["uid"] for r in samples])
    width = max(len(r["response_ids"]) for r in samples)
    padded = [
        [round(a, 6) * m for m in r["response_mask"]] + [0.0] * (width - len(r["response_ids"]))
        for r, a in zip(samples, advantages)
    ]
    if bug == "mispaired":
        padded = [padded[j] for j in PF_PPO_DRAW]
    loop, trainer, generations = [], [], []
    for key, rec, adv in zip(keys, samples, padded):
        n = len(rec["response_ids"])
        loop.append({**rec, "request_id": key, "reward_score": None})
        batch = batch_record(
            {**rec, "request_id": key},
            0.0,
            list(rec["response_mask"]),
            [
                round(lp, 4) if m else OLD_ON_OBSERVATION
                for lp, m in zip(rec["response_logprobs"], rec["response_mask"])
            ],
        )
        batch |= {
            "advantages": adv[:n],
            "returns": adv[:n],
            "local_trigger_step": 0,
            "parameter_sync_step": 1,
            "trainer_mode": V1_MODE,
            UNRECORDED: dict(NOT_RECORDED),
        }
        trainer.append(batch)
        generations.append(
            {
                "input": f"prompt {rec['uid']}",
                "output": f"response {key}",
                "gts": None,
                "score": rec["reward_score"],
                "step": TRAIN_STEP,
                "uid": key,
            }
        )
    return loop + trainer + sorted(generations, key=lambda g: g["uid"])


# PPO with a critic (algorithm.adv_estimator=gae): verl's AlgoConfig gamma and lam (trainer/config/algorithm.py:655-656)
GAE = {"adv_estimator": "gae", "norm_adv_by_std_in_grpo": True, "gamma": 0.99, "lam": 0.95, "use_kl_in_reward": False}


def gae(rewards: list[float], values: list[float], mask: list[int], every_position: bool = False) -> list[float]:
    """verl's GAE returns (A + V) of one response, in float64: from verl 0.5.0 on (0.9.1
    core_algos.py:250-261) the recursion carries the next value and the running advantage across
    the positions of response_mask 0; `every_position`: verl 0.4.1's (core_algos.py:186-193), which
    bootstraps every position from the value of the one after it, masked or not."""
    out, adv, v_next = [0.0] * len(rewards), 0.0, 0.0
    g, lam = GAE["gamma"], GAE["lam"]
    for t in reversed(range(len(rewards))):
        step = rewards[t] + g * v_next - values[t] + g * lam * adv
        if every_position or mask[t]:
            adv, v_next = step, values[t]
        out[t] = adv + values[t]
    return out


def whiten(rows: list[list[float]], masks: list[list[int]]) -> list[list[float]]:
    """verl_F.masked_whiten over the batch: (x - mean) / sqrt(var + 1e-8), var unbiased, over the masked tokens."""
    xs = [x for r, m in zip(rows, masks) for x, k in zip(r, m) if k]
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return [[(x - mean) / (var + 1e-8) ** 0.5 for x in r] for r in rows]


def _gae_trainer(every_position: bool = False) -> list[dict]:
    """The compliant batch trained by PPO with a critic: per row, the critic's values on every response
    position (dp_critic's compute_values; tool tokens keep theirs: 0.4.1 masks them by the attention
    mask, dp_critic.py:181-184), the returns verl's GAE made of them and the whitened advantages.
    `every_position`: verl 0.4.1's recursion, which bootstraps the last action of each tool-calling turn
    from the critic's value of the tool output after it."""
    samples = _batch()
    rng = random.Random(7)
    rows = []
    for rec in samples:
        n = len(rec["response_ids"])
        scores = [0.0] * (n - 1) + [rec["reward_score"]]
        values = [round(rng.uniform(-1.0, 1.0), 4) for _ in range(n)]
        mask = list(rec["response_mask"])
        ret = [round(x, 6) for x in gae(scores, values, mask, every_position)]
        rows.append((rec, scores, values, mask, ret))
    advs = whiten([[r - v for r, v in zip(ret, vals)] for _, _, vals, _, ret in rows], [m for *_, m, _ in rows])
    out = list(samples)
    for (rec, _scores, values, mask, ret), adv in zip(rows, advs):
        old = [round(lp, 4) if m else OLD_ON_OBSERVATION for lp, m in zip(rec["response_logprobs"], mask)]
        out.append(
            {
                **batch_record(rec, 0.0, mask, old),
                **GAE,
                "advantages": [round(a, 6) * m for a, m in zip(adv, mask)],
                "returns": ret,
                "values": values,
            }
        )
    return out


# a ToolAgentLoop episode whose last turn hits response_length: the engine returned more ids than fit,
# the loop keeps the response's first RESPONSE_LENGTH tokens (agent_loop.py / tool_agent_loop.py)
def _cut_at_response_length() -> list[dict]:
    """Two tool episodes of one prompt; the second one's last turn is cut at RESPONSE_LENGTH."""
    out = []
    for rep in range(2):
        ep = episode(700 + rep, 3)
        rec = record(ep, f"c0de{rep:02d}", "c0de", float(rep))
        if rep == 1:
            rng = random.Random(rep)
            extra = RESPONSE_LENGTH - len(ep.response()) + 7  # seven ids past the budget
            more = [rng.randrange(1000, 30000) for _ in range(extra)]
            rec["engine_calls"][-1]["token_ids"] = ep.outputs[-1][:-1] + more + ep.outputs[-1][-1:]
            keep = RESPONSE_LENGTH - len(rec["response_ids"]) + len(ep.outputs[-1]) - 1
            lps = [round(-rng.uniform(0.01, 2.0), 4) for _ in range(keep)]
            body = rec["engine_calls"][-1]["token_ids"][: len(ep.outputs[-1]) - 1 + keep]
            cut = len(rec["response_ids"]) - len(ep.outputs[-1])
            rec["response_ids"] = rec["response_ids"][:cut] + body[: RESPONSE_LENGTH - cut]
            rec["response_mask"] = rec["response_mask"][:cut] + [1] * (RESPONSE_LENGTH - cut)
            rec["response_logprobs"] = (rec["response_logprobs"][:cut] + ep.logprobs[-1][:-1] + lps)[:RESPONSE_LENGTH]
        out.append(rec)
    return out


# ---------------------------------------------------------------- MoE routing replay (R3)

LAYERS, TOP_K, EXPERTS = 2, 2, 8  # a tiny MoE: the routes are positions x layers x top-k expert ids


def _engine_routes(rng: np.random.Generator, context: int, tokens: int) -> np.ndarray:
    """The routes one vLLM call returns (TokenOutput.routed_experts): every position fed through the
    model, its context and all but its last sampled token (agent_loop.py:132-137)."""
    return rng.integers(0, EXPERTS, (context + tokens - 1, LAYERS, TOP_K), dtype=np.int16)


def _client_call(
    rng: np.random.Generator, ctx: list[int], ids: list[int], attempts: list[tuple[int, int]], merge: str
) -> SimpleNamespace:
    """One `server_manager.generate` call as the fully-async client runs it (llm_server.py:402-452): each
    attempt resubmits the prompt with the tokens so far; the routes are merged as `merge` says: `per_attempt`
    (HEAD, verl#6046's fix: the first attempt's whole, then each resumed attempt's rows of its new tokens),
    `whole` (before verl#6029's fix: each attempt's whole routes appended) or `replace` (verl#6029's fix that
    verl#6046 corrected: the last attempt's routes replace the older weights'). The hook's `attempt` line
    runs after each merge; the call's versions are set as llm_server.py does."""
    final = SimpleNamespace(token_ids=[], routed_experts=None, extra_fields={}, stop_reason=None)
    off = 0
    for k, (n, version) in enumerate(attempts):
        new = ids[off : off + n]
        out = SimpleNamespace(
            token_ids=new,
            routed_experts=_engine_routes(rng, len(ctx) + off, n),
            extra_fields={"global_steps": version},
            stop_reason="aborted" if k < len(attempts) - 1 else "completed",
        )
        before = final.routed_experts
        final.token_ids = final.token_ids + new
        if before is None or merge == "replace":
            final.routed_experts = out.routed_experts
        else:
            tail = out.routed_experts if merge == "whole" else out.routed_experts[-n:]
            final.routed_experts = np.concatenate([before, tail])
        final.stop_reason = out.stop_reason
        hook.attempt(final, out, before)
        off += n
    final.extra_fields.update(
        global_steps=attempts[-1][1], min_global_steps=attempts[0][1], max_global_steps=attempts[-1][1]
    )
    return final


def _moe_record(
    ep: Episode, request_id: str, uid: str, calls: list[list[tuple[int, int]]], sync: bool, merge: str, seed: int
) -> dict:
    """A ToolAgentLoop sample with routing replay, through the hooks: per call `attempts` [(tokens,
    version)] (a call of one attempt was not resumed); the loop keeps the last call's routes
    (tool_agent_loop.py:274-275) cut at prompt + response_length (:197-198)."""
    rng = np.random.default_rng(seed)
    finals = [_client_call(rng, c, o, a, merge) for c, o, a in zip(ep.contexts(), ep.outputs, calls)]
    if sync:  # no resuming client: the engine's own TokenOutput (no attempt records)
        for f in finals:
            for key in (hook.ATTEMPTS, hook.ROUTE_RUNS):
                f.extra_fields.pop(key)
    output = SimpleNamespace(
        prompt_ids=ep.prompt,
        response_ids=ep.response(),
        response_mask=ep.mask(),
        response_logprobs=ep.response_logprobs(),
        reward_score=float(int(request_id[-1]) % 2),
        num_turns=2 * len(ep.outputs),
        extra_fields={"turn_scores": [], "tool_rewards": [], **finals[0].extra_fields},
        routed_experts=finals[-1].routed_experts[: len(ep.prompt) + RESPONSE_LENGTH],
    )
    for key in (hook.ATTEMPTS, hook.ROUTE_RUNS):
        output.extra_fields.pop(key, None)
    output.extra_fields["max_global_steps"] = finals[-1].extra_fields["max_global_steps"]
    engine_calls = [hook.engine_call(c, f) for c, f in zip(ep.contexts(), finals)]
    return hook.record(output, request_id=request_id, uid=uid, engine_calls=engine_calls)


def _moe(sync: bool = False, merge: str = "per_attempt") -> list[dict]:
    """One group of two tool episodes with routing replay on vLLM. Fully async: `3e0f00` sampled at
    version 7; `3e0f01`'s second call was aborted after 3 tokens by a weight update and resumed at
    version 8. Synchronous (`sync`, version 4): both calls of each episode at one version."""
    out = []
    for rep in range(2):
        ep = episode(900 + rep, 2)
        if sync:
            calls = [[(len(o), STEP)] for o in ep.outputs]
        elif rep == 0:
            calls = [[(len(o), 7)] for o in ep.outputs]
        else:
            calls = [[(len(ep.outputs[0]), 7)], [(3, 7), (len(ep.outputs[1]) - 3, 8)]]
        out.append(_moe_record(ep, f"3e0f{rep:02d}", "3e0f", calls, sync, merge, seed=rep))
    return out


# ---------------------------------------------------------------- DAPO's overlong penalty

MAX_RESP_LEN, OVERLONG_BUFFER, OVERLONG_FACTOR = 64, 16, 1.0  # reward_kwargs.max_resp_len, overlong_buffer_cfg


def dapo_penalty(length: int) -> float:
    """verl's DAPO reward manager (reward_manager/dapo.py:121-126): exceed_len = valid_response_length -
    (max_resp_len - overlong_buffer.len); min(-exceed_len / len * penalty_factor, 0)."""
    return min(-(length - (MAX_RESP_LEN - OVERLONG_BUFFER)) / OVERLONG_BUFFER * OVERLONG_FACTOR, 0.0)


def _dapo(tools: bool = False) -> list[dict]:
    """One group of two samples scored by verl's DAPO reward manager with overlong_buffer.log, which puts
    `overlong_reward` in reward_extra_info and adds it to the score. Without `tools`, SingleTurnAgentLoop
    samples of 40 and 56 tokens: the valid response length dapo.py reads is the policy's. With `tools`,
    ToolAgentLoop samples: the length dapo.py reads is the attention mask past the prompt, tool responses
    included (the class of OpenRLHF#1243/#1252), so `d91a01` (22 sampled tokens in 56) is penalised."""
    out = []
    for rep in range(2):
        ep = episode(950 + rep, 3 if tools and rep == 1 else 1)
        if not tools:  # pad the answer to 40 / 56 tokens, still ending with <|im_end|>
            rng = random.Random(rep)
            pad = (40, 56)[rep] - len(ep.outputs[0])
            ep.outputs[0] = [rng.randrange(1000, 30000) for _ in range(pad)] + ep.outputs[0]
            ep.logprobs[0] = [round(-rng.uniform(0.01, 2.0), 4) for _ in range(pad)] + ep.logprobs[0]
        penalty = round(dapo_penalty(len(ep.response())), 6)
        rec = record(ep, f"{'d91a' if tools else 'da90'}{rep:02d}", "d91a" if tools else "da90", float(rep) + penalty)
        rec["extra_fields"]["reward_extra_info"] = {"overlong_reward": penalty, "overlong": penalty < 0}
        out.append(rec)
    return out


def cases() -> dict[str, list[dict]]:
    """The verl fixture cases."""
    return {
        "fully_async_routes": _moe(),
        "compliant_routes_vllm": _moe(sync=True),
        "routes_resumed_duplicated": _moe(merge="whole"),
        "routes_resumed_replaced": _moe(merge="replace"),
        "compliant_dapo": _dapo(),
        "dapo_overlong_counts_tool_tokens": _dapo(tools=True),
        "trainer_compliant": _trainer(),
        "trainer_rejected_in_group_statistics": _trainer("rejected"),
        "trainer_mask_from_attention": _trainer("attention_mask"),
        "trainer_stale_old_log_probs": _trainer("stale_old_log_probs"),
        "trainer_grpo_group_of_one": _trainer("group_of_one"),
        "compliant_v1": _v1(),
        "trainer_v1_advantages_mispaired": _v1("mispaired"),
        "compliant_gae": _gae_trainer(),
        "trainer_gae_over_every_position": _gae_trainer(every_position=True),
        "tool_agent_loop_response_length": _cut_at_response_length(),
        "compliant": _batch(),
        "tool_separator_dropped": _batch("separator"),
        "searchr1_mask_after_reencoding": _batch("reencoded"),
        "fully_async": _fully_async(),
        "fully_async_versions_decrease": _fully_async(decrease=True),
        "glm_boundary": _glm(),
        "glm_boundary_dropped_answer": _glm(bug=True),
    }
