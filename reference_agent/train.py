"""Collection in groups, GRPO actor + shaped-return critic update, compliant logging, greedy evaluation.

Advantage: GRPO group-relative on the episode reward, A_i = (R_i − mean_g) / (std_g(ddof=1) + 1e-6),
broadcast to every policy token of the episode (token reduction: the loss is divided by the number of
loss-mask tokens in the batch). Each collection round is reused for `epochs` optimizer steps with a
PPO-clipped ratio against the logged behaviour log-probs (one update record and checkpoint per step,
so the policy lag is at most epochs − 1). The critic regresses V(h_t) on the potential-shaped
discounted return-to-go; its values fill the turn `value` / `td_residual` fields and the truncation
bootstrap. Because Φ(s_0) = 0 and Φ = 0 at terminal states, shaping cannot change a trajectory-level
advantage; it shapes the critic's targets (lesson “Potential-based reward shaping”). Excluded episodes (truncated under policy
`exclude`, infra errors) carry a null reward and are in no update.

The file reads in the order a run executes: 1 configuration, 2 setup, 3 rollout collection,
4 rewards and advantages, 5 loss and update, 6 logging the rollout log, 7 evaluation; `train`
then strings the phases together, one line each.

Run: python -m reference_agent.train --profile smoke --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_agent.env import (
    ACTIONS,
    ALL_OBSERVATIONS,
    COLOURS,
    ENVIRONMENT_ID,
    ENVIRONMENT_VERSION,
    OBS_RESET,
    VERIFIER_VERSION,
    KeyDoorEnv,
    controller_mask,
    state_checksum,
    verify,
)
from reference_agent.logging import open_writer, to_table
from reference_agent.policy import (
    PolicyConfig,
    RecurrentActorCritic,
    decoding_distribution,
    kept_actions,
    load_checkpoint,
    sample_action,
    save_checkpoint,
)
from reference_agent.tokenizer import SYSTEM_PROMPT, TASK_STATEMENT, Tokenizer

# ── 1. Configuration ─────────────────────────────────────────────────────────────────────────────
SRC_SYSTEM, SRC_USER, SRC_POLICY, SRC_OBS, SRC_TEMPLATE = 0, 1, 2, 3, 4
# the most tokens one turn adds: <call> action </call> <obs> observation </obs>
TURN_TOKENS = 5 + max(len(o.split()) for o in ALL_OBSERVATIONS[1:])
GRPO_EPS = 1e-6


@dataclass
class TrainConfig:
    """Hyper-parameters of one training run (a profile is a named instance)."""

    seed: int = 0
    iterations: int = 80
    groups_per_iter: int = 8
    group_size: int = 8
    lr: float = 1e-2
    gamma: float = 0.95
    temperature: float = 1.2
    top_p: float = 0.999
    max_turns: int = 4  # collector limit: only inspect + a stuck door reaches it (no action can repeat 4 times)
    # the collector's response budget (tokens from the first turn on, observations included): a turn starts
    # only when it cannot fill the budget, else the episode is cut (truncated, max_tokens); with 4 turns of at
    # most TURN_TOKENS the turn limit binds first
    max_response_tokens: int = 48
    eval_budget: int = 5
    infra_failure_rate: float = 0.01
    value_coef: float = 0.5
    entropy_coef: float = 0.1  # held for the first entropy_hold of the run, then annealed to entropy_floor · coef
    entropy_floor: float = 0.0  # long runs keep a floor: a seed that stops exploring cannot recover (entropy_schedule)
    entropy_hold: float = 0.0  # short runs hold full exploration until the clue is in use (see entropy_schedule)
    epochs: int = 4  # optimizer steps per collection round (PPO-style reuse; policy lag up to epochs − 1)
    clip: float = 0.2
    embed_dim: int = 32
    hidden_dim: int = 64
    eval_episodes: int = 100
    # one intra-op thread: the kernels of a model this size are too small to split, and two threads on a
    # loaded 2-core machine spin-wait on each other
    threads: int = 1


PROFILES: dict[str, TrainConfig] = {
    "smoke": TrainConfig(),
    # longer, with an entropy floor: once groups turn degenerate only the entropy keeps `inspect` reachable
    "full": TrainConfig(iterations=120, entropy_floor=0.25),
    # the learning test that runs in CI: a quarter of the smoke profile's collection, fewer evaluation episodes,
    # hotter sampling and twice the entropy bonus while exploring; not every seed learns both colours, so the
    # test tries a second seed when the first does not
    "ci": TrainConfig(
        iterations=22, eval_episodes=20, entropy_hold=0.5, entropy_floor=0.25, temperature=2.0, entropy_coef=0.2
    ),
    "tiny": TrainConfig(
        iterations=3, groups_per_iter=2, group_size=4, eval_episodes=4, infra_failure_rate=0.05, top_p=0.7
    ),
    # the committed fixtures (python -m rollout_audit.dev generate --fixtures): early training, every stop cause
    "fixture": TrainConfig(
        iterations=4, groups_per_iter=8, group_size=4, eval_episodes=2, infra_failure_rate=0.05, epochs=2
    ),
}
FULL_SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)


# ── 2. Setup: tokenizer, policy, optimizer, environment ───────────────────────────────────────────
def setup(cfg: TrainConfig, out: Path) -> tuple[Tokenizer, RecurrentActorCritic, torch.optim.Optimizer, KeyDoorEnv]:
    """Seed torch, build the run's parts and save the untrained weights as version 0.

    The torch seed is set before the policy is built: its initial weights are the first draw."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    tok = Tokenizer()
    policy = RecurrentActorCritic(PolicyConfig(tok.vocab_size, len(ACTIONS), cfg.embed_dim, cfg.hidden_dim))
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    env = KeyDoorEnv(infra_failure_rate=cfg.infra_failure_rate)
    save_checkpoint(policy, out / "checkpoints" / "v0.safetensors", 0, tok.tokenizer_id)
    return tok, policy, opt, env


