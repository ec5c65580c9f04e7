"""Replay with any Hugging Face transformers causal LM: one local checkpoint directory per policy version
(`from_pretrained`, nothing downloaded), CPU by default, CUDA when present. torch is imported lazily."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import NotConfigured, ReplayRequest, ReplayResult, checkpoint_path, pad_batch
from .dist import row_blocks, token_logprobs


class HFReplayer:
    """Batched teacher-forced forward passes over padded trajectories, one policy version at a time;
    a batch's logits hold `max_scores` bytes at most."""

    def __init__(
        self,
        checkpoints: dict[str, str] | str,
        device: str | None = None,
        batch_size: int = 8,
        max_scores: int = 1 << 30,
    ) -> None:
        self.checkpoints = checkpoints
        self.device = device
        self.batch_size = batch_size
        self.max_scores = max_scores  # bytes of logits held at once at most
        self._loaded: tuple[int, Any] | None = None  # one model in memory at a time

    def _model(self, version: int) -> Any:
        """The model of `version`, loaded from its local directory (kept until another version is asked)."""
        if self._loaded is not None and self._loaded[0] == version:
            return self._loaded[1]
        path = checkpoint_path(self.checkpoints, version)
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError as e:  # the replay extra is not installed
            raise NotConfigured(f"needs the replay extra (pip install 'rollout-audit[replay]'): {e}") from e
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
        model = model.float().to(device).eval()  # replay in float32 whatever the checkpoint's dtype
        self._loaded = (version, model)
        return model

    def replay(self, request: ReplayRequest) -> ReplayResult:
        """Score the request's tokens: logits after position p-1 give the log-prob of the token at p."""
        import torch

        model = self._model(request.version)
        device = next(model.parameters()).device
        vocab = _vocab_size(model)
        beyond = tuple(
            (i, int(at[0]), int(ids[at[0]]), vocab)
            for i, ids in enumerate(request.token_ids)
            if vocab and (at := np.flatnonzero(ids >= vocab)).size
        )
        outside = np.isin(request.traj, [b[0] for b in beyond])
        # ids the model has no embedding for are read as 0 and their trajectories' scores dropped
        tokens = np.where(request.tokens < vocab, request.tokens, 0) if vocab else request.tokens
        sampled = np.full(len(tokens), np.nan)
        base = np.full(len(tokens), np.nan)
        with torch.inference_mode():
            for chunk in self._batches(request, vocab):
                lo = int(chunk[0])
                ids, att = pad_batch([np.where(request.token_ids[i] < vocab, request.token_ids[i], 0) for i in chunk])
                logits = model(
                    input_ids=torch.from_numpy(ids).to(device), attention_mask=torch.from_numpy(att).to(device)
                ).logits
                sel = np.flatnonzero((request.traj >= lo) & (request.traj < lo + len(chunk)))
                for part in row_blocks(len(sel), logits.shape[-1], self.max_scores):
                    rows = sel[part]
                    which = torch.from_numpy(request.traj[rows] - lo).to(device)
                    cols = torch.from_numpy(request.position[rows] - 1).to(device)
                    z = logits[which, cols].double().cpu().numpy()
                    sampled[rows], base[rows] = token_logprobs(
                        z,
                        tokens[rows],
                        request.temperature[rows],
                        request.top_p[rows],
                        request.top_k[rows],
                        support=request.support_mask(rows, z.shape[1]),
                    )
                del logits
        sampled[outside], base[outside] = np.nan, np.nan
        return ReplayResult(sampled=sampled, base=base, beyond=beyond)

    def _batches(self, request: ReplayRequest, vocab: int) -> list[np.ndarray]:
        """Consecutive trajectories per forward pass: at most `batch_size`, and a padded batch whose
        float32 logits fit `max_scores`; a trajectory whose logits alone do not is refused, naming it."""
        out: list[list[int]] = []
        longest = 0
        for i, ids in enumerate(request.token_ids):
            need = len(ids) * vocab * 4
            if need > self.max_scores:
                traj = request.rows.column("trajectory_id")[i].as_py() if request.rows.num_rows > i else i
                raise NotConfigured(
                    f"trajectory {traj} has {len(ids)} tokens: its logits over the model's {vocab} ids take "
                    f"{need} bytes, over replay_max_bytes ({self.max_scores})"
                )
            grown = max(longest, len(ids))
            if out and len(out[-1]) < self.batch_size and (len(out[-1]) + 1) * grown * vocab * 4 <= self.max_scores:
                out[-1].append(i)
                longest = grown
            else:
                out.append([i])
                longest = len(ids)
        return [np.array(c) for c in out]


def _vocab_size(model: Any) -> int:
    """The number of logits the model returns per position (its output embedding's rows)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(getattr(model.config, "vocab_size", 0) or 0)
