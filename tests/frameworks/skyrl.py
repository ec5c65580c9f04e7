"""SkyRL fixtures: per-row records of `GeneratorOutput` (skyrl/train/generators/base.py) as the
dump hook writes them, with the engine calls the agent-loop hook keeps, and the trainer-side records
of the `TrainingInputBatch` after compute_advantages_and_returns (skyrl/train/trainer.py:1124-1194).
Compliant: `compliant`, `trainer` (with the trainer's records), `multi_step` (two training steps that
draw the same prompts again, one sample cut at the length limit under `apply_overlong_filtering`),
`fully_async`, `step_wise` (`generator.step_wise_trajectories`: one row per turn) and
`zero_variance_filtered`. Faults: `eos_appended_logprob_zero` (NovaSky-AI/SkyRL#758: an EOS the
engine did not sample, mask 1), `assistant_header_trained` (NovaSky-AI/SkyRL#710: template tokens in
the mask), `step_wise_interleaved` (U603), `abort_in_group_statistics` (U608) and
`trainer_mask_trains_more` (U607).

Shapes as at NovaSky-AI/SkyRL a956457: `GeneratorOutput` TypedDict (skyrl/train/generators/base.py:37-63),
`TrajectoryID(instance_id, repetition_id)` (:13-19, instance_id = the dataset index as a string,
skyrl/train/dataset/dataset.py:92; repetition_id 0..n-1, generators/utils.py:547-553, so both recur
at every step that draws the prompt again), `BatchMetadata.global_step` (base.py:22-25).
`apply_overlong_filtering` zeroes every loss mask of a sample whose stop reason is not "stop"
(generators/utils.py:349-371, applied at skyrl_gym_generator.py:962-964) and keeps its reward;
`zero_reward_on_non_stop` sets the reward to 0 (skyrl_gym_generator.py:958-960, :988-1011); both
GeneratorConfig flags default False (skyrl/train/config/config.py:1255-1266). The fully-async
trainer's group carries `global_step_when_scheduled` (fully_async_trainer.py:55-83, set at :915-938)."""

from __future__ import annotations

import statistics

from .chat import ASSISTANT, IM_END, NL, Episode, episode, header
from .slime import routes

STOP_STR = 151659  # a stop string's last token ("</answer>"), not the eos


def calls(ep: Episode) -> list[dict]:
    """The agent loop's engine calls: each turn's context and the ids the engine returned for it."""
    return [{"prompt_token_ids": c, "response_ids": list(o)} for c, o in zip(ep.contexts(), ep.outputs)]


def record(ep: Episode, instance: str, rep: int, reward: float) -> dict:
    """One sample as the hook writes it: the sample's element of each GeneratorOutput list, and the
    engine calls the agent-loop hook kept for it."""
    return {
        "prompt_token_ids": ep.prompt,
        "response_ids": ep.response(),
        "rewards": reward,
        "loss_masks": ep.mask(),
        "stop_reasons": "stop",
        "rollout_logprobs": ep.response_logprobs(),
        "trajectory_ids": {"instance_id": instance, "repetition_id": rep},
        "global_step": 3,
        "engine_calls": calls(ep),
    }


def _batch(eos_appended: bool) -> list[dict]:
    """Two instances, two repetitions each; with `eos_appended`, sample 1 of instance b stopped on
    a stop string and got SkyRL's appended EOS (mask 1, log-prob 0.0)."""
    out = []
    for k, (inst, turns) in enumerate((("gsm8k-17", 1), ("search-4", 3))):
        for rep in range(2):
            seed = 10 * k + rep
            if eos_appended and k == 1 and rep == 1:
                ep = episode(seed, turns, end=[STOP_STR])
                rec = record(ep, inst, rep, 1.0)
                rec["response_ids"].append(IM_END)  # skyrl_gym_generator: response_ids.append(eos_token_id)
                rec["loss_masks"].append(1)  # loss_mask.append(1)
                rec["rollout_logprobs"].append(0.0)  # rollout_logprobs.append(0.0)
            else:
                rec = record(episode(seed, turns), inst, rep, float(rep))
            out.append(rec)
    return out


