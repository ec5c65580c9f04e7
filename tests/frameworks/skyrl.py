"""SkyRL fixtures: per-sample records of `GeneratorOutput` (skyrl/train/generators/base.py) as the
dump hook writes them. Cases: `compliant`, `eos_appended_logprob_zero` (NovaSky-AI/SkyRL#758:
the generator appends an EOS the engine did not sample, with loss_masks 1 and rollout_logprobs 0.0,
when the last turn stopped on a stop string), `multi_step` (two training steps that draw the same
prompts again, one sample cut at the length limit under `apply_overlong_filtering`) and
`fully_async` (groups as the fully-async trainer's hook writes them).

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

from .chat import IM_END, Episode, episode

STOP_STR = 151659  # a stop string's last token ("</answer>"), not the eos


def record(ep: Episode, instance: str, rep: int, reward: float) -> dict:
    """One sample as the hook writes it: the sample's element of each GeneratorOutput list."""
    return {
        "prompt_token_ids": ep.prompt,
        "response_ids": ep.response(),
        "rewards": reward,
        "loss_masks": ep.mask(),
        "stop_reasons": "stop",
        "rollout_logprobs": ep.response_logprobs(),
        "trajectory_ids": {"instance_id": instance, "repetition_id": rep},
        "global_step": 3,
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


def cases() -> dict[str, list[dict]]:
    """The SkyRL fixture cases."""
    return {
        "compliant": _batch(False),
        "eos_appended_logprob_zero": _batch(True),
        "multi_step": _step(3, 60, False) + _step(4, 70, True),
        "fully_async": _fully_async(),
    }
