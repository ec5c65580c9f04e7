"""Replay: recompute behaviour log-probs of a logged trajectory from the checkpoint of its policy version."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from reference_agent.env import ACTIONS, OBS_OPENS, OBS_RESET, OBS_TAKE, controller_mask
from reference_agent.policy import RecurrentActorCritic, decoding_distribution, load_checkpoint
from reference_agent.tokenizer import Tokenizer
from rollout_audit.replay import NotConfigured, ReplayRequest, ReplayResult, checkpoint_path, pad_batch


@lru_cache(maxsize=64)
def _policy(path: str) -> RecurrentActorCritic:
    """Load (and cache) one checkpoint."""
    return load_checkpoint(path)


def replay_logprobs(checkpoint_dir: str | Path, trajectory_row: dict[str, Any]) -> np.ndarray:
    """Per-token log-probs of the sampled tokens under the logged version and decoding params (NaN elsewhere).

    The action mask is rebuilt by the controller from the logged observations, exactly as at collection.
    """
    ids = [int(i) for i in trajectory_row["token_ids"]]
    out = np.full(len(ids), np.nan, dtype=np.float64)
    tok = Tokenizer()
    turns = list(trajectory_row["turns"])
    observations = [OBS_RESET]
    cache: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for turn in turns:
            version = int(turn["policy_version"])
            if version not in cache:
                policy = _policy(str(Path(checkpoint_dir) / f"v{version}.safetensors"))
                cache[version] = policy(torch.tensor([ids], dtype=torch.long))[0][0]
            logits = cache[version]
            pos = int(turn["context_length"])
            top_p = turn["top_p"] if turn["top_p"] is not None else 1.0
            logp = decoding_distribution(
                logits[pos - 1],
                torch.from_numpy(controller_mask(observations)),
                float(turn["temperature"]),
                float(top_p),
            )
            out[pos] = float(logp[ACTIONS.index(tok.action_of(ids[pos]))])
            observations.append(turn["observation_text"] or "")
    return out


class AgentReplayer:
    """The auditor's replayer for this agent (rollout_audit.replay.Replayer): batched GRU passes over padded
    trajectories of one version, the controller's action mask rebuilt from the logged observations and
    narrowed to the recorded nucleus where the log records one (`recorded_support`)."""

    def __init__(self, checkpoints: dict[str, str] | str | None, batch_size: int = 256) -> None:
        self.checkpoints = checkpoints
        self.batch_size = batch_size
        torch.set_num_threads(1)  # kernels of a net this size do not split; two threads spin on a loaded machine

    def replay(self, request: ReplayRequest) -> ReplayResult:
        """Sampled-distribution and base-softmax log-probs of each scored action token."""
        path = checkpoint_path(self.checkpoints, request.version)
        try:
            policy = _policy(str(path))
        except Exception as e:
            raise NotConfigured(
                f"checkpoint of policy version {request.version} cannot be loaded from {path}: {e}"
            ) from e
        z = torch.empty(len(request.traj), policy.cfg.num_actions)
        with torch.no_grad():
            for lo in range(0, len(request.token_ids), self.batch_size):
                ids, _ = pad_batch(request.token_ids[lo : lo + self.batch_size])
                sel = np.flatnonzero((request.traj >= lo) & (request.traj < lo + len(ids)))
                logits = policy(torch.from_numpy(ids))[0]
                z[sel] = logits[torch.from_numpy(request.traj[sel] - lo), torch.from_numpy(request.position[sel] - 1)]
        action = torch.from_numpy(_action_index(request.tokens))[:, None]
        mask, top_p = recorded_support(request, controller_masks(request.rows, request.traj, request.turn))
        sampled = decoding_distribution(
            z,
            torch.from_numpy(mask),
            torch.tensor(request.temperature, dtype=torch.float32),
            torch.tensor(top_p, dtype=torch.float32),
        )
        base = torch.log_softmax(z, dim=-1)
        return ReplayResult(
            sampled=sampled.gather(1, action)[:, 0].double().numpy(), base=base.gather(1, action)[:, 0].double().numpy()
        )


def recorded_support(request: ReplayRequest, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The [N, A] actions to renormalise over and the top_p to apply, per scored token: where the log
    records the nucleus the token was sampled from (contract 1.3 nucleus_ids, a non-empty span), the
    controller's mask narrowed to the recorded actions and no top-p (the recorded support replaces its
    recomputation, as rollout_audit.replay.processed_logprobs does); elsewhere the mask and the logged top_p."""
    action_ids = Tokenizer().action_ids
    top_p = np.asarray(request.top_p, dtype=np.float64)
    support = request.support_mask(np.arange(len(request.traj)), max(action_ids) + 1)
    if support is None or request.support_offsets is None:
        return mask, top_p
    recorded = np.diff(request.support_offsets) > 0
    return np.where(recorded[:, None], mask & support[:, action_ids], mask), np.where(recorded, 1.0, top_p)


