"""verl fixtures: `AgentLoopOutput` records of the tool agent loop as the dump hook writes them
(`rollout_audit.integrations.verl.dump`), with the hook's `engine_calls`. Cases: `compliant`, and
`searchr1_mask_after_reencoding` (Search-R1, built on verl, PeterGriffinJin/Search-R1#20/#21: the
mask of retrieved text was built on a re-encoding of the transcript, so it is shifted against the
tokens the engine sampled and the observation tokens it returned)."""

from __future__ import annotations

from .chat import Episode, episode


def record(ep: Episode, request_id: str, uid: str, reward: float, mask: list[int] | None = None) -> dict:
    """One sample as the hook writes it: AgentLoopOutput's fields, request_id, uid and engine_calls."""
    return {
        "request_id": request_id,
        "uid": uid,
        "prompt_ids": ep.prompt,
        "response_ids": ep.response(),
        "response_mask": ep.mask() if mask is None else mask,
        "response_logprobs": ep.response_logprobs(),
        "reward_score": reward,
        "num_turns": 2 * len(ep.outputs),  # user + assistant + tool turns + 1, as ToolAgentLoop counts
        "extra_fields": {"turn_scores": [], "tool_rewards": []},
        "engine_calls": [{"prompt_ids": c, "token_ids": o} for c, o in zip(ep.contexts(), ep.outputs)],
    }


def shifted(mask: list[int], by: int = 1) -> list[int]:
    """The mask moved right by `by` positions at every boundary: what a mask computed on a
    re-encoding whose tokens merge one position differently looks like against the real tokens."""
    return [mask[0]] * by + mask[:-by]


def _batch(reencoded: bool) -> list[dict]:
    """Two prompts, two samples each; with `reencoded`, sample 1 of the search prompt carries the
    mask built on the re-encoded transcript."""
    out = []
    for k, (uid, turns) in enumerate((("7c1f", 1), ("e2a9", 3))):
        for rep in range(2):
            ep = episode(100 + 10 * k + rep, turns)
            bad = reencoded and k == 1 and rep == 1
            out.append(record(ep, f"{uid}{rep:02d}", uid, float(rep), shifted(ep.mask()) if bad else None))
    return out


def cases() -> dict[str, list[dict]]:
    """The verl fixture cases."""
    return {"compliant": _batch(False), "searchr1_mask_after_reencoding": _batch(True)}
