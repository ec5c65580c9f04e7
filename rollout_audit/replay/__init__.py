"""Replay: recompute behaviour log-probs under the checkpoint of the logged policy version and the logged
decoding parameters (checks L205-L207). torch and transformers are optional: imported only by the
replayers that need them. A layer below the checks (L205-L207 call it): imports only the contract."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import NotConfigured, Replayer, ReplayRequest, ReplayResult, checkpoint_path, pad_batch
from .dist import log_softmax, processed_logprobs, token_logprobs
from .load import load_replayer
from .run import replay_frame

if TYPE_CHECKING:
    from .hf import HFReplayer
    from .http import HTTPReplayer

# The replayers, imported on first use: the HTTP one brings the HTTP client (http.client, ssl,
# urllib), which an audit that replays nothing never needs.
_REPLAYERS = {"HFReplayer": ".hf", "HTTPReplayer": ".http"}

__all__ = [
    "HFReplayer",
    "HTTPReplayer",
    "NotConfigured",
    "ReplayRequest",
    "ReplayResult",
    "Replayer",
    "checkpoint_path",
    "load_replayer",
    "log_softmax",
    "pad_batch",
    "processed_logprobs",
    "replay_frame",
    "token_logprobs",
]


def __getattr__(name: str) -> Any:
    if name in _REPLAYERS:
        return getattr(importlib.import_module(_REPLAYERS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