def replayer(cfg: Any) -> AgentReplayer:
    """Factory named in the auditor's configuration: `replayer = "reference_agent.replay:replayer"`, with
    `replay_checkpoints = "OUT/checkpoints/v{version}.safetensors"`."""
    return AgentReplayer(cfg.replay_checkpoints)


def _action_index(token_ids: np.ndarray) -> np.ndarray:
    """Action index of each action token id (-1 → not an action: replay then fails loudly in gather)."""
    lookup = np.full(max(int(token_ids.max(initial=0)), max(Tokenizer().action_ids)) + 1, -1, dtype=np.int64)
    lookup[Tokenizer().action_ids] = np.arange(len(ACTIONS))
    return lookup[token_ids]


def controller_masks(rows: pa.Table, traj: np.ndarray, turn: np.ndarray) -> np.ndarray:
    """[N, A] controller masks before turn `turn` of row `traj`, from the observations logged before it.

    Vectorised form of env.controller_mask: counts of key-taken / door-opened / clue-read observations
    over the earlier turns of each trajectory (an exclusive prefix sum over the flattened turns).
    """
    turns = rows.column("turns").combine_chunks()
    obs = pc.fill_null(pc.struct_field(pc.list_flatten(turns), "observation_text"), "")
    flags = np.stack(
        [
            pc.equal(obs, OBS_TAKE).to_numpy(zero_copy_only=False),
            pc.equal(obs, OBS_OPENS).to_numpy(zero_copy_only=False),
            pc.starts_with(obs, "the clue is").to_numpy(zero_copy_only=False),
        ],
        axis=1,
    ).astype(np.int64)
    prefix = np.vstack([np.zeros((1, 3), np.int64), np.cumsum(flags, axis=0)])
    start = np.concatenate([[0], np.cumsum(pc.list_value_length(turns).to_numpy(zero_copy_only=False))])[traj]
    has_key, door_open, clue = ((prefix[start + turn] - prefix[start]) > 0).T
    a = {name: i for i, name in enumerate(ACTIONS)}
    mask = np.ones((len(traj), len(ACTIONS)), dtype=bool)
    mask[:, a["inspect"]] = ~clue
    for name in ("open_red", "open_blue"):
        mask[:, a[name]] &= has_key
    for name in ("pickup_red", "pickup_blue"):
        mask[:, a[name]] &= ~has_key
    mask[door_open] = False
    mask[door_open, a["finish"]] = True
    return mask


REPLAY_FAULTS = ("base_softmax", "wrong_version", "top_p_ignored")


def faulty_row(checkpoint_dir: str | Path, row: dict[str, Any], fault: str) -> dict[str, Any]:
    """A copy of a logged episode whose behaviour log-probs come from a named producer bug: the base softmax
    (no mask, temperature 1, no top-p), the previous version's weights (turns of version ≥ 1), or the
    tempered distribution with top-p ignored. The faults the replay checks (L205-L207) must catch."""
    ids = [int(i) for i in row["token_ids"]]
    lps = list(row["behavior_logprobs"])
    turns = [dict(t) for t in row["turns"]]
    tok = Tokenizer()
    observations = [OBS_RESET]
    with torch.no_grad():
        for turn in turns:
            version = int(turn["policy_version"]) - (fault == "wrong_version")
            pos, action = int(turn["context_length"]), ACTIONS.index(tok.action_of(ids[int(turn["context_length"])]))
            if version >= 0:
                logits = _policy(str(Path(checkpoint_dir) / f"v{version}.safetensors"))(
                    torch.tensor([ids[:pos]], dtype=torch.long)
                )[0][0, -1]
                mask = torch.from_numpy(controller_mask(observations))
                top_p = 1.0 if fault == "top_p_ignored" else float(turn["top_p"])
                logp = (
                    torch.log_softmax(logits, -1)
                    if fault == "base_softmax"
                    else decoding_distribution(logits, mask, float(turn["temperature"]), top_p)
                )
                lps[pos] = turn["logprob"] = float(np.float32(logp[action]))
            observations.append(turn["observation_text"] or "")
    return dict(row, behavior_logprobs=lps, turns=turns)