# ── 3. Rollout collection ────────────────────────────────────────────────────────────────────────
def collect_round(
    env: KeyDoorEnv, policy: RecurrentActorCritic, tok: Tokenizer, cfg: TrainConfig, it: int, version: int
) -> list[dict[str, Any]]:
    """One collection round: groups_per_iter groups of group_size episodes, each group on one task.

    The sampling generator is seeded by (seed, round), so a round's draws do not depend on earlier rounds."""
    rng = np.random.default_rng([cfg.seed, it])
    batch = []
    for g in range(cfg.groups_per_iter):
        reset_seed = cfg.seed * 1_000_000 + it * 100 + g  # even g → red task, odd g → blue: balanced
        group_id = f"s{cfg.seed}-i{it:04d}-g{g:02d}"
        for k in range(cfg.group_size):
            rec = run_episode(
                env,
                policy,
                tok,
                reset_seed=reset_seed,
                rng=rng,
                version=version,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                max_turns=cfg.max_turns,
                gamma=cfg.gamma,
                options={"fault_seed": k},
                max_response_tokens=cfg.max_response_tokens,
            )
            rec["trajectory_id"], rec["group_id"] = f"{group_id}-e{k}", group_id
            batch.append(rec)
    return batch


class Transcript:
    """The token stream with per-token provenance, mask, behaviour log-prob and turn index."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.source: list[int] = []
        self.turn: list[int] = []
        self.logprob: list[float | None] = []

    def emit(self, ids: list[int], source: int, turn: int, logprob: float | None = None) -> None:
        """Append tokens written by one party (logprob only for a policy token)."""
        for i in ids:
            self.ids.append(i)
            self.source.append(source)
            self.turn.append(turn)
            self.logprob.append(logprob)


@dataclass
class Episode:
    """One episode in progress: how it samples, what it has written, and where the policy has read to."""

    rng: np.random.Generator | None
    temperature: float
    top_p: float
    memory: bool
    greedy: bool
    tr: Transcript = field(default_factory=Transcript)
    observations: list[str] = field(default_factory=list)  # the controller's view: every observation so far
    messages: list[tuple[str, str]] = field(default_factory=list)  # the conversation the chat template renders
    phi: float = 0.0  # Φ of the current state
    response_start: int = 0  # the response: every token from the first turn on
    last_obs_start: int = 0  # where the latest observation begins (what a memoryless policy reads)
    h: torch.Tensor | None = None  # the GRU state after the tokens read so far
    fed: int = 0  # how many tokens the GRU has read
    steps: list[dict[str, Any]] = field(default_factory=list)


def run_episode(
    env: KeyDoorEnv,
    policy: RecurrentActorCritic,
    tok: Tokenizer,
    *,
    reset_seed: int,
    rng: np.random.Generator | None,
    version: int,
    temperature: float,
    top_p: float,
    max_turns: int,
    gamma: float,
    options: dict[str, Any] | None = None,
    memory: bool = True,
    greedy: bool = False,
    max_response_tokens: int | None = None,
) -> dict[str, Any]:
    """Play one episode token by token and return its contract record (docs/contract.md, token lists).

    The sequence is built by appending each party's tokens; each turn also logs the chat template's
    render of the conversation so far (Tokenizer.render), which that sequence must equal. A turn
    starts only when it cannot fill `max_response_tokens` (when given), even at its longest; otherwise
    the episode is cut there (truncated, stop_reason max_tokens): no episode that ends on its own
    fills the budget.

    memory=False resets the GRU state at each turn (it then reads only the latest observation and the
    scaffold): the ablation showing the clue must be carried in the recurrent state.
    """
    t_start = time.perf_counter()
    ep = Episode(rng, temperature, top_p, memory, greedy)
    initial_checksum = _open_episode(ep, env, tok, reset_seed, options)
    terminated = truncated = infra_error = False
    stop_reason = ""
    for t in range(max_turns):
        if max_response_tokens is not None and len(ep.tr.ids) - ep.response_start + TURN_TOKENS >= max_response_tokens:
            truncated, stop_reason = True, "max_tokens"  # another turn could fill the budget
            break
        terminated, obs, info = _play_turn(ep, env, policy, tok, t)
        if info["tool_status"] == "timeout":  # infrastructure failure: not a task outcome
            ep.tr.emit([tok.id("</call>")], SRC_TEMPLATE, t)
            infra_error, stop_reason, ep.steps[-1]["observation"] = True, "tool_error", None
            break
        _close_turn(ep, tok, t, obs)
        if terminated:
            stop_reason = info["stop_reason"]
            break
    else:
        truncated, stop_reason = True, "max_turns"  # the collector's limit, not the task's
    if terminated:
        final_value = 0.0
    else:  # V(h_T) of the information state where the next turn would start
        final_value = policy.read(ep.tr.ids[ep.fed :] + [tok.id("<call>")], ep.h)[1] if memory else 0.0
    return _record(
        ep.tr,
        ep.steps,
        env,
        tok,
        reset_seed=reset_seed,
        version=version,
        temperature=temperature,
        top_p=top_p,
        gamma=gamma,
        terminated=terminated,
        truncated=truncated,
        infra_error=infra_error,
        stop_reason=stop_reason,
        final_value=final_value,
        initial_checksum=initial_checksum,
        wall_clock=time.perf_counter() - t_start,
    )


def _open_episode(ep: Episode, env: KeyDoorEnv, tok: Tokenizer, reset_seed: int, options: dict[str, Any] | None) -> str:
    """Write the prompt (system, task, the first observation) and reset the environment; returns the
    initial state's checksum."""
    ep.tr.emit([tok.id("<sys>"), *tok.encode(SYSTEM_PROMPT), tok.id("</sys>")], SRC_SYSTEM, -1)
    ep.tr.emit([tok.id("<user>"), *tok.encode(TASK_STATEMENT), tok.id("</user>")], SRC_USER, -1)
    obs, info = env.reset(reset_seed, options)
    ep.phi = info["potential"]
    ep.last_obs_start = len(ep.tr.ids)
    ep.tr.emit([tok.id("<obs>"), *tok.encode(obs), tok.id("</obs>")], SRC_OBS, -1)
    ep.observations.append(obs)
    ep.messages += [("system", SYSTEM_PROMPT), ("user", TASK_STATEMENT), ("tool", obs)]
    ep.response_start = len(ep.tr.ids)
    return info["checksum"]


