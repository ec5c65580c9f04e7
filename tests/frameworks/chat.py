"""A tiny deterministic ChatML-like token world for the framework fixtures: Qwen's special ids,
content tokens from a seeded generator, and multi-turn tool episodes as the engine saw them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

IM_START, IM_END, NL = 151644, 151645, 198  # <|im_start|>, <|im_end|> (eos), "\n"
SYSTEM, USER, ASSISTANT = 8948, 872, 77091  # "system", "user", "assistant"
TOOL_OPEN, TOOL_CLOSE = 151657, 151658  # <tool_call>, </tool_call>
RESP_OPEN, RESP_CLOSE = 151665, 151666  # <tool_response>, </tool_response>


def header(role: int) -> list[int]:
    """`<|im_start|>role\\n`."""
    return [IM_START, role, NL]


@dataclass
class Episode:
    """One multi-turn episode: the prompt, then per turn the engine's output (ids, log-probs) and
    the observation appended after it (empty after the last turn)."""

    prompt: list[int]
    outputs: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    observations: list[list[int]] = field(default_factory=list)

    def response(self) -> list[int]:
        """Everything after the prompt, in order."""
        return [t for out, obs in zip(self.outputs, self.observations) for t in (*out, *obs)]

    def contexts(self) -> list[list[int]]:
        """The ids the engine was given for each turn."""
        ctx, out = list(self.prompt), []
        for o, obs in zip(self.outputs, self.observations):
            out.append(list(ctx))
            ctx += o + obs
        return out

    def mask(self) -> list[int]:
        """1 on the engine's output, 0 on observations."""
        return [m for o, obs in zip(self.outputs, self.observations) for m in [1] * len(o) + [0] * len(obs)]

    def response_logprobs(self) -> list[float]:
        """The engine's log-probs, 0.0 on observation tokens (the frameworks' placeholder)."""
        return [x for lp, obs in zip(self.logprobs, self.observations) for x in [*lp, *[0.0] * len(obs)]]


def episode(
    seed: int, n_turns: int, *, separator: bool = True, words: int = 5, end: list[int] | None = None
) -> Episode:
    """A tool episode of `n_turns` assistant turns: each but the last calls a tool whose response
    follows (with the `\\n` turn separator after `<|im_end|>` unless `separator` is False); the last
    answers and ends with `end` (default `<|im_end|>`, sampled)."""
    rng = random.Random(seed)

    def text(k: int) -> list[int]:
        return [rng.randrange(1000, 30000) for _ in range(k)]

    ep = Episode(
        prompt=[*header(SYSTEM), *text(6), IM_END, NL, *header(USER), *text(words + 3), IM_END, NL, *header(ASSISTANT)]
    )
    for t in range(n_turns):
        last = t == n_turns - 1
        out = (
            text(words) + ([IM_END] if end is None else end) if last else [TOOL_OPEN, *text(words), TOOL_CLOSE, IM_END]
        )
        obs = (
            []
            if last
            else [
                *([NL] if separator else []),
                *header(USER),
                RESP_OPEN,
                *text(words),
                RESP_CLOSE,
                IM_END,
                NL,
                *header(ASSISTANT),
            ]
        )
        ep.outputs.append(out)
        ep.logprobs.append([round(-rng.uniform(0.01, 2.0), 4) for _ in out])
        ep.observations.append(obs)
    return ep