def _step(step: int, seed: int, cut: bool) -> list[dict]:
    """One step's batch: the same two instances, two repetitions each; with `cut`, repetition 1 of
    search-4 ran out of tokens (stop_reasons "length"), and the overlong filter zeroed its mask."""
    out = []
    for k, (inst, turns) in enumerate((("gsm8k-17", 1), ("search-4", 3))):
        for rep in range(2):
            rec = record(episode(seed + 10 * k + rep, turns), inst, rep, float(rep))
            rec["global_step"] = step
            if cut and k == 1 and rep == 1:
                rec["stop_reasons"] = "length"
                rec["loss_masks"] = [0] * len(rec["loss_masks"])  # apply_overlong_filtering
            out.append(rec)
    return out


def _fully_async() -> list[dict]:
    """Two groups of the fully-async trainer: each scheduled at its own step (the uid drawn again in
    the next epoch), every record with its group's `global_step_when_scheduled`."""
    out = []
    for when, seed in ((7, 40), (9, 50)):
        for rep in range(2):
            rec = record(episode(seed + rep, 2), "gsm8k-17", rep, float(rep))
            del rec["global_step"]
            rec["global_step_when_scheduled"] = when
            out.append(rec)
    return out


def _assistant_header_trained() -> list[dict]:
    """NovaSky-AI/SkyRL#710: a custom generator (MiniSweAgentGenerator before the fix) masked every
    token of an assistant message with 1, so the generation prompt `<|im_start|>assistant\\n` that
    opens each later assistant turn and the `\\n` after `<|im_end|>` were trained: the chat
    template wrote them, the engine never sampled them."""
    out = _batch(False)
    for rec in out:
        resp, mask = rec["response_ids"], list(rec["loss_masks"])
        ends = [len(c["prompt_token_ids"]) - len(rec["prompt_token_ids"]) for c in rec["engine_calls"][1:]]
        for end in ends:  # the next assistant turn's generation prompt, rendered by the template
            mask[end - len(header(ASSISTANT)) : end] = [1] * len(header(ASSISTANT))
        for i in range(1, len(resp)):  # the "\\n" the template writes after the sampled <|im_end|>
            if resp[i] == NL and resp[i - 1] == IM_END and mask[i - 1]:
                mask[i] = 1
        rec["loss_masks"] = mask
    return out


def _grpo(rewards: list[float], uids: list[str], norm_by_std: bool = True) -> list[float]:
    """SkyRL's GRPO advantage of each row (ppo_utils.py:1344-1393): the group's mean and Bessel
    std (+1e-6) over the rows sharing a uid."""
    out = []
    for r, u in zip(rewards, uids):
        g = [x for x, v in zip(rewards, uids) if v == u]
        mean = statistics.fmean(g)
        out.append((r - mean) / (statistics.stdev(g) + 1e-6) if norm_by_std else r - mean)
    return out


def trainer_records(rows: list[dict], order: list[int] | None = None) -> list[dict]:
    """The trainer-side hook's records for generator `rows` (after compute_advantages_and_returns,
    trainer.py:1124-1194): SkyRL's outcome advantage from the last steps, broadcast to every step of
    the trajectory the `is_last_step` cumsum assigns it to (trainer.py:1171-1180), times the row's
    response mask; `loss_mask` as the trainer holds it."""
    step_wise = rows[0].get("is_last_step") is not None
    last = [r.get("is_last_step") is not False for r in rows]
    lasts = [i for i, x in enumerate(last) if x]
    adv = _grpo([rows[i]["rewards"] for i in lasts], [rows[i]["trajectory_ids"]["instance_id"] for i in lasts])
    traj, k = [], 0
    for x in last:  # the cumsum of the shifted is_last_step: the trajectory index of each row
        traj.append(k)
        k += int(x)
    out = []
    for i, r in enumerate(rows):
        n = len(r["response_ids"])
        a = round(adv[traj[i]], 6)
        out.append(
            {
                "global_step": r["global_step"],
                "trajectory_ids": r["trajectory_ids"],
                "is_last_step": r.get("is_last_step") if step_wise else None,
                "advantages": [a] * n,
                "response_mask": [1] * n,
                "loss_mask": r["loss_masks"],
                "advantage_estimator": "grpo",
                "grpo_norm_by_std": True,
            }
        )
    return out


