"""Replay: recompute behaviour log-probs of a logged trajectory from the checkpoint of its policy version."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_agent.env import ACTIONS, OBS_RESET, controller_mask
from reference_agent.policy import RecurrentActorCritic, decoding_distribution, load_checkpoint
from reference_agent.tokenizer import Tokenizer


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
