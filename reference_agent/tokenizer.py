"""A fixed word-level tokenizer and the chat/tool-call template of the reference agent."""

from __future__ import annotations

import hashlib

from reference_agent.env import ACTIONS, ALL_OBSERVATIONS

SYSTEM_PROMPT = "you are an agent in a room . call one tool per turn ."
TASK_STATEMENT = "open the door that matches the clue , then finish ."

SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<sys>",
    "</sys>",
    "<user>",
    "</user>",
    "<obs>",
    "</obs>",
    "<call>",
    "</call>",
    "<eos>",
)


def _words() -> list[str]:
    """All plain words of the prompt, task and observations, in first-seen order (deterministic)."""
    seen: dict[str, None] = {}
    for text in (SYSTEM_PROMPT, TASK_STATEMENT, *ALL_OBSERVATIONS):
        for w in text.split():
            seen.setdefault(w, None)
    return [w for w in seen if w not in ACTIONS]


VOCAB: tuple[str, ...] = SPECIAL_TOKENS + ACTIONS + tuple(_words())


class Tokenizer:
    """Whitespace tokenizer over VOCAB; decode(encode(text)) == text for normalised text."""

    def __init__(self) -> None:
        self.vocab = VOCAB
        self.token_to_id = {t: i for i, t in enumerate(VOCAB)}
        self.action_ids = [self.token_to_id[a] for a in ACTIONS]
        digest = hashlib.sha256("\n".join(VOCAB).encode()).hexdigest()[:12]
        self.tokenizer_id = f"keydoor-words-v1-{digest}"

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Text → ids; raises KeyError on an out-of-vocabulary word (no silent <unk>)."""
        return [self.token_to_id[w] for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        """Ids → text (single spaces)."""
        return " ".join(self.vocab[i] for i in ids)

    def declaration(self) -> dict[str, object]:
        """How a reader decodes this tokenizer's ids without importing it: the log's file metadata
        `rollout_log.tokenizer` (each id's text; decoded text joins them with single spaces)."""
        return {"name": self.tokenizer_id, "vocabulary": list(self.vocab)}

    def render(self, messages: list[tuple[str, str]], generation_prompt: bool = True) -> list[int]:
        """The chat template: ids of a conversation of (role, text) messages, rendered whole.

        system → <sys> … </sys>, user → <user> … </user>, tool → <obs> … </obs>, assistant →
        <call> action </call> (a `finish` call closes the episode: <call> finish <eos>); with
        `generation_prompt`, the <call> that opens the next assistant turn. The collector builds its
        sequence token by token; this render is the context a deployed agent is given, logged per
        turn (template_context_length / template_context_sha256) so the audit can compare the two.
        """
        out: list[int] = []
        for role, text in messages:
            if role == "assistant":
                out += [self.id("<call>"), *self.encode(text), self.id("<eos>" if text == "finish" else "</call>")]
            else:
                opening = {"system": "<sys>", "user": "<user>", "tool": "<obs>"}[role]
                out += [self.id(opening), *self.encode(text), self.id("</" + opening[1:])]
        return out + [self.id("<call>")] if generation_prompt else out

    def id(self, token: str) -> int:
        """Id of one token."""
        return self.token_to_id[token]

    def action_of(self, token_id: int) -> str:
        """Action name of an action token id."""
        return ACTIONS[self.action_ids.index(token_id)]