def _step_rows(ep: Episode, instance: str, rep: int, reward: float) -> list[dict]:
    """An episode as step-wise training writes it (skyrl_gym_generator.py:477-496, 872-897): one row per
    turn, the turn's context as prompt, its output and the observation after it as response."""
    out = []
    for k, (ctx, o, lp, obs) in enumerate(zip(ep.contexts(), ep.outputs, ep.logprobs, ep.observations)):
        last = k == len(ep.outputs) - 1
        out.append(
            {
                "prompt_token_ids": ctx,
                "response_ids": o + obs,
                "rewards": reward if last else 0.0,
                "loss_masks": [1] * len(o) + [0] * len(obs),
                "stop_reasons": "stop",
                "rollout_logprobs": lp + [0.0] * len(obs),
                "trajectory_ids": {"instance_id": instance, "repetition_id": rep},
                "is_last_step": last,
                "global_step": 5,
                "engine_calls": [{"prompt_token_ids": ctx, "response_ids": list(o)}],
            }
        )
    return out


def _episodes() -> list[list[dict]]:
    """Two instances, two repetitions each, as step-wise rows per episode."""
    return [
        _step_rows(episode(80 + 10 * k + rep, turns), inst, rep, float(rep == k))
        for k, (inst, turns) in enumerate((("gsm8k-17", 2), ("search-4", 3)))
        for rep in range(2)
    ]


def _step_wise() -> list[dict]:
    """generator.step_wise_trajectories=true: the episodes' rows in order, then the trainer's records."""
    rows = [r for ep in _episodes() for r in ep]
    return rows + trainer_records(rows)


def _step_wise_interleaved() -> list[dict]:
    """A generator that returns the steps of two episodes interleaved (search-4's two repetitions
    alternate): SkyRL's is_last_step cumsum then broadcasts one episode's advantage to the other's
    steps (trainer.py:1171-1180; its assertion only checks the count of last steps)."""
    eps = _episodes()
    a, b = eps[2], eps[3]
    mixed = [a[0], b[0], a[1], b[1], a[2], b[2]]
    rows = [r for ep in eps[:2] for r in ep] + mixed
    return rows + trainer_records(rows)


def _abort_in_statistics() -> list[dict]:
    """apply_overlong_filtering=true: an engine abort's row has stop_reasons "abort", so the filter
    zeroes its loss mask (generators/utils.py:349-371) but its reward 0 stays in its group's GRPO mean
    and std (ppo_utils.py:1367-1390), shifting the baseline of the rows that are trained."""
    rows = _batch(False)
    rows[1]["stop_reasons"] = "abort"
    rows[1]["rewards"] = 0.0
    rows[1]["loss_masks"] = [0] * len(rows[1]["loss_masks"])
    rows[0]["rewards"] = 1.0
    return rows + trainer_records(rows)


def _zero_variance_filtered() -> list[dict]:
    """trainer.algorithm.zero_variance_filter=true: gsm8k-17's two rows both scored 1.0, so the trainer
    zeroes their loss masks after the sampler hook (trainer.py:1086-1101); the trainer's records show
    the masks it trains with."""
    rows = _batch(False)
    rows[0]["rewards"] = rows[1]["rewards"] = 1.0
    out = trainer_records(rows)
    for t in out[:2]:
        t["loss_mask"] = [0] * len(t["loss_mask"])
    return rows + out


def _trainer_mask_trains_more() -> list[dict]:
    """A trainer whose loss mask differs from the one the generator dumped: the row trains the
    observation tokens the dump masked (an override of postprocess_generator_output, the place SkyRL
    names for loss-mask post-processing, trainer.py:1027, that rebuilds the masks)."""
    rows = _batch(False)
    out = trainer_records(rows)
    out[3]["loss_mask"] = [1] * len(out[3]["loss_mask"])
    return rows + out


