"""Process-wide allocator settings for long audits (the CLI opts in; a library caller's
process is left alone)."""

from __future__ import annotations

import contextlib
import os
import sys

import pyarrow as pa

_TUNED = False


def tune_allocator() -> None:
    """Keep freed numpy buffers in the process instead of returning them to the kernel.

    Each batch allocates and frees the same few arrays of tens of MB; with glibc's defaults
    every one is a fresh mmap whose pages fault in again (expensive under virtualisation: up
    to a third of the audit was system time). A fixed mmap threshold and no heap trimming make
    the next batch reuse the same memory; the peak is unchanged (bounded by the batch).
    Arrow allocates from jemalloc, returning pages unused for 300 ms: decoding a row group of
    list columns needs ~4x the decoded size for a moment, which the default mimalloc pool kept
    (about 60 MB of peak RSS per audit), at no measurable cost in time.
    Set ROLLOUT_AUDIT_NO_MALLOPT=1 to leave the allocators alone."""
    global _TUNED
    if _TUNED:
        return
    _TUNED = True
    if os.environ.get("ROLLOUT_AUDIT_NO_MALLOPT") or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(NotImplementedError, pa.ArrowException):  # a pyarrow built without jemalloc
        pa.set_memory_pool(pa.jemalloc_memory_pool())
        pa.jemalloc_set_decay_ms(300)
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 512 * 2**20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1024 * 2**20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: keep the platform's defaults
        return


def release_memory() -> None:
    """Return memory the allocators keep for reuse (glibc heap, Arrow's pool) to the OS."""
    pa.default_memory_pool().release_unused()
    if sys.platform.startswith("linux") and not os.environ.get("ROLLOUT_AUDIT_NO_MALLOPT"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: nothing to trim
            return
