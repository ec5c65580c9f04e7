"""Choose the replayer the configuration names: an importable factory (`replayer = "module:factory"`),
OpenAI-compatible endpoints per version (`replay_endpoints`), or Hugging Face checkpoints
(`replay_checkpoints`). Nothing in a log chooses code: only the user's configuration does."""

from __future__ import annotations

import importlib
from typing import Any

from .base import NotConfigured, Replayer


def factory(spec: str) -> Any:
    """The callable named by "package.module:function"."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise NotConfigured(f"replayer must be 'module:factory', not {spec!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise NotConfigured(f"replayer {spec!r} cannot be imported: {e}") from e


def load_replayer(cfg: Any) -> Replayer:
    """The configured replayer, or NotConfigured with the reason replay cannot run."""
    if cfg.replayer:
        return factory(cfg.replayer)(cfg)
    if cfg.replay_endpoints:
        from .http import HTTPReplayer

        return HTTPReplayer(
            dict(cfg.replay_endpoints),
            batch_size=cfg.replay_batch_size,
            timeout=cfg.replay_timeout,
            connect_timeout=cfg.replay_connect_timeout,
            max_bytes=cfg.replay_max_response_bytes,
            max_scores=cfg.replay_max_bytes,
        )
    if cfg.replay_checkpoints:
        from .hf import HFReplayer

        return HFReplayer(cfg.replay_checkpoints, batch_size=cfg.replay_batch_size, max_scores=cfg.replay_max_bytes)
    raise NotConfigured(
        "no replayer configured: set replay_checkpoints (Hugging Face checkpoint per version), "
        "replay_endpoints (OpenAI-compatible server per version) or replayer = 'module:factory', "
        "in a --config FILE or your project's pyproject.toml [tool.rollout-audit] (never one inside the log)"
    )
