"""NeMo Gym's capture digests, implemented a second time from the byte layouts its code documents
(nemo-gym 0.7.0): the token-entry digest of a cumulative sequence (`token_id_capture/records.py:50-105`)
and the external-staging digests (`token_id_capture/staging/digest.py:38-263`): the cumulative-prefix
hash, the chain hash of a staged delta onto its parent's, the extras digest and the staged-call digest.
Every integer is big-endian, every length a u64, masks and log-probs IEEE-754 float32 bit patterns."""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..contract.digests import nemo_gym_entry, u64s

STAGING_SCHEMA_VERSION = 2
STAGING_DIGEST_VERSION = 2
EXTRAS_DIGEST_VERSION = 1
CALL_DOMAIN = b"nemo-gym-staging-call-v2"
EXTRAS_DOMAIN = b"nemo-gym-staging-extras-v1"
PREFIX_DOMAIN = b"nemo-gym-staging-prefix-v2"
CHAIN_DOMAIN = b"nemo-gym-staging-chain-v1"


entry_digest = nemo_gym_entry  # the TokenEntry digest: the contract's scheme nemo-gym-tokens-v1


def _ids(ids: Sequence[int]) -> bytes:
    return struct.pack(">Q", len(ids)) + u64s(ids)


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack(">Q", len(raw)) + raw


def _blob(raw: bytes) -> bytes:
    return struct.pack(">Q", len(raw)) + raw


def prefix_hash(ids: Sequence[int]) -> str:
    """A staged call's `cumulative_hash` of the whole sequence up to and including its delta."""
    return hashlib.sha256(PREFIX_DOMAIN + _ids(ids)).hexdigest()


def chain_hash(parent: str | None, delta: Sequence[int]) -> str:
    """A staged call's `chain_hash`: its delta chained onto its parent's chain hash (None: a root)."""
    marker = b"\x00" if parent is None else b"\x01" + bytes.fromhex(parent)
    return hashlib.sha256(CHAIN_DOMAIN + marker + _ids(delta)).hexdigest()


def _floats(values: Sequence[float]) -> bytes:
    arr = np.asarray(values, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise ValueError("masks and log-probs must be finite")
    f32 = arr.astype(">f4")
    if not np.isfinite(f32.astype(np.float64)).all():
        raise ValueError("a value overflows float32")
    return struct.pack(">Q", len(values)) + f32.tobytes()


def _extra(value: Any) -> bytes:
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"B\x01" if value else b"B\x00"
    if isinstance(value, int):
        return b"I" + struct.pack(">q", value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("extras floats must be finite")
        return b"F" + struct.pack(">d", value)
    if isinstance(value, str):
        return b"S" + _text(value)
    if isinstance(value, list):
        return b"L" + struct.pack(">Q", len(value)) + b"".join(_extra(v) for v in value)
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("extras keys must be strings")
        keys = sorted(value, key=lambda k: k.encode("utf-8"))
        return b"D" + struct.pack(">Q", len(keys)) + b"".join(_text(k) + _extra(value[k]) for k in keys)
    raise ValueError(f"extras hold a {type(value).__name__}")


def extras_digest(extras: Mapping[str, Any] | None) -> str:
    """A staged call's `extras_digest` of its extras envelope (None: no extras)."""
    body = struct.pack(">B", EXTRAS_DIGEST_VERSION) + _extra(None if extras is None else dict(extras))
    return hashlib.sha256(EXTRAS_DOMAIN + body).hexdigest()


def staged_digest(rec: Mapping[str, Any]) -> str:
    """A staged call's `digest` over its metadata, token columns, extras digest and both chain digests."""
    parent = rec.get("parent_call_id")
    body = struct.pack(">BBB", rec["schema_version"], rec["digest_version"], rec["extras_digest_version"])
    body += _text(rec["rollout_id"]) + _text(rec["model_call_id"])
    body += b"\x00" if parent is None else b"\x01" + _text(parent)
    body += _text(rec["mode"])
    body += struct.pack(">QQQQ", rec["prev_len"], rec["delta_len"], rec["cum_len"], rec["weight_version"])
    body += _blob(_ids(rec["token_ids_delta"]))
    body += _blob(_floats(rec["token_mask_delta"])) + _blob(_floats(rec["generation_log_probs_delta"]))
    body += bytes.fromhex(rec["extras_digest"])
    body += b"\x01" + bytes.fromhex(rec["chain_hash"]) + b"\x01" + bytes.fromhex(rec["cumulative_hash"])
    return hashlib.sha256(CALL_DOMAIN + body).hexdigest()
