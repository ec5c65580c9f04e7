"""Decoding distributions in numpy: the log-prob of a token under the base softmax and under the
distribution a sampler actually drew from (action mask → temperature → top-k → top-p → renormalise;
where the engine recorded the nucleus it kept, the recorded support replaces top-k and top-p)."""

from __future__ import annotations

import numpy as np

# [rows, V] float64 arrays `token_logprobs` holds at once (the scores, their sort, cumulative mass, masks)
_COPIES = 8


def row_blocks(n: int, vocab: int, max_bytes: int) -> list[slice]:
    """Consecutive slices of n scored rows, each small enough that scoring it over a vocabulary
    of `vocab` holds at most about `max_bytes` (one row at least)."""
    step = max(1, max_bytes // (max(vocab, 1) * 8 * _COPIES))
    return [slice(lo, min(lo + step, n)) for lo in range(0, n, step)]


def log_softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of [N, V] scores; rows that are all -inf stay -inf."""
    m = np.max(z, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # +inf scores give NaN, said by L205
        return z - m - np.log(np.sum(np.exp(z - m), axis=-1, keepdims=True))


def _top_k(z: np.ndarray, top_k: np.ndarray) -> np.ndarray:
    """Keep the k largest scores of each row where k > 0 (ties at the k-th value are kept, as samplers do)."""
    on = (top_k > 0) & (top_k < z.shape[1])
    if not on.any():
        return z
    desc = -np.sort(-z, axis=1)
    kth = desc[np.arange(len(z)), np.clip(top_k, 1, z.shape[1]) - 1][:, None]
    return np.where(on[:, None] & (z < kth), -np.inf, z)


def _top_p(logp: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Nucleus: keep the smallest prefix of the sorted distribution whose mass reaches top_p (the
    crossing token is kept), per row; rows with top_p >= 1 keep everything."""
    on = top_p < 1.0
    if not on.any():
        return logp
    order = np.argsort(-logp, axis=1, kind="stable")
    p_sorted = np.exp(np.take_along_axis(logp, order, axis=1))
    before = np.cumsum(p_sorted, axis=1) - p_sorted  # mass strictly before each token
    keep_sorted = (before < top_p[:, None]) | ~on[:, None]
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    return np.where(keep, logp, -np.inf)


def processed_logprobs(
    logits: np.ndarray,
    temperature: np.ndarray,
    top_p: np.ndarray,
    top_k: np.ndarray,
    mask: np.ndarray | None = None,
    support: np.ndarray | None = None,
) -> np.ndarray:
    """[N, V] log-probs of the distribution sampled from, one row per scored token with its own parameters.

    `logits` may be raw scores or base log-probs (the same distribution after a shift). Temperature <= 0
    means greedy: all mass on the arg-max. `mask` (True = allowed) is the producer's action mask.
    `support` (True = kept) is the nucleus the engine recorded: a row with one is renormalised over it
    after the temperature, as a trainer replaying the sampler does, and top-k / top-p are not
    recomputed there; a row without one (all False) gets top-k and top-p.
    """
    z = np.asarray(logits, dtype=np.float64)
    if mask is not None:
        z = np.where(mask, z, -np.inf)
    t = np.asarray(temperature, dtype=np.float64)
    greedy = ~(t > 0)
    z = z / np.where(greedy, 1.0, t)[:, None]
    top_k = np.asarray(top_k, dtype=np.int64)
    top_p = np.asarray(top_p, dtype=np.float64)
    if support is not None:
        recorded = np.any(support, axis=1, keepdims=True)
        z = np.where(recorded & ~support, -np.inf, z)
        top_k, top_p = np.where(recorded[:, 0], 0, top_k), np.where(recorded[:, 0], 1.0, top_p)
    z = _top_k(z, top_k)
    logp = _top_p(log_softmax(z), top_p)
    if greedy.any():
        best = np.argmax(z, axis=1)
        one_hot = np.where(np.arange(z.shape[1])[None, :] == best[:, None], 0.0, -np.inf)
        logp = np.where(greedy[:, None], one_hot, logp)
    return log_softmax(logp)


def token_logprobs(
    logits: np.ndarray,
    tokens: np.ndarray,
    temperature: np.ndarray,
    top_p: np.ndarray,
    top_k: np.ndarray,
    mask: np.ndarray | None = None,
    support: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(sampled, base) log-probs of `tokens` [N] under the processed and the base distributions of [N, V]
    logits (`support`: the recorded nucleus, see `processed_logprobs`)."""
    rows = np.arange(len(tokens))
    base = log_softmax(np.asarray(logits, dtype=np.float64))[rows, tokens]
    sampled = processed_logprobs(logits, temperature, top_p, top_k, mask, support)[rows, tokens]
    return sampled, base
