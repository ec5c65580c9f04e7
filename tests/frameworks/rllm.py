"""rLLM fixtures: `Episode.to_dict()` records (rllm/agents/agent.py, ModelOutput.to_dict in
rllm/engine/rollout/rollout_engine.py), two-step tool-use episodes with a cumulative prompt.

Shapes as at rllm-org/rllm 9beb6e0: `Step.advantage: list[float] | float | None` and
`Step.weight_version` (rllm/types.py:135-136, in `to_dict` :198-199); `Episode.termination_reason`
dumped as its value (rllm/types.py:324, :360; values rllm/workflows/workflow.py:18-25).
Cases dumped after `compute_advantages` (rllm/trainer/unified_trainer.py:567) carry the step as
`global_step` (the trainer's `trainer_state.global_step`, unified_trainer.py:92) and every step's
advantage as rLLM's broadcast mode sets it: `float(advantage)` of its trajectory on every step
(rllm/trainer/algorithms/advantage.py:227-232), GRPO per group `f"{task_id}:{name}"`
(transform.py:105-146) as `calculate_grpo_advantages_per_group` computes it (rl_algo.py:6-18:
population std, and a group of one gets mean 0 and std 1, so its advantage is its raw reward).
Compact filtering (`CompactFilteringConfig`, rllm/trainer/algorithms/config.py:111-161, defaults of
rllm/trainer/config/rllm/base.yaml:111-120) skips an episode before grouping (transform.py:118-122):
it keeps its reward (0.0 by the workflow) and no advantage.

Contract 1.3: `compliant_routes` (the compliant group with the verl engine's R3 `routing_matrices` on
every step) and `routes_across_weight_sync` (a weight sync between two turns: the last step's routes,
which rLLM replays, re-routed the first turn's tokens with the newer weights)."""

from __future__ import annotations

import base64
import copy
import json
import statistics
from typing import Any

import numpy as np

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


EPS = 1e-6  # rl_algo.calculate_grpo_advantages_per_group's epsilon


def grpo(rewards: list[float]) -> list[float]:
    """rLLM's GRPO advantages of one group (rl_algo.py:6-18): population std, mean 0 / std 1 for one member."""
    mean, std = (0.0, 1.0) if len(rewards) <= 1 else (statistics.fmean(rewards), statistics.pstdev(rewards))
    return [(r - mean) / (std + EPS) for r in rewards]


def _after_advantages(episodes: list[dict], step: int, dropped: set[str]) -> list[dict]:
    """The episodes as a dump after compute_advantages sees them: `global_step`, and on every step of
    a grouped trajectory its group's GRPO advantage (episodes ending in `dropped` are not grouped)."""
    groups: dict[str, list[dict]] = {}
    for ep in episodes:
        ep["global_step"] = step
        if ep["termination_reason"] not in dropped:
            groups.setdefault(ep["id"].split(":")[0], []).append(ep)
    for members in groups.values():
        for ep, adv in zip(members, grpo([m["trajectories"][0]["reward"] for m in members])):
            for st in ep["trajectories"][0]["steps"]:
                st["advantage"] = adv
    return episodes


FILTERED = {"max_prompt_length_exceeded", "max_response_length_exceeded", "max_turns_exceeded", "timeout", "error"}


def compact_filtering() -> list[dict]:
    """A step of a run with `rllm.compact_filtering.enable: True` (base.yaml flags): task-7's group
    has two finished episodes, one cut at the response budget and one errored, both with the
    workflow's reward 0.0 and dropped by the filter; task-9's two finished episodes both succeed
    (a degenerate group: advantage 0), and a timed-out one is dropped."""
    eps = [
        _episode("task-7:0", 0, "env_done", True, 1.0),
        _episode("task-7:1", 1, "env_done", False, 0.0),
        _episode("task-7:2", 2, "max_response_length_exceeded", False, 0.0),
        _episode("task-7:3", 3, "error", False, 0.0),
        _episode("task-9:0", 4, "env_done", True, 1.0),
        _episode("task-9:1", 5, "env_done", True, 1.0),
        _episode("task-9:2", 6, "timeout", False, 0.0),
    ]
    return _after_advantages(eps, 12, FILTERED)


def grpo_group_of_one() -> list[dict]:
    """task-9 has a single rollout in the batch: rLLM's GRPO gives it mean 0 and std 1, so its
    advantage is its raw reward (1.0) instead of 0 (no relative signal in a group of one)."""
    eps = [
        _episode("task-7:0", 0, "env_done", True, 1.0),
        _episode("task-7:1", 1, "env_done", False, 0.0),
        _episode("task-9:0", 4, "env_done", True, 1.0),
    ]
    return _after_advantages(eps, 12, FILTERED)


def rewards_normalised_per_trajectory() -> list[dict]:
    """An AgentFlow whose multi-trajectory evaluator sets each trajectory's reward itself, normalised
    over the trajectory's own steps (alibaba/ROLL#397's grouping by trajectory: R - R = 0): rLLM keeps
    a reward the flow set (rllm/engine/agentflow_engine.py:692-695) and takes `is_correct` from the
    evaluator's verdict (:698), so two groups of two hold one success each and every reward is 0.0."""
    return [
        _episode("task-7:0", 0, "env_done", True, 0.0),
        _episode("task-7:1", 1, "env_done", False, 0.0),
        _episode("task-9:0", 4, "env_done", True, 0.0),
        _episode("task-9:1", 5, "env_done", False, 0.0),
    ]


# ---------------------------------------------------------------- the trainer side (dump_batch)


