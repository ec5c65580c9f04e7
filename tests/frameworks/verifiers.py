"""verifiers fixtures: `RolloutOutput` rows with their `trajectory` of `TrajectoryStep`s (verifiers/types.py:
tokens = TrajectoryStepTokens, response = the server's chat completion with vLLM `prompt_token_ids` /
`token_ids`), ChatML-style ids: 1 <|im_start|>, 2 <|im_end|>, 3 newline, 30 assistant, 31 user, 32 system."""

from __future__ import annotations

import base64
import math
import struct

HEADER = [1, 30, 3]  # <|im_start|>assistant\n: the generation prompt
P0 = [1, 32, 3, 20, 21, 2, 3, 1, 31, 3, 22, 23, 24, 2, 3, *HEADER]
USER2 = [3, 1, 31, 3, 25, 26, 2, 3]  # the environment's next user message


def _response(prompt: list[int], ids: list[int], lps: list[float], finish: str) -> dict:
    """The server's chat completion as verifiers stores it in TrajectoryStep.response."""
    return {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "answer"},
                "finish_reason": finish,
                "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": lp} for i, lp in zip(ids, lps)]},
                "token_ids": ids,
            }
        ],
        "prompt_token_ids": prompt,
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
    }


def _step(stored_prompt: list[int], engine_prompt: list[int], ids: list[int], lps: list[float], finish: str) -> dict:
    """A TrajectoryStep: the tokens verifiers stored for training and the raw response."""
    return {
        "prompt": [{"role": "user", "content": "q"}],
        "completion": [{"role": "assistant", "content": "answer"}],
        "response": _response(engine_prompt, ids, lps, finish),
        "tokens": {
            "prompt_ids": stored_prompt,
            "prompt_mask": [0] * len(stored_prompt),
            "completion_ids": ids,
            "completion_mask": [1] * len(ids),
            "completion_logprobs": lps,
            "overlong_prompt": False,
            "is_truncated": False,
        },
        "reward": None,
        "advantage": None,
        "is_truncated": False,
        "trajectory_id": "",
        "extras": {},
    }


def _rollout(n: int, reward: float, drop_header: bool = False) -> dict:
    """A two-turn rollout; with drop_header the second step's stored prompt lacks the assistant header
    the server rendered (PrimeIntellect-ai/verifiers#476: token_prefix_with_turn without add_generation_prompt)."""
    a0, a1 = [50 + n, 51, 52, 2], [60 + n, 61, 2]
    lp0, lp1 = [-0.5, -0.25 - 0.01 * n, -0.125, -0.0625], [-0.75 - 0.01 * n, -0.375, -0.03125]
    engine1 = P0 + a0 + USER2 + HEADER
    stored1 = P0 + a0 + USER2 + ([] if drop_header else HEADER)
    return {
        "example_id": 4,
        "task": "doors",
        "trajectory_id": f"rollout-{n}",
        "prompt": [{"role": "user", "content": "q"}],
        "completion": [{"role": "assistant", "content": "answer"}],
        "answer": "red",
        "info": {},
        "reward": reward,
        "timing": {"generation_ms": 10.0, "scoring_ms": 1.0, "total_ms": 11.0},
        "is_completed": True,
        "is_truncated": False,
        "metrics": {"correct": reward},
        "error": None,
        "stop_condition": "no_tools_called",
        "sampling_args": {"temperature": 0.7, "top_p": 1.0, "max_tokens": 64},
        "trajectory": [_step(P0, P0, a0, lp0, "tool_calls"), _step(stored1, engine1, a1, lp1, "stop")],
    }


def _node(parent: int | None, role: str, ids: list[int], n_scaffold: int = 0, lps: list[float] | None = None) -> dict:
    """A v1 MessageNode record: a sampled assistant node holds its generation prompt, then its completion."""
    sampled = lps is not None
    mask = [False] * n_scaffold + [True] * (len(ids) - n_scaffold) if sampled else [False] * len(ids)
    return {"parent": parent, "message": {"role": role, "content": "text"}, "sampled": sampled, "token_ids": ids,
            "mask": mask, "logprobs": lps or [], "finish_reason": None, "multi_modal_data": None}  # fmt: skip


def _trace(n: int, reward: float) -> dict:
    """A v1 Trace.to_record(): system, user, assistant (tool call), tool, assistant (answer)."""
    a0, a1 = [50 + n, 51, 2], [60 + n, 61, 2]
    nodes = [
        _node(None, "system", [1, 32, 3, 20, 21, 2, 3]),
        _node(0, "user", [1, 31, 3, 22, 23, 2, 3]),
        _node(1, "assistant", HEADER + a0, 3, [-0.5, -0.25 - 0.01 * n, -0.125]),
        _node(2, "tool", [3, 1, 33, 3, 40, 41, 2, 3]),
        _node(3, "assistant", HEADER + a1, 3, [-0.75 - 0.01 * n, -0.375, -0.0625]),
    ]
    sampling = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 64}
    calls = [{"node": k, "model": "policy", "sampling": sampling, "endpoint": "/chat/completions",
              "finish_reason": f, "usage": None, "error": None} for k, f in ((2, "tool_calls"), (4, "stop"))]  # fmt: skip
    return {
        "version": 1,
        "id": f"trace-{n}",
        "verifiers": {"version": "0.2.0", "commit": None},
        "task": {"type": "DoorTask", "data": {"question": "which door?"}, "key": "door-3", "hash": "5f1c"},
        "agent": {"config": {}, "runtime": None, "name": "solver", "trainable": True},
        "tools": [],
        "nodes": nodes,
        "calls": calls,
        "mm_token_type_id_map": {},
        "rewards": {"correct": {"score": reward, "weight": 1.0}},
        "metrics": {"correct": reward},
        "info": {},
        "is_completed": True,
        "ok": True,
        "stop_condition": "agent_completed",
        "errors": [],
    }


