"""Replay with any Hugging Face transformers causal LM: one local checkpoint directory per policy version
(`from_pretrained`, nothing downloaded), CPU by default, CUDA when present. torch is imported lazily."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import NotConfigured, ReplayRequest, ReplayResult, checkpoint_path, pad_batch
from .dist import token_logprobs


class HFReplayer:
    """Batched teacher-forced forward passes over padded trajectories, one policy version at a time."""

    def __init__(self, checkpoints: dict[str, str] | str, device: str | None = None, batch_size: int = 8) -> None:
        self.checkpoints = checkpoints
        self.device = device
        self.batch_size = batch_size
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
        tokens = request.tokens
        sampled = np.full(len(tokens), np.nan)
        base = np.full(len(tokens), np.nan)
        with torch.inference_mode():
            for lo in range(0, len(request.token_ids), self.batch_size):
                chunk = np.arange(lo, min(lo + self.batch_size, len(request.token_ids)))
                ids, att = pad_batch([request.token_ids[i] for i in chunk])
                logits = model(
                    input_ids=torch.from_numpy(ids).to(device), attention_mask=torch.from_numpy(att).to(device)
                ).logits
                sel = np.flatnonzero((request.traj >= lo) & (request.traj < lo + len(chunk)))
                rows = torch.from_numpy(request.traj[sel] - lo).to(device)
                cols = torch.from_numpy(request.position[sel] - 1).to(device)
                z = logits[rows, cols].double().cpu().numpy()
                sampled[sel], base[sel] = token_logprobs(
                    z,
                    tokens[sel],
                    request.temperature[sel],
                    request.top_p[sel],
                    request.top_k[sel],
                    support=request.support_mask(sel, z.shape[1]),
                )
        return ReplayResult(sampled=sampled, base=base)