def _play_turn(
    ep: Episode, env: KeyDoorEnv, policy: RecurrentActorCritic, tok: Tokenizer, t: int
) -> tuple[bool, str, dict[str, Any]]:
    """Turn t: the scaffold opens a tool call, the policy reads its context and picks an action, the
    environment steps. Records the step in ep.steps; returns the environment's (terminated,
    observation, info)."""
    t_gen = time.perf_counter()
    template = tok.render(ep.messages)  # what the chat template gives a deployed agent before this turn
    ep.tr.emit([tok.id("<call>")], SRC_TEMPLATE, t)  # the controller's tool-call scaffold
    ctx_len = len(ep.tr.ids)
    if ep.memory:
        logits, value, ep.h = policy.read(ep.tr.ids[ep.fed : ctx_len], ep.h)
    else:
        logits, value, _ = policy.read(ep.tr.ids[ep.last_obs_start : ctx_len], None)
    ep.fed = ctx_len
    a, lp, kept = _choose_action(ep, logits, torch.from_numpy(controller_mask(ep.observations)))
    action, action_id = ACTIONS[a], tok.action_ids[a]
    ep.tr.emit([action_id], SRC_POLICY, t, lp)
    latency = time.perf_counter() - t_gen
    t_tool = time.perf_counter()
    obs, reward, terminated, _, info = env.step(action)
    tool_latency = time.perf_counter() - t_tool
    ep.steps.append(
        {
            "t": t,
            "action": action,
            "action_id": action_id,
            "logprob": lp,
            "nucleus": np.asarray(tok.action_ids)[kept].tolist(),  # the token ids it was sampled from
            "value": value,
            "context_length": ctx_len,
            "reward": reward,
            "phi_before": ep.phi,
            "phi_after": info["potential"],
            "latency": latency,
            "tool_latency": tool_latency,
            "tool_status": info["tool_status"],
            "observation": obs,
            "finish_reason": "stop" if action == "finish" else "tool_calls",
            "template_length": len(template),
            "template_sha256": context_sha256(template, len(template)),
        }
    )
    ep.messages.append(("assistant", action))
    ep.phi = info["potential"]
    return terminated, obs, info


def _choose_action(ep: Episode, logits: torch.Tensor, mask: torch.Tensor) -> tuple[int, float, np.ndarray]:
    """The action, its behaviour log-prob and the actions it was drawn from (indices, ascending): greedy
    over the allowed actions (log-prob 0 by convention, the arg-max alone), or one draw from the decoding
    distribution (temperature, top-p) the log records, whose support is the actions that mask and top-p keep."""
    if ep.greedy:
        a = int(torch.argmax(logits.masked_fill(~mask, float("-inf"))))
        return a, 0.0, np.array([a])
    logp = decoding_distribution(logits, mask, ep.temperature, ep.top_p)
    a = sample_action(logp, ep.rng)  # type: ignore[arg-type]
    return a, float(np.float32(logp[a])), np.flatnonzero(kept_actions(logp).numpy())


