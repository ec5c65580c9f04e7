"""Recurrent (GRU) token-level actor–critic and the decoding distribution it samples from."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn


@dataclass
class PolicyConfig:
    """Architecture sizes; stored in every checkpoint's metadata so replay can rebuild the net."""

    vocab_size: int
    num_actions: int
    embed_dim: int = 32
    hidden_dim: int = 64


class RecurrentActorCritic(nn.Module):
    """Embedding → GRU over the whole token stream → action logits and V(h) at each position."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.gru = nn.GRU(cfg.embed_dim, cfg.hidden_dim, batch_first=True)
        self.actor = nn.Linear(cfg.hidden_dim, cfg.num_actions)
        self.critic = nn.Linear(cfg.hidden_dim, 1)

    def forward(
        self, ids: torch.Tensor, h0: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ids [B, L] → (action logits [B, L, A], values [B, L], last hidden [1, B, H]); output k has read ids[:k+1]."""
        out, h = self.gru(self.embed(ids), h0)
        return self.actor(out), self.critic(out).squeeze(-1), h

    @torch.no_grad()
    def read(self, ids: list[int], h: torch.Tensor | None) -> tuple[torch.Tensor, float, torch.Tensor]:
        """Feed a token segment to the recurrent state; return the last position's logits, value and state."""
        logits, values, h = self.forward(torch.tensor([ids], dtype=torch.long), h)
        return logits[0, -1], float(values[0, -1]), h


def decoding_distribution(
    logits: torch.Tensor, mask: torch.Tensor, temperature: float | torch.Tensor, top_p: float | torch.Tensor
) -> torch.Tensor:
    """Log-probs of the distribution actually sampled from: action mask → temperature → top-p → renormalise.

    Works on [..., A]; excluded actions get -inf. temperature and top_p are scalars or tensors of the
    leading shape (one value per row: each turn's logged parameters). This single function serves
    sampling, training and replay, so the behaviour log-prob is never the base softmax (L206).
    """
    temp = torch.as_tensor(temperature, dtype=logits.dtype)
    p = torch.as_tensor(top_p, dtype=logits.dtype)
    if temp.dim():
        temp = temp.unsqueeze(-1)
    if p.dim():
        p = p.unsqueeze(-1)
    z = logits.masked_fill(~mask, float("-inf")) / temp
    logp = torch.log_softmax(z, dim=-1)
    if bool((p < 1.0).any()):
        sorted_lp, order = torch.sort(logp, dim=-1, descending=True)
        before = torch.cumsum(sorted_lp.exp(), dim=-1) - sorted_lp.exp()  # mass strictly before each token
        keep_sorted = (before < p) | (p >= 1.0)  # smallest prefix reaching top_p (the crossing token is kept)
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        logp = torch.log_softmax(z.masked_fill(~keep, float("-inf")), dim=-1)
    return logp


def kept_actions(logp: torch.Tensor) -> torch.Tensor:
    """The actions a decoding distribution can sample (True = kept after the action mask and top-p): its
    finite log-probs. The log records them, as token ids, as the nucleus each action was sampled from."""
    return torch.isfinite(logp)


def save_checkpoint(policy: RecurrentActorCritic, path: str | Path, version: int, tokenizer_id: str) -> None:
    """Write the weights as safetensors (never pickle) with the config and version in metadata."""
    tensors = {k: v.detach().contiguous().clone() for k, v in policy.state_dict().items()}
    meta = {"policy_version": str(version), "tokenizer_id": tokenizer_id, "config": json.dumps(asdict(policy.cfg))}
    save_file(tensors, str(path), metadata=meta)


def load_checkpoint(path: str | Path) -> RecurrentActorCritic:
    """Rebuild a policy from a safetensors checkpoint written by save_checkpoint."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    policy = RecurrentActorCritic(PolicyConfig(**json.loads(meta["config"])))
    policy.load_state_dict(load_file(str(path)))
    policy.eval()
    return policy


def sample_action(logp: torch.Tensor, rng: np.random.Generator) -> int:
    """Inverse-CDF sample from log-probs with a numpy generator (deterministic given the seed)."""
    p = logp.exp().double().numpy()
    p = p / p.sum()
    idx = int(np.searchsorted(np.cumsum(p), rng.random(), side="right"))
    support = np.flatnonzero(p > 0)
    return idx if idx < len(p) and p[idx] > 0 else int(support[-1])
