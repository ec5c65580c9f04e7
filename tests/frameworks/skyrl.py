"""SkyRL fixtures: per-sample records of `GeneratorOutput` (skyrl/train/generators/base.py) as the
dump hook writes them. Cases: `compliant`, and `eos_appended_logprob_zero` (NovaSky-AI/SkyRL#758:
the generator appends an EOS the engine did not sample, with loss_masks 1 and rollout_logprobs 0.0,
when the last turn stopped on a stop string)."""

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


def cases() -> dict[str, list[dict]]:
    """The SkyRL fixture cases."""
    return {"compliant": _batch(False), "eos_appended_logprob_zero": _batch(True)}