def _close_turn(ep: Episode, tok: Tokenizer, t: int, obs: str) -> None:
    """End turn t: `finish` ends the response (<eos>); any other call is closed and its observation
    appended, for the policy and for the chat template."""
    if ep.steps[-1]["action"] == "finish":
        ep.tr.emit([tok.id("<eos>")], SRC_TEMPLATE, t)
        return
    ep.tr.emit([tok.id("</call>")], SRC_TEMPLATE, t)
    ep.last_obs_start = len(ep.tr.ids)
    ep.tr.emit([tok.id("<obs>"), *tok.encode(obs), tok.id("</obs>")], SRC_OBS, t)
    ep.observations.append(obs)
    ep.messages.append(("tool", obs))


# ── 4. Rewards and advantages ────────────────────────────────────────────────────────────────────
def token_credit(source: list[int], reward: float | None) -> dict[str, list[float]]:
    """The per-token terms the update builds its GRPO scores from (contract 1.2 token_reward,
    token_kl, token_returns): the episode reward placed on the last policy token, no KL penalty (the
    agent's objective has none: 0 on every token) and the reward-to-go at discount 1 of reward − KL
    over the policy tokens, whose value at the first policy token is the score `update` normalises.
    An episode without a reward (excluded) carries none."""
    policy = [i for i, src in enumerate(source) if src == SRC_POLICY]
    token_reward = [0.0] * len(source)
    if policy and reward is not None:
        token_reward[policy[-1]] = reward
    token_kl = [0.0] * len(source)
    returns = [0.0] * len(source)
    to_go = 0.0
    for i in reversed(policy):
        to_go += token_reward[i] - token_kl[i]
        returns[i] = to_go
    return {"token_reward": token_reward, "token_kl": token_kl, "token_returns": returns}


def score(record: dict[str, Any]) -> float:
    """The episode's GRPO score: its return at the first policy token (the sum of its token rewards
    less its KL penalties), read from the per-token terms the log records."""
    first = record["token_source"].index(SRC_POLICY)
    return float(record["token_returns"][first])


def grpo_advantages(rewards: list[float]) -> list[float]:
    """GRPO: (R − mean_g) / (std_g with ddof=1 + ε); a degenerate group gets zeros."""
    r = np.asarray(rewards, dtype=np.float64)
    return list((r - r.mean()) / (r.std(ddof=1) + GRPO_EPS))


def trained_groups(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[float]]:
    """The episodes an update trains on, group by group, and their GRPO advantages.

    Truncated (policy `exclude`) and infra_error episodes carry no reward and never enter an update;
    a group left with one member has no group-relative comparison (std undefined) and is left out."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["reward"] is not None:
            by_group.setdefault(r["group_id"], []).append(r)
    batch, advantages = [], []
    for members in by_group.values():
        if len(members) < 2:
            continue
        batch += members
        advantages += grpo_advantages([score(m) for m in members])
    return batch, advantages


def shaped_returns_to_go(turns: list[dict[str, Any]], gamma: float) -> list[float]:
    """G_t = Σ_{j≥t} γ^{j−t} (r_j + F_j): the critic's target on the reward the trainer optimises."""
    out, g = [], 0.0
    for turn in reversed(turns):
        g = turn["reward"] + turn["shaping"] + gamma * g
        out.append(g)
    return out[::-1]


# ── 5. Loss and update ───────────────────────────────────────────────────────────────────────────
def optimise_round(
    policy: RecurrentActorCritic,
    opt: torch.optim.Optimizer,
    batch: list[dict[str, Any]],
    cfg: TrainConfig,
    it: int,
    version: int,
    out: Path,
    tok: Tokenizer,
) -> list[dict[str, Any]]:
    """Reuse one round's episodes for `epochs` optimizer steps, saving the weights of each resulting
    version; returns the update records."""
    upds = []
    for e in range(cfg.epochs):
        upds.append(
            update(
                policy, opt, batch, cfg, step=version + e, version=version + e, epoch=e, progress=it / cfg.iterations
            )
        )
        save_checkpoint(
            policy, out / "checkpoints" / f"v{version + e + 1}.safetensors", version + e + 1, tok.tokenizer_id
        )
    return upds


@dataclass
class TurnBatch:
    """One entry per trained turn, in batch order: where its action was read and what it is trained on."""

    rows: list[int] = field(default_factory=list)  # the episode's row in the padded batch
    cols: list[int] = field(default_factory=list)  # the position whose output has read the turn's context
    acts: list[int] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)  # the controller's allowed actions
    advs: list[float] = field(default_factory=list)
    beh: list[float] = field(default_factory=list)  # behaviour log-probs, as logged
    rets: list[float] = field(default_factory=list)  # the critic's targets
    temps: list[float] = field(default_factory=list)
    top_ps: list[float] = field(default_factory=list)