def with_routes(rec: dict, appended: bool = False, lost_after: int | None = None) -> dict:
    """`rec` as a run with generator.inference_engine.enable_return_routed_experts keeps it: each call
    returns routes for its whole input and output but the last token, and the agent loop replaces
    its array with them (skyrl_gym_generator.py:1122-1126), cut at the response's end (:556-558); per
    call the hook's `rollout_expert_indices_start` (0), `rollout_expert_indices_rows` (the rows the engine returned) and
    `rollout_expert_indices_len` (the loop's rows after its update). `appended`: a generator that
    appends each call's rows instead; `lost_after`: the calls from that one on returned no routes, and
    the loop kept what it had (:1122: `if rollout_expert_indices_for_turn is not None`)."""
    kept: list = []
    for t, call in enumerate(rec["engine_calls"]):
        seq = call["prompt_token_ids"] + call["response_ids"]
        new = [] if lost_after is not None and t >= lost_after else routes(seq, 0, len(seq) - 1, rec["global_step"])
        if new:
            kept = kept + new if appended else new
        call["rollout_expert_indices_start"] = 0  # the engine routes the call's whole input
        call["rollout_expert_indices_rows"], call["rollout_expert_indices_len"] = len(new), len(kept)
    rec["rollout_expert_indices"] = kept[: len(rec["prompt_token_ids"]) + len(rec["response_ids"])]
    return rec


DAPO_CONTEXT = {"max_generate_length": 64, "overlong_buffer_len": 32, "overlong_buffer_penalty_factor": 1.0}


def dapo(rows: list[dict]) -> list[dict]:
    """The DAPO example trainer's soft overlong punishment (examples/train/algorithms/dapo/main_dapo.py:
    38-79) on `rows`, recorded by the dump placed at the end of its postprocess_generator_output: the
    penalty from `len(response_ids)` (:55, :62-70), subtracted from the reward, and kept as
    `overlong_penalty`."""
    L, B, f = (
        DAPO_CONTEXT[k] for k in ("max_generate_length", "overlong_buffer_len", "overlong_buffer_penalty_factor")
    )
    for r in rows:
        n = len(r["response_ids"])
        penalty = -(n - (L - B)) / B * f if L - B < n <= L else 0.0
        r["rewards"] = r["rewards"] + penalty
        r["overlong_penalty"] = penalty
    return rows


def _single_turn_long() -> list[dict]:
    """Single-turn samples (the DAPO example's setting, main_dapo.py:58) of 41 tokens: inside the buffer."""
    return [
        record(episode(90 + 10 * k + rep, 1, words=40), inst, rep, float(rep))
        for k, inst in enumerate(("gsm8k-17", "aime-3"))
        for rep in range(2)
    ]


def cases() -> dict[str, list[dict]]:
    """The SkyRL fixture cases."""
    compliant = _batch(False)
    return {
        "compliant": compliant,
        "trainer": compliant + trainer_records(compliant),
        "eos_appended_logprob_zero": _batch(True),
        "assistant_header_trained": _assistant_header_trained(),
        "multi_step": _step(3, 60, False) + _step(4, 70, True),
        "fully_async": _fully_async(),
        "step_wise": _step_wise(),
        "step_wise_interleaved": _step_wise_interleaved(),
        "abort_in_group_statistics": _abort_in_statistics(),
        "zero_variance_filtered": _zero_variance_filtered(),
        "trainer_mask_trains_more": _trainer_mask_trains_more(),
        "compliant_moe": [with_routes(r) for r in _batch(False)],
        "routes_appended_each_turn": [with_routes(r, appended=True) for r in _batch(False)],
        "routes_lost_after_first_turn": [with_routes(r, lost_after=1) for r in _batch(False)],
        "compliant_dapo": dapo(_single_turn_long()),
        "dapo_penalty_counts_observations": dapo(_batch(False)),
    }