def batch_row(ep: dict, cap: int | None = None, episode_id: str | None = None) -> dict:
    """The DataProto row rLLM trains for the episode's (one, prefix-merged) trajectory, as `dump_batch`
    writes it (rllm/trainer/verl/transform.py at 9beb6e0): the first step's prompt, the response
    [A0, obs1, A1] with mask 1 on the actions (`_process_trajectory`), cut to `cap` tokens
    (`_pad_sequence_batch`, :38), the reward on the last response token unless the cut removed it
    (`_build_step_and_trajectory_rewards`, :71-74), the broadcast advantage on the mask
    (`update_dataproto_with_advantages`), the engine's log-probs (0.0 on observations). `episode_id`:
    what `episode_ids` holds (the episode's id; the group's id on the fully-async path, :449)."""
    traj = ep["trajectories"][0]
    s0, s1 = (st["model_output"] for st in traj["steps"])
    obs = s1["prompt_ids"][len(s0["prompt_ids"]) + len(s0["completion_ids"]) :]
    response = s0["completion_ids"] + obs + s1["completion_ids"]
    mask = [1] * len(s0["completion_ids"]) + [0] * len(obs) + [1] * len(s1["completion_ids"])
    lps = s0["logprobs"] + [0.0] * len(obs) + s1["logprobs"]
    reward = 0.0 if traj["reward"] is None else traj["reward"]
    rewards = [0.0] * (len(response) - 1) + [reward]
    if cap is not None and len(response) > cap:
        response, mask, lps, rewards = response[:cap], mask[:cap], lps[:cap], [0.0] * cap
    adv = traj["steps"][0]["advantage"] or 0.0
    return {
        "global_step": ep["global_step"],
        "step_ids": traj["uid"],
        "episode_ids": episode_id or ep["id"],
        "group_roles": traj["name"],
        "is_pad_step": False,
        "prompts": s0["prompt_ids"],
        "responses": response,
        "response_mask": mask,
        "traj_rewards": rewards,
        "advantages": [adv * m for m in mask],
        "rollout_log_probs": lps,
    }


def trainer(cap: int | None = None, fully_async: bool = False) -> list[dict]:
    """A step of two rollouts of task-7 (solved, failed) after advantages: the episodes as `dump_episodes`
    writes them (with `global_step`), then the batch rows. `cap`: the solved rollout's row is cut to that
    many response tokens, as transform_to_backend_batch cuts a merged multi-turn row
    (verl_backend.py:448-451: the cap is max_prompt_length + max_response_length, the per-turn
    generation cap plus the prompt's); `fully_async`: the rows come from
    transform_trajectory_groups_to_dataproto (episode_ids hold the group's id)."""
    eps = _after_advantages(
        [_episode("task-7:0", 0, "env_done", True, 1.0), _episode("task-7:1", 1, "env_done", False, 0.0)], 12, FILTERED
    )
    rows = [batch_row(ep, cap if ep["id"] == "task-7:0" else None, "task-7" if fully_async else None) for ep in eps]
    return eps + rows


# ---------------------------------------------------------------- MoE routing replay (R3)

LAYERS, TOP_K, EXPERTS = 2, 2, 8  # a tiny MoE: positions x layers x top-k expert ids


def routing_matrices(rows: int, seed: int) -> list[str]:
    """ModelOutput.routing_matrices as rLLM's verl engine writes them (verl_engine.py:144-148): a JSON
    header of the shape past the first axis and the dtype (verl's int16, verl#7407), and the base64 of
    the array's bytes."""
    arr = np.random.default_rng(seed).integers(0, EXPERTS, (rows, LAYERS, TOP_K), dtype=np.int16)
    header = json.dumps({"shape": [LAYERS, TOP_K], "dtype": str(arr.dtype)})
    return [header, base64.b64encode(arr.tobytes()).decode("ascii")]


def with_routes(ep: dict, seed: int, versions: tuple[int, int] | None = None) -> dict:
    """`ep` with R3 routes on every step: verl's server (vLLM) returns the routes of every position fed
    through the model, the step's prompt and all but its last sampled token; Step.to_dict carries them
    (rllm/types.py:187). `versions`: each step's weight_version (a weight sync between the turns, with
    rLLM's turn-level gating, rllm/trainer/algorithms/config.py:94)."""
    ep = copy.deepcopy(ep)
    for k, step in enumerate(ep["trajectories"][0]["steps"]):
        out = step["model_output"]
        out["routing_matrices"] = routing_matrices(len(out["prompt_ids"]) + len(out["completion_ids"]) - 1, seed + k)
        step["routing_matrices"] = out["routing_matrices"]
        if versions is not None:
            out["weight_version"] = step["weight_version"] = versions[k]
    return ep


def compliant_routes(sync_between_turns: bool = False) -> list[dict]:
    """The compliant group with routing replay; with `sync_between_turns`, rollout 1's second step was
    sampled after a weight sync (version 4): rLLM's transform keeps the routes of a segment's last routed
    step (transform.py:336-360), whose prefill re-routed the first step's tokens with the new weights."""
    return [
        with_routes(ep, 10 * n, (3, 4) if sync_between_turns and n == 1 else None) for n, ep in enumerate(compliant())
    ]


def cases() -> dict[str, list[dict]]:
    return {
        "compliant_routes": compliant_routes(),
        "routes_across_weight_sync": compliant_routes(sync_between_turns=True),
        "trainer_compliant": trainer(),
        "trainer_fully_async": trainer(fully_async=True),
        "trainer_row_cut_at_cap": trainer(cap=10),
        "compliant": compliant(),
        "logprobs_missing": logprobs_missing(),
        "compact_filtering": compact_filtering(),
        "grpo_group_of_one": grpo_group_of_one(),
        "rewards_normalised_per_trajectory": rewards_normalised_per_trajectory(),
    }
