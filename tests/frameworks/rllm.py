"""rLLM fixtures: `Episode.to_dict()` records (rllm/agents/agent.py, ModelOutput.to_dict in
rllm/engine/rollout/rollout_engine.py), two-step tool-use episodes with a cumulative prompt."""

from __future__ import annotations

import copy
from typing import Any

SYSTEM_USER = [
    1,
    20,
    21,
    22,
    2,
    1,
    23,
    24,
    25,
    2,
    1,
    30,
]  # <im_start> system … <im_end> <im_start> user … / assistant header
OBS = [2, 1, 26, 40, 41, 2, 1, 30]  # end of turn, tool message, assistant header


def _output(prompt: list[int], completion: list[int], logprobs: list[float] | None, finish: str, version: int) -> dict:
    """ModelOutput.to_dict() of one engine call."""
    return {
        "text": None,
        "content": "call",
        "reasoning": None,
        "tool_calls": [],
        "prompt_ids": prompt,
        "completion_ids": completion,
        "multi_modal_inputs": None,
        "logprobs": logprobs,
        "prompt_logprobs": None,
        "routing_matrices": None,
        "prompt_length": len(prompt),
        "completion_length": len(completion),
        "finish_reason": finish,
        "weight_version": version,
        "metrics": None,
    }


def _step(out: dict, reward: float, done: bool, action: Any) -> dict:
    """Step.to_dict() around a model output (prompt/response/logprobs backfilled from it)."""
    return {
        "prompt_ids": out["prompt_ids"],
        "response_ids": out["completion_ids"],
        "logprobs": out["logprobs"] or [],
        "chat_completions": [],
        "observation": None,
        "thought": "",
        "action": action,
        "model_response": out["content"],
        "model_output": out,
        "info": {},
        "reward": reward,
        "done": done,
        "mc_return": reward,
        "advantage": None,
        "weight_version": out["weight_version"],
    }


def _episode(eid: str, seed: int, reason: str, correct: bool, reward: float | None) -> dict:
    """One episode with one two-step trajectory; seed varies the sampled ids."""
    a0 = [50 + seed, 51, 52, 2]
    a1 = [60 + seed, 61, 2]
    p1 = SYSTEM_USER + a0 + OBS
    lp0 = [-0.25 - 0.01 * seed, -0.5, -0.125, -0.0625]
    lp1 = [-0.75, -0.375 - 0.01 * seed, -0.03125]
    finish1 = "length" if reason == "max_response_length_exceeded" else "stop"
    steps = [
        _step(_output(SYSTEM_USER, a0, lp0, "tool_calls", 3), 0.0, False, {"tool": "search", "q": "door"}),
        _step(_output(p1, a1, lp1, finish1, 3), 0.0, True, {"answer": str(seed)}),
    ]
    return {
        "id": eid,
        "task": {"question": "which door?"},
        "termination_reason": reason,
        "is_correct": correct,
        "trajectories": [
            {
                "uid": f"uid-{eid}",
                "name": "solver",
                "task": {"question": "which door?"},
                "steps": steps,
                "reward": reward,
                "info": {},
            }
        ],
        "metrics": {},
        "info": {},
    }


def compliant() -> list[dict]:
    """A group of three rollouts of one task: solved, failed, cut at the turn limit (no reward)."""
    return [
        _episode("task-7:0", 0, "env_done", True, 1.0),
        _episode("task-7:1", 1, "env_done", False, 0.0),
        _episode("task-7:2", 2, "max_turns_exceeded", False, None),
    ]


def logprobs_missing() -> list[dict]:
    """The engine returned no log-probs for the second step of rollout 1 (`ModelOutput.logprobs` None,
    `Step.logprobs` []): rLLM's verl transform pads the missing log-probs with 0.0 and trains on them."""
    eps = compliant()
    bad = copy.deepcopy(eps[1])
    step = bad["trajectories"][0]["steps"][1]
    step["model_output"]["logprobs"] = None
    step["logprobs"] = []
    return [eps[0], bad, eps[2]]


def cases() -> dict[str, list[dict]]:
    return {"compliant": compliant(), "logprobs_missing": logprobs_missing()}
