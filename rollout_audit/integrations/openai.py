"""Record an agent's session with an OpenAI-compatible server (vLLM, SGLang) for the audit.

`SessionRecorder` posts chat or completions requests with the options that make the server return
what the contract needs (vLLM `return_token_ids`: the engine's prompt ids and sampled ids; per-token
log-probs) and appends each request/response pair, as sent and as received, to a JSON Lines file;
`end()` appends what only the agent loop knows (stop cause, reward, policy version).
`rollout-audit check --from openai FILE` converts and audits it. Standard library only (urllib)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# what the contract needs back from the server, added to every request unless the caller sets it
CHAT_OPTIONS = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}
COMPLETION_OPTIONS = {"logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}


class SessionRecorder:
    """One agent session (one episode) against `base_url` (…/v1), appended to `path`.

    `logprobs_mode` is how the server was started (vLLM `--logprobs-mode`: "raw_logprobs", the default,
    or "processed_logprobs"); it is written with every pair so a reader knows what the numbers are."""

    def __init__(
        self,
        base_url: str,
        path: str | Path,
        session: str,
        *,
        model: str | None = None,
        logprobs_mode: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.path = Path(path)
        self.session = session
        self.model = model
        self.logprobs_mode = logprobs_mode
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.timeout = timeout
        self.turn = 0

    def chat(self, messages: Sequence[Mapping[str, Any]], **params: Any) -> dict[str, Any]:
        """POST /chat/completions (temperature, top_p, max_tokens… as keyword arguments); the response."""
        return self._call("chat/completions", {"messages": list(messages), **CHAT_OPTIONS, **params})

    def complete(self, prompt: str | Sequence[int], **params: Any) -> dict[str, Any]:
        """POST /completions with a text or token-id prompt (token in, token out); the response."""
        body = {"prompt": prompt if isinstance(prompt, str) else list(prompt), **COMPLETION_OPTIONS, **params}
        return self._call("completions", body)

    def end(
        self,
        *,
        stop_reason: str | None = None,
        reward: float | None = None,
        policy_version: int | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
    ) -> None:
        """Append the episode's outcome as the agent loop knows it (only the values given)."""
        given = {"stop_reason": stop_reason, "reward": reward, "policy_version": policy_version}
        given |= {"task_id": task_id, "group_id": group_id}
        self._append({"session": self.session, "end": {k: v for k, v in given.items() if v is not None}})

    def _call(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send one request, record the pair, return the parsed response."""
        if self.model is not None:
            body.setdefault("model", self.model)
        req = urllib.request.Request(
            f"{self.base_url}/{endpoint}", data=json.dumps(body).encode(), headers=self.headers, method="POST"
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            response = json.loads(resp.read())
        line = {"session": self.session, "turn": self.turn, "endpoint": endpoint, "request": body}
        line |= {"response": response, "logprobs_mode": self.logprobs_mode}
        self._append(line)
        self.turn += 1
        return response

    def _append(self, record: dict[str, Any]) -> None:
        """One JSON line, flushed (a crash keeps the pairs already recorded)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, separators=(",", ":")) + "\n")
