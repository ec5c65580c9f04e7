"""verl: the dump hook's writer. `dump` appends one JSON Lines record per agent-loop sample, in
`AgentLoopOutput`'s own field names, to a file per process under a directory (agent-loop workers
are separate Ray processes), for `rollout-audit check --from verl DIR`. No verl import: it reads
the output's attributes, so it runs wherever the agent loop runs."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

# AgentLoopOutput fields the adapter reads (verl/experimental/agent_loop/agent_loop.py)
FIELDS = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "reward_score", "num_turns")
EXTRA = ("turn_scores", "tool_rewards")  # the JSON-safe part of extra_fields that ToolAgentLoop sets


def record(output: Any, **fields: Any) -> dict[str, Any]:
    """The JSON record of one `AgentLoopOutput`, with the hook's own fields (request_id, uid,
    engine_calls) added as given."""
    rec: dict[str, Any] = {k: getattr(output, k, None) for k in FIELDS}
    extra = getattr(output, "extra_fields", None) or {}
    rec["extra_fields"] = {k: extra[k] for k in EXTRA if k in extra}
    rec.update(fields)
    return rec


def dump(directory: str | os.PathLike, output: Any, **fields: Any) -> Path:
    """Append the record of `output` to `directory/verl-<host>-<pid>.jsonl`; returns the file."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"verl-{socket.gethostname()}-{os.getpid()}.jsonl"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record(output, **fields), default=_plain) + "\n")
    return path


def _plain(value: Any) -> Any:
    """Tensors and numpy values as plain lists / numbers (`tolist`), anything else as its string."""
    return value.tolist() if hasattr(value, "tolist") else str(value)
