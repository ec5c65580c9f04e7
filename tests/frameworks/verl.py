"""verl fixtures: `AgentLoopOutput` records of the tool agent loop as the dump hook writes them
(`rollout_audit.integrations.verl.dump`), with the hook's `engine_calls`. Cases: `compliant`,
`tool_separator_dropped` (verl-project/verl#6501, fixed by PR #6921: ToolAgentLoop appends each
tool turn rendered in isolation, so the `\\n` the chat template writes after `<|im_end|>` is missing
at every assistant-to-tool boundary; the engine and the trainer agree, the template's render of
the conversation, which the hook records as `template_ids`, does not), and
`searchr1_mask_after_reencoding` (Search-R1, built on verl, PeterGriffinJin/Search-R1#20/#21: the
mask of retrieved text was built on a re-encoding of the transcript, so it is shifted against the
tokens the engine sampled and the observation tokens it returned)."""

from __future__ import annotations

from .chat import Episode, episode


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
        "extra_fields": {"turn_scores": [], "tool_rewards": []},
        "engine_calls": [
            {"prompt_ids": c, "token_ids": o, "template_ids": r} for c, o, r in zip(ep.contexts(), ep.outputs, renders)
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


def cases() -> dict[str, list[dict]]:
    """The verl fixture cases."""
    return {
        "compliant": _batch(),
        "tool_separator_dropped": _batch("separator"),
        "searchr1_mask_after_reencoding": _batch("reencoded"),
    }
