"""OpenPipe ART fixtures: `TokenizedTrajectoryGroup.model_dump(mode="json")` lines (art/trajectories/
__init__.py:1366 at 0.5.23): each member a `TokenizedTrajectory` (:1192-1260) with `tokens`,
`logprobs` (NaN written as the string "NaN", `ser_json_inf_nan="strings"`) and `flags` (`TokenFlag`,
:155-175), and its source `trajectory` (:605-625) with `reward`, the policy versions and the
chat_completions exchanges (request, and the vLLM response with `prompt_token_ids` and
`choices[0].token_ids`). The `history` is left out: the reader does not use it. The same ChatML-style
ids as the `openai` fixtures. openpipe-art pulls torch and a training stack, so these are written
from its source."""

from __future__ import annotations

from .openai import HEADER, P0, TOOL

EXACT, SAMPLED, ASSISTANT, STOP, OUTPUT = 1, 2, 4, 8, 16
GEN = EXACT | SAMPLED | ASSISTANT | OUTPUT


def _exchange(prompt: list[int], ids: list[int], finish: str) -> dict:
    request = {"model": "policy", "messages": [{"role": "user", "content": "open the door"}], "temperature": 1.0,
               "top_p": 1.0, "logprobs": True, "extra_body": {"return_token_ids": True}}  # fmt: skip
    response = {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "open"}, "finish_reason": finish,
                     "logprobs": None, "token_ids": ids}],
        "prompt_token_ids": prompt,
    }  # fmt: skip
    return {"start_time": "2026-10-01T00:00:00Z", "end_time": "2026-10-01T00:00:01Z", "request": request,
            "response": response}  # fmt: skip


def _member(n: int, reward: float, *, tool_row: list[int] = TOOL, versions: tuple[int, int] = (5, 5),
            nan_at: int | None = None) -> dict:  # fmt: skip
    """Two calls (a tool call, then the answer). `tool_row`: the tool reply as ART's client-side render
    wrote it into the row (the engine got TOOL); `nan_at`: a sampled position whose log-prob the server
    did not return."""
    a0, a1 = [50 + n, 51, 2], [60 + n, 61, 62, 2]
    lp0, lp1 = [-0.5 - 0.01 * n, -0.25, -0.125], [-0.75, -0.375 - 0.01 * n, -0.0625, -0.03125]
    tokens = P0 + a0 + tool_row + HEADER + a1
    flags = [0] * len(P0) + [GEN, GEN, GEN | STOP] + [0] * len(tool_row + HEADER) + [GEN, GEN, GEN, GEN | STOP]
    logprobs: list[float | str] = ["NaN"] * len(P0) + lp0 + ["NaN"] * len(tool_row + HEADER) + lp1
    if nan_at is not None:
        logprobs[nan_at] = "NaN"
    trajectory = {
        "exchanges": {
            "chat_completions": [_exchange(P0, a0, "tool_calls"), _exchange(P0 + a0 + TOOL + HEADER, a1, "stop")],
            "completions": [],
            "responses": [],
            "messages": [],
        },
        "tools": None,
        "additional_histories": [],
        "reward": reward,
        "initial_policy_version": versions[0],
        "final_policy_version": versions[1],
        "metrics": {},
        "metadata": {},
        "logs": [],
    }
    return {"model": "policy", "tokens": tokens, "logprobs": logprobs, "flags": flags, "trajectory": trajectory}


def _group(*members: dict) -> dict:
    return {"trajectory_group": {"trajectories": [m["trajectory"] for m in members]}, "trajectories": list(members)}


def cases() -> dict[str, list[dict]]:
    return {
        "compliant": [_group(_member(0, 1.0), _member(1, 0.0))],
        # ART's client-side render of the tool reply dropped the newline the engine was given before it:
        # call 1's context is not the row's prefix (M105)
        "render_drops_separator": [_group(_member(0, 1.0, tool_row=TOOL[1:]), _member(1, 0.0))],
        # a sampled token whose log-prob the server did not return, trained all the same (L201)
        "sampled_without_logprob": [_group(_member(0, 1.0, nan_at=len(P0) + 1), _member(1, 0.0))],
        # an asynchronous trajectory sampled across a weight update: ART keeps only the first and last
        # version, so no turn's version is known (P501)
        "versions_span_update": [_group(_member(0, 1.0, versions=(5, 6)), _member(1, 0.0))],
    }
