"""Scalars as a TensorBoard event file, written without TensorBoard or TensorFlow installed.

The file is a sequence of TFRecords (little-endian uint64 length, masked CRC-32C of the length,
the payload, masked CRC-32C of the payload), each payload an `Event` protocol buffer: first one
with `file_version`, then one per step with `wall_time`, `step` and a `summary` of
`value {tag, simple_value}` entries. Only these few fields are encoded, by hand."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path


def _crc32c_table() -> tuple[int, ...]:
    """The byte table of CRC-32C (Castagnoli; reflected polynomial 0x82F63B78)."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:  # records are a few hundred bytes: a table walk is fast enough
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The CRC a TFRecord stores: rotated right by 15 bits plus a constant, so that a CRC of
    data that itself holds CRCs stays well distributed."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def record(payload: bytes) -> bytes:
    """One TFRecord around `payload`."""
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc32c(length)) + payload + struct.pack("<I", masked_crc32c(payload))


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # a negative int64 is written as its two's complement, 10 bytes
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes(number: int, data: bytes) -> bytes:
    return _field(number, 2) + _varint(len(data)) + data


def _float32(v: float) -> bytes:
    """A float as 4 bytes; beyond float32's range, an infinity of its sign (never an error)."""
    try:
        return struct.pack("<f", float(v))
    except OverflowError:
        return struct.pack("<f", float("inf") if v > 0 else float("-inf"))


def event(wall_time: float, *, step: int = 0, scalars: Mapping[str, float] | None = None, version: str = "") -> bytes:
    """An `Event`: wall_time (1, double), step (2, int64), file_version (3, string), summary (5)
    whose values (1) each hold a tag (1, string) and a simple_value (2, float)."""
    out = _field(1, 1) + struct.pack("<d", wall_time)
    if step:
        out += _field(2, 0) + _varint(step)
    if version:
        out += _bytes(3, version.encode())
    if scalars:
        values = b"".join(_bytes(1, _bytes(1, tag.encode()) + _field(2, 5) + _float32(v)) for tag, v in scalars.items())
        out += _bytes(5, values)
    return out


class EventFile:
    """An event file in `logdir`, named as TensorBoard looks for them; each `add` is appended and
    flushed at once, so that TensorBoard shows a step as soon as it is audited."""

    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = logdir / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.rollout-audit"
        self._write(event(now, version="brain.Event:2"))

    def add(self, step: int, scalars: Mapping[str, float], wall_time: float | None = None) -> None:
        self._write(event(time.time() if wall_time is None else wall_time, step=step, scalars=scalars))

    def _write(self, payload: bytes) -> None:
        with open(self.path, "ab") as fh:
            fh.write(record(payload))