# (stop_condition, is_timeout, reward): every way verifiers ends a v1 rollout that is not a plain
# agent_completed (a60a606 and 0.4.0): the ending of a dialogue, a limit (a truncation: no reward under
# the audit's default truncation policy), a stage deadline, an error of a boundary
_STOPS = (
    ("user_closed", False, 1.0),
    ("empty_action", False, 0.0),
    ("max_output_tokens", False, None),
    ("context_length", False, None),
    ("compaction_failed", False, None),
    ("agent_timeout", True, None),
    ("provider_error", False, None),
    ("toolset_error", False, None),
)


def _stopped(n: int, cond: str, timeout: bool, reward: float | None) -> dict:
    """A v1 trace that stopped on `cond`; unscored when `reward` is None, failed on an `*_error`."""
    tr = _trace(n, 0.0)
    tr.update(id=f"trace-{cond}", stop_condition=cond, is_timeout=timeout)
    tr["rewards"] = {} if reward is None else {"correct": {"score": reward, "weight": 1.0}}
    if cond.endswith("_error"):
        tr.update(ok=False, errors=[{"type": "ProviderError", "message": "upstream 400", "status_code": 400}])
    return tr


def _head(tr: dict) -> dict:
    """A trace in the shape of verifiers at a60a606 (v1/trace.py:363-407, graph.py:64-113): no
    `is_timeout`, `timing` and `errors` on the trace; `timestamp`, `is_content`, `advantages`,
    `reference_logprobs`, `loss_weights` on each node."""
    tr = {k: v for k, v in tr.items() if k not in ("is_timeout", "mm_token_type_id_map")}
    tr["timing"] = {"start": 0.0}
    tr["nodes"] = [
        {
            **n,
            "timestamp": 0.0,
            "is_content": [],
            "advantages": None,
            "reference_logprobs": None,
            "loss_weights": None,
        }  # fmt: skip
        for n in tr["nodes"]
    ]
    return tr


def _prime_rl_group() -> list[dict]:
    """One group as prime-rl trains it: four traces of one task, two of them truncated (a `max_turns`
    limit; a last answer cut by `length`) and scored 0.0 like any other, each sampled node stamped
    with prime-rl GRPO's credit `reward - group mean` over its sampled tokens (orchestrator/algo/
    grpo.py:25-45, routing.py:11-34)."""
    rewards = (1.0, 1.0, 0.0, 0.0)
    mean = sum(rewards) / len(rewards)
    out = []
    for n, r in enumerate(rewards):
        tr = _head(_trace(n, r))
        tr["id"] = f"trace-{n}"
        if n == 2:
            tr["stop_condition"] = "max_turns"
        if n == 3:
            tr["calls"][-1]["finish_reason"] = "length"
        for node in tr["nodes"]:
            if node["sampled"]:
                node["advantages"] = [r - mean] * sum(node["mask"])
        out.append(tr)
    return out


# is_content of the trace's nodes (the renderer's body against its scaffold, a60a606 graph.py:92-100)
CONTENT = [[False] * 3 + [True] * 2 + [False] * 2, [False] * 3 + [True] * 2 + [False] * 2,
           [False] * 3 + [True] * 2 + [False], [False] * 4 + [True] * 2 + [False] * 2,
           [False] * 3 + [True] * 2 + [False]]  # fmt: skip
TOOL = 3  # the tool reply's node
ALPHA = 0.1  # prime-rl echo's vetted weight of a tool body (configs/algorithm.py EchoRoleConfig.alpha)


def _echo_group(run_on: bool = False, scaffold: bool = False) -> list[dict]:
    """The group prime-rl trains with `algo.type = "echo"`: the tool reply's body (is_content) carries
    `loss_weights = {"ce": [alpha on the body]}` (orchestrator/algo/echo.py:58-90). `run_on`: the
    selected span runs on to the next message boundary, over the next assistant node's generation
    prompt and first sampled token; `scaffold`: the whole tool span is weighted although the
    renderer marked its wrap as scaffold."""
    out = _prime_rl_group()
    for tr in out:
        for node, content in zip(tr["nodes"], CONTENT):
            node["is_content"] = content
        tool = tr["nodes"][TOOL]
        tool["loss_weights"] = {"ce": [ALPHA if (c or scaffold) else 0.0 for c in tool["is_content"]]}
        if run_on:
            nxt = tr["nodes"][TOOL + 1]
            cut = len(HEADER) + 1
            nxt["loss_weights"] = {"ce": [ALPHA] * cut + [0.0] * (len(nxt["token_ids"]) - cut)}
    return out


