"""The record format of `rollout-audit capture`: what its recorder writes and the `openai` adapter reads.

A capture directory holds one JSON Lines file per session, `<session>.jsonl`. Every line the
recorder writes is one object with `"capture": VERSION` and a `"kind"`:

- `start`: the session's first line: `upstream` (the URL recorded), `recorder` (its version), `started_at`.
- `exchange`: one HTTP exchange, as it went through: `turn` (0, 1, … per session), `method`, `path`
  (the upstream path), `endpoint` (the path after `/v1/`, or after `/` when it has none),
  `dispatched_at` / `completed_at` (Unix seconds), `weight_version` with `weight_version_from`
  (`header`: the request's WEIGHT_HEADER; `set`: the version posted to the recorder; null: none said),
  `request_body` and `response_body` (`body()`: the bytes as sent and as received, a stream's
  Server-Sent Events included, in their HTTP content coding: `request_content_encoding` and
  `content_encoding` name it when there is one, gzip say, and a reader decodes it; null: a body
  over the recorder's limit, forwarded whole but not recorded, with an `incomplete` line saying so),
  `status`, `content_type`, and `error` (null, or why the exchange failed: upstream unreachable,
  closed mid-stream).
- `end`: the session's explicit end (`"end": {stop_reason, reward, policy_version, task_id,
  group_id}`, the values the loop posted), the same object `SessionRecorder.end` writes.
- `incomplete`: the recorder could not record the whole session (`reason`): a client gone mid-stream,
  a body over the recorder's limit, a write that failed. A session with one, without an `end`, or
  none of whose exchanges is a turn (each failed: 502, 504, an error), is not audited: the audit says
  "not run: capture incomplete".

A line is written whole with one `write` and synced to disk before the client receives the response
it records; a recorder killed mid-write leaves at most a torn last line, which a reader skips.
Standard library only: the recorder imports nothing else of rollout-audit."""

from __future__ import annotations

import base64
from typing import Any

VERSION = 1
KEY = "capture"  # the field that marks a line as the recorder's, holding the format version
SESSION_HEADER = "X-Rollout-Session"  # a request's session when its path does not name one
WEIGHT_HEADER = "X-Weight-Version"  # the policy version the trainer says it dispatched the request under
KINDS = ("start", "exchange", "end", "incomplete")
# a session id is a file name: letters, digits, `.`, `_`, `-`, never a hidden file
SESSION_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"


def body(raw: bytes) -> dict[str, str]:
    """A body as a JSON value that gives back its bytes: `{"text": …}` when it is UTF-8 (JSON and
    Server-Sent Events are), else `{"base64": …}`."""
    try:
        return {"text": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode("ascii")}


def raw(field: Any) -> bytes | None:
    """The bytes a `body()` value holds; None when it is not one."""
    if isinstance(field, dict):
        if isinstance(field.get("text"), str):
            return field["text"].encode("utf-8")
        if isinstance(field.get("base64"), str):
            try:
                return base64.b64decode(field["base64"], validate=True)
            except ValueError:
                return None
    return None


def newer(record: Any) -> int | None:
    """The format version of a capture line when it is newer than VERSION (or not a version at all:
    -1), else None."""
    v = record.get(KEY) if isinstance(record, dict) else None
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        return -1
    return v if v > VERSION else None
