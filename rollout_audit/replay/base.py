"""The replayer interface: what a replayer is given (trajectories of one policy version and the tokens
to score, with their decoding parameters) and what it returns (two log-probs per scored token)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa

from ..contract.errors import NotConfigured


@dataclass(frozen=True)
class ReplayRequest:
    """Trajectories sampled by one policy version and the policy tokens to score in them.

    Scored token i sits at `position[i]` of trajectory `traj[i]` (an index into `token_ids`); its
    log-prob comes from the model's output after reading `token_ids[traj[i]][:position[i]]`. Decoding
    parameters are per token (its turn's): temperature, top_p (1.0 = off), top_k (0 = off). `rows` is
    the Arrow slice of these trajectories (with `turns`), for replayers that rebuild more context
    (e.g. a controller's action mask from the logged observations). `support_ids` with
    `support_offsets` (one more than the scored tokens) is the nucleus the engine recorded for each
    scored token (contract 1.3 nucleus_ids): scored over it instead of top_p / top_k where its span
    is not empty (`support_mask`).
    """

    version: int
    token_ids: list[np.ndarray]
    traj: np.ndarray
    position: np.ndarray
    turn: np.ndarray
    temperature: np.ndarray
    top_p: np.ndarray
    top_k: np.ndarray
    rows: pa.Table
    support_ids: np.ndarray | None = None
    support_offsets: np.ndarray | None = None

    def support_mask(self, index: np.ndarray, vocab: int) -> np.ndarray | None:
        """[len(index), vocab] True on the recorded nucleus of scored tokens `index` (a row with no
        recorded nucleus is all False: the decoding parameters apply); None when none is recorded.
        Ids at or past `vocab` are not in the model's vocabulary and are left out."""
        if self.support_ids is None or self.support_offsets is None:
            return None
        lo, hi = self.support_offsets[index], self.support_offsets[index + 1]
        if not (hi > lo).any():
            return None
        owner = np.repeat(np.arange(len(index)), hi - lo)
        begin = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64)
        ids = self.support_ids[lo[owner] + np.arange(owner.size) - begin[owner]]
        inside = (ids >= 0) & (ids < vocab)
        mask = np.zeros((len(index), vocab), bool)
        mask[owner[inside], ids[inside]] = True
        return mask

    @property
    def tokens(self) -> np.ndarray:
        """The sampled token id of each scored position."""
        lengths = np.array([len(s) for s in self.token_ids], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        flat = np.concatenate(self.token_ids) if self.token_ids else np.zeros(0, np.int64)
        return flat[starts[self.traj] + self.position].astype(np.int64)


@dataclass(frozen=True)
class ReplayResult:
    """Per scored token: log-prob under the distribution actually sampled from, and under the base softmax.
    `beyond`: (trajectory index, position, token id, vocabulary size) of the first id of each trajectory
    the model has no logit for; such a trajectory is not scored (its tokens are NaN)."""

    sampled: np.ndarray
    base: np.ndarray
    beyond: tuple[tuple[int, int, int, int], ...] = ()


class Replayer(Protocol):
    """Recomputes log-probs of logged tokens under the checkpoint of their policy version."""

    def replay(self, request: ReplayRequest) -> ReplayResult:
        """Score every token of the request; raise NotConfigured when the version has no checkpoint."""
        ...


def checkpoint_path(mapping: dict[str, str] | str | None, version: int) -> Path:
    """The checkpoint of `version`: a {version: path} mapping, or a template with `{version}` in it.

    Raises NotConfigured naming the version when the mapping lacks it or the path does not exist.
    """
    if not mapping:
        raise NotConfigured("needs replay_checkpoints in the configuration (version -> checkpoint)")
    if isinstance(mapping, str):
        try:
            path = Path(mapping.format(version=version))
        except (KeyError, IndexError, ValueError) as e:
            raise NotConfigured(f"replay_checkpoints template {mapping!r} must name only {{version}}: {e}") from e
    elif str(version) in mapping:
        path = Path(mapping[str(version)])
    else:
        raise NotConfigured(f"no checkpoint configured for policy version {version} (replay_checkpoints)")
    if not path.exists():
        raise NotConfigured(f"checkpoint of policy version {version} not found: {path}")
    return path


def pad_batch(seqs: list[np.ndarray], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad int sequences into [B, L] ids and a [B, L] attention mask (1 = real token)."""
    length = max((len(s) for s in seqs), default=0)
    ids = np.full((len(seqs), length), pad, dtype=np.int64)
    att = np.zeros((len(seqs), length), dtype=np.int64)
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    keep = np.arange(length)[None, :] < lens[:, None]
    ids[keep] = np.concatenate(seqs) if seqs else []
    att[keep] = 1
    return ids, att
