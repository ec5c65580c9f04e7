"""The capture layers' digests of an engine call's token sequence that the contract names
(`turns.capture_digest_scheme`): the byte layout of each, implemented from its specification so that
a check recomputes what the layer stamped. NeMo Gym's TokenEntry digest (nemo-gym 0.7.0
`token_id_capture/records.py:50-105`): SHA-256 of the tag `nemo-gym-tokens`, then for a non-empty
sequence a big-endian header (digest version 1 as a byte, the length as a u64) and each id as a
big-endian u64; the empty sequence hashes the tag alone."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence

import numpy as np

NEMO_GYM_TOKENS = "nemo-gym-tokens-v1"
ENTRY_DIGEST_VERSION = 1  # records.py DIGEST_VERSION
ENTRY_DOMAIN = b"nemo-gym-tokens"
_U64 = 2**64


def u64s(ids: Sequence[int] | np.ndarray) -> bytes:
    """Big-endian u64 of each id; ValueError for an id outside [0, 2**64)."""
    arr = np.asarray(ids)
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= _U64):
        raise ValueError("token ids must be unsigned 64-bit integers")
    return arr.astype(np.uint64).astype(">u8").tobytes()


def nemo_gym_entry(ids: Sequence[int] | np.ndarray) -> str:
    """A NeMo Gym TokenEntry's `digest` of its cumulative ids (prompt then generation)."""
    if not len(ids):
        return hashlib.sha256(ENTRY_DOMAIN).hexdigest()
    header = struct.pack(">BQ", ENTRY_DIGEST_VERSION, len(ids))
    return hashlib.sha256(ENTRY_DOMAIN + header + u64s(ids)).hexdigest()


# scheme name -> the digest of a call's whole sequence (context then sampled ids)
SCHEMES: dict[str, Callable[[Sequence[int] | np.ndarray], str]] = {NEMO_GYM_TOKENS: nemo_gym_entry}