def update(
    policy: RecurrentActorCritic,
    opt: torch.optim.Optimizer,
    records: list[dict[str, Any]],
    cfg: TrainConfig,
    step: int,
    version: int,
    epoch: int,
    progress: float = 0.0,
) -> dict[str, Any]:
    """One optimizer step (PPO-clipped, GRPO advantages) on the included episodes; returns its update record.

    epoch e of a collection round starts from version v+e while the data came from v: policy lag e,
    corrected by the ratio π_θ/π_beh with the logged behaviour log-probs (clipped at 1 ± clip).
    """
    batch, advantages = trained_groups(records)
    record = _update_record(batch, advantages, cfg, step, version)
    if not batch:
        return record
    # forward the whole batch once, then gather each turn's decision point
    length = max(len(r["token_ids"]) for r in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    for b, r in enumerate(batch):
        ids[b, : len(r["token_ids"])] = torch.tensor(r["token_ids"])
    logits, values, _ = policy(ids)
    tb = _turn_batch(batch, advantages, cfg.gamma)
    rows_t, cols_t = torch.tensor(tb.rows), torch.tensor(tb.cols)
    logp = decoding_distribution(
        logits[rows_t, cols_t], torch.from_numpy(np.stack(tb.masks)), torch.tensor(tb.temps), torch.tensor(tb.top_ps)
    )
    logp_a = logp.gather(1, torch.tensor(tb.acts)[:, None]).squeeze(1)
    beh_t = torch.tensor(tb.beh, dtype=torch.float32)
    if epoch == 0:
        _warn_on_replay_drift(logp_a, beh_t, step)
    denominator = float(sum(r["num_trainable_tokens"] for r in batch))  # loss-mask tokens in the batch
    record["numerator_tokens"] = np.bincount(tb.rows, minlength=len(batch)).tolist()  # the terms summed, per episode
    loss = ppo_loss(logp, logp_a, beh_t, values[rows_t, cols_t], tb, denominator, cfg, progress)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    opt.step()
    record["loss_denominator"] = denominator
    return record


def _update_record(
    batch: list[dict[str, Any]], advantages: list[float], cfg: TrainConfig, step: int, version: int
) -> dict[str, Any]:
    """The update's log record; the loss denominator and the per-episode term counts are filled in
    once the loss is formed (they stay 0 and empty when no episode is trained)."""
    return {
        "update_step": step,
        "trainer_version": version,
        "trajectory_ids": [r["trajectory_id"] for r in batch],
        "reduction": "token",
        "loss_denominator": 0.0,
        "advantages": [float(a) for a in advantages],
        "advantage_estimator": "grpo",
        "max_policy_lag": cfg.epochs - 1,
        # the group statistics are formed among exactly the trained members (groups of one left out)
        "stat_trajectory_ids": [r["trajectory_id"] for r in batch],
        "numerator_tokens": [],
        # what `ppo_loss` takes the ratio against: π_θ over the logged behaviour log-probs (no
        # recomputed anchor, so no behaviour-to-anchor correction), clipped at 1 ± clip
        "ratio_anchor": "behavior",
        "ratio_correction": "none",
        "ratio_clipping": True,
    }


def _turn_batch(batch: list[dict[str, Any]], advantages: list[float], gamma: float) -> TurnBatch:
    """Flatten the trained episodes into their turns, each with the episode's advantage, the sampling
    parameters it was logged with and its shaped return-to-go."""
    tb = TurnBatch()
    for b, r in enumerate(batch):
        observations = [OBS_RESET]  # the controller's view, rebuilt from the log
        rtg = shaped_returns_to_go(r["turns"], gamma)
        for t, turn in enumerate(r["turns"]):
            tb.rows.append(b)
            tb.cols.append(turn["context_length"] - 1)  # the output that has read the context
            tb.acts.append(ACTIONS.index(turn["action_text"]))
            tb.masks.append(controller_mask(observations))
            tb.advs.append(advantages[b])
            tb.beh.append(turn["logprob"])
            tb.temps.append(turn["temperature"])  # the parameters this turn was sampled with, as logged
            tb.top_ps.append(1.0 if turn["top_p"] is None else turn["top_p"])
            tb.rets.append(rtg[t])
            observations.append(turn["observation_text"])
    return tb


def _warn_on_replay_drift(logp_a: torch.Tensor, beh_t: torch.Tensor, step: int) -> None:
    """On-policy (epoch 0), recomputation must reproduce the behaviour log-probs: a live replay check.
    Only a token exactly on the top-p boundary could fail it; it is never silent. The warning names
    the line that called `update`."""
    drift = float((logp_a.detach() - beh_t).abs().max())
    if drift > 1e-4:
        warnings.warn(
            f"update {step}: recomputed log-probs differ from behaviour log-probs by {drift:.2e}", stacklevel=3
        )


def ppo_loss(
    logp: torch.Tensor,
    logp_a: torch.Tensor,
    beh_t: torch.Tensor,
    values: torch.Tensor,
    tb: TurnBatch,
    denominator: float,
    cfg: TrainConfig,
    progress: float,
) -> torch.Tensor:
    """Clipped surrogate summed over trained tokens / `denominator` (token reduction), plus the critic's
    squared error on the shaped returns, minus the scheduled entropy bonus."""
    adv_t = torch.tensor(tb.advs, dtype=torch.float32)
    ratio = torch.exp(logp_a - beh_t)
    surrogate = torch.minimum(ratio * adv_t, torch.clamp(ratio, 1 - cfg.clip, 1 + cfg.clip) * adv_t)
    policy_loss = -surrogate.sum() / denominator
    value_loss = 0.5 * ((values - torch.tensor(tb.rets, dtype=torch.float32)) ** 2).mean()
    support = torch.isfinite(logp)
    safe_logp = logp.masked_fill(~support, 0.0)  # avoids 0 · (−inf) = NaN in the backward pass
    entropy = -(safe_logp.exp() * safe_logp * support).sum(-1).mean()
    entropy_coef = entropy_schedule(cfg, progress)
    return policy_loss + cfg.value_coef * value_loss - entropy_coef * entropy


def entropy_schedule(cfg: TrainConfig, progress: float) -> float:
    """Entropy coefficient at `progress` ∈ [0, 1): held, then linear towards entropy_floor · entropy_coef.

    A floor > 0 for long runs: GRPO groups share a task, so once every member of a red group takes the blue
    key the group is degenerate (all fail, zero advantage) and only the entropy keeps `inspect` reachable. Early on
    `inspect` only costs a turn (the GRU does not read the clue yet), so exploration must outlast that phase.
    """
    decay = (1.0 - progress) / (1.0 - cfg.entropy_hold) if cfg.entropy_hold < 1.0 else 1.0
    return cfg.entropy_coef * min(1.0, max(cfg.entropy_floor, decay))


# ── 6. Logging the rollout log ───────────────────────────────────────────────────────────────────
def canonical_action(action: str) -> str:
    """Canonical JSON of the parsed semantic action, e.g. {"action":"inspect"}."""
    return json.dumps({"action": action}, sort_keys=True, separators=(",", ":"))


def context_sha256(token_ids: list[int], context_length: int) -> str:
    """SHA-256 of the engine's context ids as little-endian int32 (docs/contract.md, context_sha256)."""
    return hashlib.sha256(np.asarray(token_ids[:context_length], dtype="<i4").tobytes()).hexdigest()


def _record(
    tr: Transcript,
    steps: list[dict[str, Any]],
    env: KeyDoorEnv,
    tok: Tokenizer,
    *,
    reset_seed: int,
    version: int,
    temperature: float,
    top_p: float,
    gamma: float,
    terminated: bool,
    truncated: bool,
    infra_error: bool,
    stop_reason: str,
    final_value: float,
    initial_checksum: str,
    wall_clock: float,
) -> dict[str, Any]:
    """Assemble the trajectory row: turns with shaping F_t = γΦ(s_{t+1}) − Φ(s_t) and δ_t on r + F."""
    assert env.state is not None
    turns = []
    discounted = 0.0
    for i, s in enumerate(steps):
        shaping = gamma * s["phi_after"] - s["phi_before"]
        v_next = steps[i + 1]["value"] if i + 1 < len(steps) else final_value
        discounted += gamma**i * (s["reward"] + shaping)
        turns.append(
            _turn_row(s, tr, shaping, v_next, version=version, temperature=temperature, top_p=top_p, gamma=gamma)
        )
    target = env.state.target
    loss_mask = [src == SRC_POLICY for src in tr.source]
    return {
        "trajectory_id": "",
        "task_id": f"keydoor-{target}-s{reset_seed}",
        "group_id": None,
        "environment_id": ENVIRONMENT_ID,
        "environment_version": ENVIRONMENT_VERSION,
        "reset_seed": reset_seed,
        "initial_state_id": None,
        "initial_state_checksum": initial_checksum,
        "final_state_checksum": state_checksum(env.state),
        "verifier_version": VERIFIER_VERSION,
        "tokenizer_id": tok.tokenizer_id,
        "gamma": gamma,
        "token_ids": tr.ids,
        "token_source": tr.source,
        "loss_mask": loss_mask,
        "behavior_logprobs": tr.logprob,
        "token_turn": tr.turn,
        "turns": turns,
        "terminated": terminated,
        "truncated": truncated,
        "infra_error": infra_error,
        "stop_reason": stop_reason,
        "reward": float(sum(s["reward"] for s in steps)) if terminated else None,
        "verifier_success": verify(env.state),
        "discounted_return": discounted,
        "final_value": final_value,
        "num_trainable_tokens": int(sum(loss_mask)),
        "wall_clock_s": wall_clock,
        **token_credit(tr.source, float(sum(s["reward"] for s in steps)) if terminated else None),
        # contract 1.3: the policy loss sums each trained token's surrogate with weight 1 (one loss stream)
        "loss_weight": [1.0 if m else 0.0 for m in loss_mask],
        **nucleus_record(len(tr.ids), steps),
    }


def nucleus_record(n_tokens: int, steps: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Contract 1.3 nucleus_ids / nucleus_offsets: each action token's support (the token ids of the
    actions the mask and top-p kept when it was sampled), in token order; every other token an empty
    span (nothing was sampled there). A step's action token sits at its context_length."""
    lengths = np.zeros(n_tokens, dtype=np.int64)
    lengths[[s["context_length"] for s in steps]] = [len(s["nucleus"]) for s in steps]
    return {
        "nucleus_ids": [i for s in steps for i in s["nucleus"]],
        "nucleus_offsets": np.concatenate([[0], np.cumsum(lengths)]).tolist(),
    }


def _turn_row(
    s: dict[str, Any],
    tr: Transcript,
    shaping: float,
    v_next: float,
    *,
    version: int,
    temperature: float,
    top_p: float,
    gamma: float,
) -> dict[str, Any]:
    """One turn of the trajectory row, from the step `run_episode` recorded (δ_t bootstraps on `v_next`)."""
    return {
        "turn_id": s["t"],
        "policy_version": version,
        "logprob": s["logprob"],
        "num_policy_tokens": 1,
        "temperature": temperature,
        "top_p": top_p,
        "action_text": s["action"],
        "parsed_action": canonical_action(s["action"]),
        "observation_text": s["observation"],
        "reward": s["reward"],
        "reward_components": [("outcome", s["reward"])],
        "potential_before": s["phi_before"],
        "potential_after": s["phi_after"],
        "shaping": shaping,
        "value": s["value"],
        "td_residual": s["reward"] + shaping + gamma * v_next - s["value"],
        "latency_s": s["latency"],
        "tool_latency_s": s["tool_latency"],
        "tool_status": s["tool_status"],
        "finish_reason": s["finish_reason"],
        "sampled_token_ids": [s["action_id"]],
        "context_length": s["context_length"],
        "context_sha256": context_sha256(tr.ids, s["context_length"]),
        "template_context_length": s["template_length"],
        "template_context_sha256": s["template_sha256"],
    }


PROGRESS_EVERY = 10.0  # seconds between progress lines when stderr is not a terminal


def _progress_lines(total: int, label: str) -> Any:
    """Progress as plain lines on stderr (a log file, CI): the first round, then at most one line
    every PROGRESS_EVERY seconds, and the last round."""
    state = {"done": 0, "said": time.perf_counter(), "start": time.perf_counter()}

    def advance() -> None:
        state["done"] += 1
        now = time.perf_counter()
        if state["done"] in (1, total) or now - state["said"] >= PROGRESS_EVERY:
            state["said"] = now
            print(f"{label}: round {state['done']}/{total} ({now - state['start']:.0f} s)", file=sys.stderr, flush=True)

    return contextlib.nullcontext(advance)


def _progress_bar(enabled: bool | str, total: int, label: str, console: Any = None) -> Any:
    """A rich progress bar over the training rounds (on stderr unless `console` is given), as a
    context manager yielding `advance()`; plain lines at intervals when `enabled` is "lines"; a
    stand-in that does nothing when not `enabled`."""
    if not enabled:
        return contextlib.nullcontext(lambda: None)
    if enabled == "lines":
        return _progress_lines(total, label)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("rounds"), TimeElapsedColumn())
    bar = Progress(*columns, console=console or Console(stderr=True), transient=console is None)
    task = bar.add_task(label, total=total)

    @contextlib.contextmanager
    def running():
        with bar:
            yield lambda: bar.advance(task)

    return running()


