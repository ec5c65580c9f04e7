"""slime fixtures: `Sample.to_dict()` records (slime/utils/types.py) as the dump hook writes them.
Cases: `compliant`, and `openrlhf_cut_not_truncated` (OpenRLHF-style: a multi-turn episode cut at
the response budget is recorded COMPLETED instead of TRUNCATED, as OpenRLHF's multi-turn agent
never sets truncated)."""

from __future__ import annotations

from .chat import Episode, episode

MAX_RESPONSE = 76  # --rollout-max-response-len of these rollouts: the budget runs out inside turn 3's output


def record(ep: Episode, index: int, group: int, reward: float, status: str = "completed") -> dict:
    """One sample as the hook writes it: the Sample.to_dict() fields the adapter reads."""
    resp = ep.response()
    return {
        "group_index": group,
        "index": index,
        "tokens": ep.prompt + resp,
        "response_length": len(resp),
        "reward": reward,
        "loss_mask": ep.mask(),
        "weight_versions": ["5"] * len(ep.outputs),
        "rollout_log_probs": ep.response_logprobs(),
        "status": status,
    }


def _cut(ep: Episode, limit: int) -> Episode:
    """The episode as the engine left it when the response budget ran out mid-turn."""
    total = 0
    for t, (o, obs) in enumerate(zip(ep.outputs, ep.observations)):
        if total >= limit:
            raise ValueError("the limit falls inside an observation")
        if total + len(o) >= limit:
            keep = limit - total
            return Episode(
                ep.prompt,
                ep.outputs[:t] + [o[:keep]],
                ep.logprobs[:t] + [ep.logprobs[t][:keep]],
                ep.observations[:t] + [[]],
            )
        total += len(o) + len(obs)
    raise ValueError("episode shorter than the limit")


def _batch(cut: bool) -> list[dict]:
    """Two groups of two; with `cut`, sample 3 ran into the budget and is still COMPLETED."""
    out = []
    for i, (group, turns) in enumerate(((0, 1), (0, 1), (1, 3), (1, 3))):
        ep = episode(200 + i, turns)
        if cut and i == 3:
            ep = _cut(episode(200 + i, 6), MAX_RESPONSE)
        out.append(record(ep, i, group, float(i % 2)))
    return out


def cases() -> dict[str, list[dict]]:
    """The slime fixture cases."""
    return {"compliant": _batch(False), "openrlhf_cut_not_truncated": _batch(True)}