def _routes(ids: list[int], salt: int, extra: int = 0) -> dict:
    """A node's expert routes as the hook writes them: the engine's payload encoding (base64 of a uint8
    [tokens, layers=2, top_k=2] array, prime-rl inference/vllm/routed_experts.py:11-33)."""
    rows = len(ids) + extra
    data = bytes((7 * r + 3 * layer + k + salt) % 64 for r in range(rows) for layer in range(2) for k in range(2))
    return {"dtype": "uint8", "shape": [rows, 2, 2], "data": base64.b64encode(data).decode()}


def _moe_episodes(duplicated: bool = False, lost: bool = False) -> list[dict]:
    """prime-rl's dump of a mixture-of-experts run: one `Episode.to_record()` a line (monitors/file.py:
    43-55), its trace's nodes with the routes the engine returned for their tokens, the group's
    episodes generated without a weight update (`run.work.policy` from 3 to 3, dispatcher.py:627-646).
    `duplicated`: the second turn's prefill appended the corrected last row of the first answer
    instead of replacing its placeholder (graph.py `_replace_placeholder_routing_row`); `lost`: the
    second turn's slice fell outside its array and its nodes were left without routes
    (`_attribute_routed_experts`)."""
    out = []
    for n, tr in enumerate(_prime_rl_group()):
        for k, node in enumerate(tr["nodes"]):
            if lost and n == 1 and k >= TOOL:
                continue
            node["routed_experts"] = _routes(node["token_ids"], 5 * n + k, int(duplicated and n == 1 and k == 2))
        tr = {key: v for key, v in tr.items() if v is not None}
        tr["nodes"] = [{key: v for key, v in node.items() if v is not None} for node in tr["nodes"]]
        work = {"type": "train", "step": 3, "policy": {"start": 3, "end": 3}}
        out.append({
            "id": f"episode-{n}", "env": {"id": "doors", "name": "doors"}, "task": tr["task"],
            "group": {"id": "group-0"}, "run": {"type": "train", "id": "run-0", "name": "moe", "work": work},
            "ok": True, "errors": [], "traces": [tr],
        })  # fmt: skip
    return out


def _bf16(x: float) -> float:
    """x rounded to bfloat16 (to nearest, ties to even), the precision of a bf16 trainer's output."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _trainer_annotated(top_p: float) -> list[dict]:
    """Four verifiers 0.4.0 traces (eight sampled nodes of three tokens) whose nodes a trainer annotated
    with its recomputed log-probs (`MessageNode.trainer_logprobs`, graph.py:145-147, the compact layout
    of `logprobs`). At top_p 1 the trainer is a bf16 one: its log-probs are the engine's rounded to
    bfloat16. Below it (the engine's `processed_logprobs`, renormalised over each token's nucleus of
    mass 0.90 to 0.94) the trainer scores the full vocabulary, each token lower by log(mass): −0.19 to
    −0.32 a turn (PrimeIntellect-ai/prime-rl#2600), far from L207's ln 2."""
    out = []
    for n in range(4):
        tr = _trace(n, float(n % 2 == 0))
        for call in tr["calls"]:
            call["sampling"] = {**call["sampling"], "top_p": top_p}
        for k, node in enumerate(n for n in tr["nodes"] if n["sampled"]):
            if top_p < 1:
                masses = [0.90 + 0.01 * ((3 * n + 2 * k + j) % 5) for j in range(len(node["logprobs"]))]
                node["trainer_logprobs"] = [round(lp + math.log(m), 6) for lp, m in zip(node["logprobs"], masses)]
            else:
                node["trainer_logprobs"] = [_bf16(lp) for lp in node["logprobs"]]
        out.append(tr)
    return out


def cases() -> dict[str, list[dict]]:
    return {
        "compliant_prime_rl": _prime_rl_group(),
        "compliant_prime_rl_echo": _echo_group(),
        "prime_rl_echo_on_next_action": _echo_group(run_on=True),
        "prime_rl_echo_on_scaffold": _echo_group(scaffold=True),
        "compliant_prime_rl_moe": _moe_episodes(),
        "prime_rl_routes_duplicated": _moe_episodes(duplicated=True),
        "prime_rl_routes_lost": _moe_episodes(lost=True),
        "v1_compliant": [_trace(0, 1.0), _trace(1, 0.0)],
        "compliant_v1_trainer_logprobs": _trainer_annotated(1.0),
        "v1_top_p_against_full_vocab_trainer": _trainer_annotated(0.9),
        "v1_stop_conditions": [_stopped(n, c, t, r) for n, (c, t, r) in enumerate(_STOPS)],
        "v1_truncation_scored": [
            _stopped(0, "max_output_tokens", False, 0.0),
            _stopped(1, "context_length", False, 0.0),
        ],
        "compliant": [_rollout(0, 1.0), _rollout(1, 0.0)],
        "assistant_header_missing": [_rollout(0, 1.0), _rollout(1, 0.0, drop_header=True)],
    }