def _print_round(it: int, batch: list[dict[str, Any]], t0: float) -> None:
    """The verbose line of a round: success and how often the first turn inspects (the clue's use)."""
    inspected = np.mean([r["turns"][0]["action_text"] == "inspect" for r in batch])
    success = np.mean([r["verifier_success"] for r in batch])
    print(
        f"iter {it:4d}  success {success:.2f}  first-turn inspect {inspected:.2f}  {time.perf_counter() - t0:.1f}s",
        flush=True,
    )


# ── 7. Evaluation ────────────────────────────────────────────────────────────────────────────────
def evaluate_policies(policy: RecurrentActorCritic, tok: Tokenizer, cfg: TrainConfig, out: Path) -> dict[str, Any]:
    """Greedy success of the trained policy, of the untrained one (version 0) and of the trained one
    without memory (the ablation)."""
    untrained = load_checkpoint(out / "checkpoints" / "v0.safetensors")
    policy.eval()
    return {
        "trained": evaluate(policy, tok, cfg),
        "untrained": evaluate(untrained, tok, cfg),
        "no_memory": evaluate(policy, tok, cfg, memory=False),
    }


def evaluate(policy: RecurrentActorCritic, tok: Tokenizer, cfg: TrainConfig, memory: bool = True) -> dict[str, float]:
    """Greedy success on red and on blue tasks separately (held-out seeds, standard door, no faults)."""
    env = KeyDoorEnv(infra_failure_rate=0.0)
    result = {}
    for colour in COLOURS:
        wins = 0
        for i in range(cfg.eval_episodes):
            rec = run_episode(
                env,
                policy,
                tok,
                reset_seed=10**9 + i,
                rng=None,
                version=-1,
                temperature=1.0,
                top_p=1.0,
                max_turns=cfg.max_turns,
                gamma=cfg.gamma,
                options={"target": colour, "budget": cfg.eval_budget, "stuck": False},
                memory=memory,
                greedy=True,
            )
            wins += bool(rec["verifier_success"] and rec["stop_reason"] == "success")
        result[colour] = wins / cfg.eval_episodes
    return result


