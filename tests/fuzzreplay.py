"""A replayer for the campaign's replay cases, named in the user's configuration
(`replayer = "fuzzreplay:replayer"`): a fixed bigram model over VOCAB ids in numpy, scored through
the same decoding distributions and the same `replay_max_bytes` blocks as the real replayers, with
ids past VOCAB reported in `ReplayResult.beyond`. Cheap enough for thousands of cases."""

from __future__ import annotations

import numpy as np

from rollout_audit.replay.base import ReplayRequest, ReplayResult
from rollout_audit.replay.dist import row_blocks, token_logprobs

VOCAB = 512


class _Bigram:
    def __init__(self, max_scores: int) -> None:
        self.max_scores = max_scores
        self.table = np.sin(np.arange(VOCAB * VOCAB, dtype=np.float64).reshape(VOCAB, VOCAB)) * 3

    def replay(self, request: ReplayRequest) -> ReplayResult:
        beyond = tuple(
            (i, int(at[0]), int(ids[at[0]]), VOCAB)
            for i, ids in enumerate(request.token_ids)
            if (at := np.flatnonzero(ids >= VOCAB)).size
        )
        lengths = np.array([len(s) for s in request.token_ids], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        flat = np.concatenate(request.token_ids) if request.token_ids else np.zeros(0, np.int64)
        flat = np.where((flat >= 0) & (flat < VOCAB), flat, 0)
        prev = flat[starts[request.traj] + request.position - 1]
        tokens = flat[starts[request.traj] + request.position]
        sampled, base = np.full(len(tokens), np.nan), np.full(len(tokens), np.nan)
        for part in row_blocks(len(tokens), VOCAB, self.max_scores):
            sampled[part], base[part] = token_logprobs(
                self.table[prev[part]],
                tokens[part],
                request.temperature[part],
                request.top_p[part],
                request.top_k[part],
                support=request.support_mask(np.arange(len(tokens))[part], VOCAB),
            )
        outside = np.isin(request.traj, [b[0] for b in beyond])
        sampled[outside], base[outside] = np.nan, np.nan
        return ReplayResult(sampled=sampled, base=base, beyond=beyond)


def replayer(cfg) -> _Bigram:
    return _Bigram(cfg.replay_max_bytes)
