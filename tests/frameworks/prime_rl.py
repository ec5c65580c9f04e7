"""prime-rl trainer-batch fixtures (prime-rl 559b447): the verifiers traces of one GRPO group
(`frameworks.verifiers._prime_rl_group`) and the batch file the orchestrator writes from them,
`rollouts/step_0/rank_0.bin`: msgpack of `list[MicroBatch]`, each `MicroBatch` an array in its field
order with trailing defaults omitted (transports/rollouts/types.py:74-99; msgspec `array_like=True,
omit_defaults=True`). Samples are packed as `trainer/batch.py:540-617` packs them and the last one is
padded to a multiple of 8 as `batch.py:700-731` pads (id 1, mask false, position ids from 0).
msgspec itself is not installed here; the bytes are msgpack's encoding of those arrays."""

from __future__ import annotations

import copy
from typing import Any

import msgpack

from rollout_audit.adapters import load
from rollout_audit.adapters.base import located

from .verifiers import _prime_rl_group

PAD_TO = 8
GROUP_MEAN = 0.5  # the group's rewards are 1, 1, 0, 0 (verifiers fixture)


def traces() -> list[dict]:
    return _prime_rl_group()


def _samples(group: list[dict]) -> list[dict[str, Any]]:
    """Each trace branch as prime-rl's TrainingSample (trajectories.py: token ids, mask, log-probs)."""
    table = load("verifiers").to_contract([located(t, None) for t in group], trainer="prime-rl", policy_version=3)
    out = []
    for row in table.to_pylist():
        adv = (row["reward"] or 0.0) - GROUP_MEAN
        mask = row["loss_mask"]
        out.append(
            {
                "token_ids": row["token_ids"],
                "mask": mask,
                "logprobs": [lp if lp is not None else 0.0 for lp in row["behavior_logprobs"]],
                "advantages": [adv if m else 0.0 for m in mask],
                "temperatures": [1.0] * len(mask),
            }
        )
    return out


def micro_batch(samples: list[dict[str, Any]]) -> list[Any]:
    """One packed, padded MicroBatch as its positional array (no optional field set)."""
    ids: list[int] = []
    mask: list[bool] = []
    adv: list[float] = []
    lps: list[float] = []
    pos: list[int] = []
    temps: list[float] = []
    lengths: list[int] = []
    for s in samples:
        ids += s["token_ids"]
        mask += s["mask"]
        adv += s["advantages"]
        lps += s["logprobs"]
        pos += list(range(len(s["token_ids"])))
        temps += s["temperatures"]
        lengths.append(len(s["token_ids"]))
    pad = (PAD_TO - len(ids) % PAD_TO) % PAD_TO
    ids += [1] * pad
    mask += [False] * pad
    adv += [0.0] * pad
    lps += [0.0] * pad
    pos += list(range(pad))
    temps += [1.0] * pad
    lengths[-1] += pad
    return [ids, mask, adv, lps, pos, lengths, temps, ["doors"] * len(ids), list(lengths)]


def batch(samples: list[dict[str, Any]]) -> bytes:
    """A rank's file: two micro batches of the samples."""
    half = len(samples) // 2
    return msgpack.packb([micro_batch(samples[:half]), micro_batch(samples[half:])], use_bin_type=True)


def trained_tool_reply(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first sample's mask also covers the tool reply the environment wrote (a renderer that
    marked the whole assistant-turn span, tool output included, as sampled)."""
    out = copy.deepcopy(samples)
    s = out[0]
    row = load("verifiers").to_contract([located(t, None) for t in traces()[:1]], trainer="prime-rl", policy_version=3)
    source = row.column("token_source").to_pylist()[0]
    s["mask"] = [m or src == 3 for m, src in zip(s["mask"], source)]
    return out


def logprobs_shifted(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every sample's log-probs one position late (the engine's list aligned to the input ids rather
    than to the tokens they predict), so the first sampled token of each answer reads the 0.0 of the
    token before it."""
    out = copy.deepcopy(samples)
    for s in out:
        s["logprobs"] = [0.0, *s["logprobs"][:-1]]
    return out


def baseline_dropped(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The raw reward broadcast as the advantage (the group mean never subtracted)."""
    out = copy.deepcopy(samples)
    for s in out:
        s["advantages"] = [a + GROUP_MEAN if m else 0.0 for a, m in zip(s["advantages"], s["mask"])]
    return out


CASES = ("compliant", "tool_reply_trained", "logprobs_shifted", "baseline_dropped", "padding_trained")


def cases() -> dict[str, list[dict]]:
    return {f"{case}/traces": traces() for case in CASES}


def files() -> dict[str, bytes]:
    samples = _samples(traces())
    padded = micro_batch(samples[:1])
    padded[1][-1] = True  # a pack whose padding the loss mask covers
    return {
        "compliant/rollouts/step_0/rank_0.bin": batch(samples),
        "tool_reply_trained/rollouts/step_0/rank_0.bin": batch(trained_tool_reply(samples)),
        "logprobs_shifted/rollouts/step_0/rank_0.bin": batch(logprobs_shifted(samples)),
        "baseline_dropped/rollouts/step_0/rank_0.bin": batch(baseline_dropped(samples)),
        "padding_trained/rollouts/step_0/rank_0.bin": msgpack.packb([padded], use_bin_type=True),
    }