# ── The run: the phases above, in the order they execute ─────────────────────────────────────────
def train(
    cfg: TrainConfig, out_dir: str | Path, verbose: bool = False, progress: bool | str = False, log_dir: str = ""
) -> dict[str, Any]:
    """Train one run: logs in out/`log_dir`/trajectories and …/updates, a checkpoint per version in
    out/checkpoints, eval table. `progress`: a bar of the collection rounds on stderr."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    tok, policy, opt, env = setup(cfg, out)
    stops: dict[str, int] = {}
    with (
        open_writer(out / log_dir / "trajectories" / "part-0000.parquet", "trajectories", tok.declaration()) as traj_w,
        open_writer(out / log_dir / "updates" / "part-0000.parquet", "updates") as upd_w,
        _progress_bar(progress, cfg.iterations, f"training seed {cfg.seed}") as advance,
    ):
        for it in range(cfg.iterations):
            version = it * cfg.epochs  # the weights that sample this round
            batch = collect_round(env, policy, tok, cfg, it, version)
            upds = optimise_round(policy, opt, batch, cfg, it, version, out, tok)
            traj_w.write(to_table(batch, "trajectories"))  # one row group per collection round
            upd_w.write(to_table(upds, "updates"))
            for r in batch:
                stops[r["stop_reason"]] = stops.get(r["stop_reason"], 0) + 1
            advance()
            if verbose and (it % 10 == 0 or it == cfg.iterations - 1):
                _print_round(it, batch, t0)
    train_seconds = time.perf_counter() - t0
    evaluation = evaluate_policies(policy, tok, cfg, out)
    return {
        "seed": cfg.seed,
        "config": asdict(cfg),
        "train_seconds": train_seconds,
        "total_seconds": time.perf_counter() - t0,
        "evaluation": evaluation,
        "episodes": sum(stops.values()),
        "stop_reasons": stops,
        "final_version": cfg.iterations * cfg.epochs,
        "out_dir": str(out),
    }


# ── Profiles, the results table and the command line ─────────────────────────────────────────────
def run_profile(
    profile: str, out_dir: str | Path, seed: int = 0, progress: bool | str = False, log_dir: str = ""
) -> dict[str, Any]:
    """smoke/tiny: one run; full: one run per seed in FULL_SEEDS under out/seed{s}, with mean and spread
    (`log_dir`: where in each run's directory the log goes, as in `train`)."""
    cfg = PROFILES[profile]
    if profile != "full":
        result = train(replace(cfg, seed=seed), out_dir, progress=progress, log_dir=log_dir)
        result["profile"] = profile
        return result
    runs = [
        train(replace(cfg, seed=s), Path(out_dir) / f"seed{s}", progress=progress, log_dir=log_dir) for s in FULL_SEEDS
    ]
    summary = {}
    for policy_name in ("trained", "untrained", "no_memory"):
        for colour in COLOURS:
            vals = np.array([r["evaluation"][policy_name][colour] for r in runs])
            summary[f"{policy_name}/{colour}"] = {
                "mean": float(vals.mean()),
                "std": float(vals.std(ddof=1)),
                "min": float(vals.min()),
                "max": float(vals.max()),
            }
    evaluation = {p: {c: summary[f"{p}/{c}"]["mean"] for c in COLOURS} for p in ("trained", "untrained", "no_memory")}
    return {
        "profile": "full",
        "seeds": list(FULL_SEEDS),
        "runs": runs,
        "summary": summary,
        "evaluation": evaluation,
        "train_seconds": sum(r["train_seconds"] for r in runs),
        "total_seconds": sum(r["total_seconds"] for r in runs),
        "out_dir": str(out_dir),
    }


POLICY_LABELS = {
    "trained": "trained (GRU memory)",
    "untrained": "untrained (v0)",
    "no_memory": "trained, no memory (state reset each turn)",
}


def format_table(result: dict[str, Any]) -> str:
    """Plain-text table: greedy success on red and blue tasks for each policy (mean ± std for `full`)."""
    summary = result.get("summary")
    lines = [
        f"profile {result.get('profile')}  train {result['train_seconds']:.1f}s  "
        f"total {result['total_seconds']:.1f}s  out {result.get('out_dir')}",
        f"{'policy':<44}{'red':>16}{'blue':>16}",
    ]
    for key, label in POLICY_LABELS.items():
        cells = []
        for colour in ("red", "blue"):
            if summary:
                s = summary[f"{key}/{colour}"]
                cells.append(f"{s['mean']:.3f} ± {s['std']:.3f}")
            else:
                cells.append(f"{result['evaluation'][key][colour]:.3f}")
        lines.append(f"{label:<44}{cells[0]:>16}{cells[1]:>16}")
    for run in result.get("runs", []):  # full profile: every seed, so a failed seed is visible
        ev = run["evaluation"]
        lines.append(
            f"  seed {run['seed']}: trained red {ev['trained']['red']:.2f} blue {ev['trained']['blue']:.2f}, "
            f"no-memory red {ev['no_memory']['red']:.2f} blue {ev['no_memory']['blue']:.2f}"
        )
    if "stop_reasons" in result:
        lines.append("stop reasons: " + ", ".join(f"{k}={v}" for k, v in sorted(result["stop_reasons"].items())))
    return "\n".join(lines)


def main() -> None:
    """CLI entry: train a profile and print the evaluation table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    parser.add_argument("--out", default="out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(format_table(run_profile(args.profile, args.out, args.seed)))


if __name__ == "__main__":
    main()
