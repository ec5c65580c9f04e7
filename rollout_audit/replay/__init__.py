"""Replay: recompute behaviour log-probs under the checkpoint of the logged policy version and the logged
decoding parameters (checks L205-L207). torch and transformers are optional: imported only by the
replayers that need them. A layer below the checks (L205-L207 call it): imports only the contract."""

from .base import NotConfigured, Replayer, ReplayRequest, ReplayResult, checkpoint_path, pad_batch
from .dist import log_softmax, processed_logprobs, token_logprobs
from .hf import HFReplayer
from .http import HTTPReplayer
from .load import load_replayer
from .run import replay_frame

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
