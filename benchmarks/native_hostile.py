"""The native core against its numpy twin on hostile shapes (outside CI): every kernel of
`rollout_audit/frames/_native.c` through its wrapper in `frames/native.py`, and each one called directly
with an output of the wrong size, on empty batches, negative and huge counts (2^31, 2^32, 2^62,
2^63 - 1), counts whose 64-bit sum wraps round to the arrays' length, counts cast from unsigned or
int32 types, token and turn values at int32's ends, indices past their arrays, unsorted rows.

    python benchmarks/native_hostile.py --cases 20000            # in a child process, 4 GB address space
    python benchmarks/native_hostile.py --cases 20000 --first-seed 20000

The cases run in a child process under `RLIMIT_AS`; it prints each seed before its call, so a fatal
signal names the case (the parent starts a new child after it). A case's outcome: `equal` (both paths
gave the same arrays), `both refused` (ValueError, IndexError, TypeError, MemoryError or OverflowError
on both), `native refused` (the core refused what numpy computed: a count or shape check numpy lacks),
`numpy refused` (the core gave arrays where numpy raised), `differ`, or `crash` (the child died by a
signal; `crash (native)` or `crash (numpy)` says which path was running). Summary per kernel and outcome on stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KERNELS = (
    "token_stats",
    "turn_pass",
    "to_go",
    "routes",
    "terms",
    "placement",
    "streams",
    "outside",
    "prefix_sha256",
    "turn_tags",
    "hex_differs",
)
REFUSED = (ValueError, IndexError, TypeError, MemoryError, OverflowError)
COUNT_MODES = ("valid", "valid", "negative", "huge", "wrap", "short", "long", "empty", "unsigned", "int32")


def _counts(rng: np.random.Generator, mode: str) -> tuple[np.ndarray, int]:
    """Per-row token counts in `mode`, and how many tokens the token arrays hold."""
    if mode == "empty":
        return np.zeros(0, np.int64), int(rng.choice([0, 0, 3]))
    n = rng.integers(1, 8)
    lens = rng.integers(0, 12, n).astype(np.int64)
    total = int(lens.sum())
    if mode == "negative":
        lens[rng.integers(n)] = rng.choice([-1, -(2**63), -total - 1])
    elif mode == "huge":
        lens[rng.integers(n)] = rng.choice([2**31, 2**32, 2**62, 2**63 - 1])
    elif mode == "wrap":  # four counts of 2**62 add up to 0 modulo 2**64
        lens = np.array([*([2**62] * 4), total], np.int64)
        rng.shuffle(lens)
    elif mode == "short":
        total += int(rng.integers(1, 4))
    elif mode == "long":
        total = max(0, total - int(rng.integers(1, 4)))
    elif mode == "unsigned":  # 2**64 - 1 cast to int64 by the wrapper: -1
        return np.array([*lens[:-1], 2**64 - 1], np.uint64), total
    elif mode == "int32":  # counts as int32, one of them past it and wrapped
        lens[rng.integers(n)] = np.int64(2**31 + int(lens[0])).astype(np.int32)
        return lens.astype(np.int32), total
    return lens, total


def _tokens(rng: np.random.Generator, total: int) -> dict[str, np.ndarray]:
    """Per-token arrays of `total` tokens with values at their types' ends."""
    ends = np.array([-(2**31), -2, -1, 0, 1, 2, 3, 2**31 - 1], np.int32)
    return {
        "source": rng.integers(0, 256, total).astype(np.uint8)
        if rng.random() < 0.3
        else rng.integers(0, 6, total).astype(np.uint8),
        "mask": rng.random(total) < 0.5,
        "lp": rng.choice(np.array([-1.5, -0.0, 0.0, 2.0, np.nan, np.inf, -np.inf], np.float64), total).astype(
            rng.choice([np.float32, np.float64])
        ),
        "present": rng.random(total) < 0.8,
        "turn": rng.choice(ends, total) if rng.random() < 0.3 else rng.integers(-1, 4, total).astype(np.int32),
        "v": rng.choice(np.array([0.0, 1.0, 3.0, np.nan, -np.inf, 1e300]), total),
    }


def _case(seed: int, native):
    """The kernel, and the call of its wrapper (the same arguments for both paths)."""
    rng = np.random.default_rng(seed)
    kernel = KERNELS[seed % len(KERNELS)]
    mode = COUNT_MODES[int(rng.integers(len(COUNT_MODES)))]
    n_tok, total = _counts(rng, mode)
    t = _tokens(rng, total)
    rows = n_tok.size
    if kernel == "token_stats":
        k = int(rng.integers(0, 4))
        weights = rng.random((36, k)) < 0.5
        if rng.random() < 0.2:  # not 36 rows of weights
            weights = weights[: int(rng.integers(0, 36))]
        args = (n_tok, t["source"], t["mask"], t["lp"], t["present"], weights)
        return kernel, mode, lambda twin: native.token_stats_numpy(*args) if twin else native.token_stats(*args)
    if kernel == "turn_pass":
        tc = rng.integers(0, 4, rows).astype(np.int64)
        ts = np.zeros(rows, np.int64)
        np.cumsum(tc[:-1], out=ts[1:])
        how = rng.choice(["ok", "ok", "start_past", "start_negative", "overlap", "count_huge"])
        if rows and how == "start_past":
            ts[rng.integers(rows)] = rng.choice([2**31, 2**62, int(tc.sum()) + 5])
        elif rows and how == "start_negative":
            ts[rng.integers(rows)] = -1
        elif rows and how == "overlap":
            ts[:] = 0
        elif rows and how == "count_huge":
            tc[rng.integers(rows)] = rng.choice([2**31, -1])
        args = (n_tok, ts, tc, t["turn"], t["source"], t["mask"], t["lp"], t["present"])
        key_t = np.int32 if int(tc.sum()) < 2**31 else np.int64
        return (
            kernel,
            f"{mode}:{how}",
            lambda twin: native.turn_pass_numpy(*args, key_t=key_t) if twin else native.turn_pass(*args),
        )
    if kernel == "to_go":
        row = np.repeat(np.arange(rows), np.clip(n_tok, 0, 12).astype(np.int64) if rows else 0)
        row = row.astype(rng.choice([np.int32, np.int64]))
        if row.size and rng.random() < 0.3:
            rng.shuffle(row)  # not sorted
        if row.size and rng.random() < 0.2:
            row[rng.integers(row.size)] = rng.choice([-(2**31), 2**31 - 1, -1])
        v = rng.normal(0, 1, row.size + int(rng.choice([0, 0, 0, 1, -1 if row.size else 0])))
        return kernel, mode, lambda twin: native.to_go_numpy(v, row) if twin else native.to_go(v, row)
    if kernel == "routes":
        key = rng.integers(-1, 6, total).astype(rng.choice([np.int32, np.int64]))
        if total and rng.random() < 0.3:
            key[rng.integers(total)] = rng.choice([2**31 - 1, 10**6, -(2**31)])
        pv = rng.choice(np.array([1.0, 2.0, np.nan]), int(rng.integers(0, 6)))
        fits = rng.random(rows) < 0.7
        lo, hi = np.zeros(rows + int(rng.choice([0, 0, 1]))), np.full(rows, 3.0)
        present = None if rng.random() < 0.3 else t["present"]
        routes = rng.choice(np.array([0, 1, 3, -1, 2**63 - 1, -(2**63)]), total).astype(np.int64)
        args = (n_tok, key, t["source"], routes, present, fits, pv, lo, hi)
        floats = native.floats(routes, present)
        return (
            kernel,
            mode,
            lambda twin: native.routes_numpy(*args[:3], floats, *args[4:]) if twin else native.routes(*args),
        )
    if kernel == "terms":
        at = rng.integers(0, max(total, 1), int(rng.integers(0, 10))).astype(np.int64)
        if at.size and rng.random() < 0.4:
            at[rng.integers(at.size)] = rng.choice([total, -1, 2**62, -(2**63)])
        rew = t["v"]
        kl = None if rng.random() < 0.4 else rng.normal(0, 1, total + int(rng.choice([0, 0, 1])))
        rp = None if rng.random() < 0.4 else t["present"]
        kp = None if kl is None or rng.random() < 0.5 else rng.random(kl.size) < 0.5
        return (
            kernel,
            mode,
            lambda twin: native.terms_numpy(at, rew, rp, kl, kp) if twin else native.terms(at, rew, rp, kl, kp),
        )
    if kernel == "placement":
        args = (n_tok, t["source"], t["turn"], t["v"], t["present"])
        return kernel, mode, lambda twin: native.placement_numpy(*args) if twin else native.placement(*args)
    if kernel == "streams":
        stream = None if rng.random() < 0.3 else rng.choice(np.array([0, 1, 2, 255], np.uint8), total)
        weight = None if rng.random() < 0.3 else t["v"][: total + int(rng.choice([0, 0, -1 if total else 0]))]
        sp = None if stream is None or rng.random() < 0.5 else t["present"]
        wp = None if weight is None or rng.random() < 0.5 else rng.random(weight.size) < 0.5
        args = (t["mask"], t["source"], stream, sp, weight, wp)
        return kernel, mode, lambda twin: native.streams_numpy(*args) if twin else native.streams(*args)
    if kernel == "outside":
        held = rng.integers(-2, 5, total).astype(np.int32)
        length = rng.integers(0, 4, total).astype(np.int64)
        if total and rng.random() < 0.4:
            length[rng.integers(total)] = rng.choice([-1, 2**31, 2**62, 2**63 - 1])
        ids = rng.integers(-2, 5, max(0, int(np.clip(length, 0, 10).sum()) + int(rng.choice([0, 0, 1, -1])))).astype(
            rng.choice([np.int32, np.int64, np.int16, np.uint32])
        )
        return (
            kernel,
            mode,
            lambda twin: native.outside_numpy(held, length, ids) if twin else native.outside(held, length, ids),
        )
    if kernel == "turn_tags":
        key = np.where(t["turn"] >= 0, t["turn"], -1)[: total + int(rng.choice([0, 0, 1 if total else 0, -1]))]
        key = key.astype(rng.choice([np.int32, np.int64]))
        args = (n_tok, t["turn"], key)
        return kernel, mode, lambda twin: native.turn_tags_numpy(*args) if twin else native.turn_tags(*args)
    if kernel == "hex_differs":
        k = int(rng.integers(0, 6))
        lengths = rng.choice(np.array([0, 63, 64, 64, 64, 65]), k)
        offsets = np.zeros(k + 1, rng.choice([np.int32, np.int64]))
        np.cumsum(lengths, out=offsets[1:])
        data = rng.choice(np.frombuffer(b"0123456789abcdefABCDEFgz", np.uint8), int(offsets[-1]))
        if k and rng.random() < 0.3:  # a boundary past the data, or decreasing
            offsets[rng.integers(1, k + 1)] = rng.choice([-1, int(offsets[-1]) + 1, 2**31 - 1])
        at = rng.integers(0, max(k, 1), int(rng.integers(0, 6))).astype(np.int64)
        if at.size and rng.random() < 0.3:
            at[rng.integers(at.size)] = rng.choice([k, -1, 2**62, -(2**63)])
        valid = None if rng.random() < 0.5 else rng.random(k + int(rng.choice([0, 0, 1]))) < 0.8
        digests = rng.integers(0, 256, (at.size + int(rng.choice([0, 0, 1])), 32)).astype(np.uint8)
        args = (offsets, data, valid, at, digests)
        return kernel, mode, lambda twin: native.hex_differs_numpy(*args) if twin else native.hex_differs(*args)
    data = memoryview(bytes(rng.integers(0, 256, int(rng.integers(0, 64))).astype(np.uint8)))
    m = int(rng.integers(0, 6))
    lo = rng.integers(0, max(len(data), 1), m).astype(np.int64)
    hi = lo + rng.integers(0, 8, m)
    if m and rng.random() < 0.4:
        (lo if rng.random() < 0.5 else hi)[rng.integers(m)] = rng.choice([-1, 2**62, -(2**63), len(data) + 1])
    first = rng.random(m) < 0.5
    return (
        kernel,
        mode,
        lambda twin: (
            native.prefix_sha256_python(data, lo, hi, first) if twin else native.prefix_sha256(data, lo, hi, first)
        ),
    )


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        b = np.asarray(b)
        if a.dtype.kind == "f":
            return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))
        return a.shape == b.shape and bool(np.array_equal(a, b))
    return a == b


def child(first: int, last: int) -> None:
    """Run seeds first..last-1 here, one JSON line each; the seed is printed before its call."""
    sys.path.insert(0, str(ROOT))
    from rollout_audit.frames import native

    compiled = native.ACTIVE
    if compiled is None:
        raise SystemExit("the native core is not built (or ROLLOUT_AUDIT_NO_NATIVE=1)")
    limit = 4 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    np.seterr(all="ignore")
    for seed in range(first, last):
        kernel, mode, call = _case(seed, native)
        print(json.dumps({"start": seed}), flush=True)
        got: list = []
        for twin in (False, True):
            print(json.dumps({"phase": "numpy" if twin else "native"}), flush=True)
            native.ACTIVE = None if twin else compiled
            try:
                got.append(("ok", call(twin)))
            except REFUSED as e:
                got.append(("refused", f"{type(e).__name__}: {e}"[:200]))
        native.ACTIVE = compiled
        (a, x), (b, y) = got
        if a == b == "ok":
            outcome = "equal" if _same(x, y) else "differ"
        elif a == b:
            outcome = "both refused"
        else:
            outcome = "native refused" if a == "refused" else "numpy refused"
        row = {"seed": seed, "kernel": kernel, "mode": mode, "outcome": outcome}
        if outcome not in ("equal", "both refused"):
            row["why"] = x if a == "refused" else y if b == "refused" else ""
        print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=20000)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--out", default="native_hostile.jsonl")
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    seed, last = a.first_seed, a.first_seed + a.cases
    rows: list[dict] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    while seed < last:
        p = subprocess.run(
            [sys.executable, __file__, "--child", str(seed), str(last)], capture_output=True, text=True, env=env
        )
        started = phase = None
        for line in p.stdout.splitlines():
            r = json.loads(line)
            if "start" in r:
                started = r["start"]
            elif "phase" in r:
                phase = r["phase"]
            else:
                rows.append(r)
                started = None
        if p.returncode == 0:
            break
        if started is None:
            raise SystemExit(f"the child failed outside a case ({p.returncode}): {p.stderr[-2000:]}")
        rows.append({"seed": started, "kernel": KERNELS[started % len(KERNELS)], "outcome": f"crash ({phase})",
                     "why": f"exit {p.returncode}: {p.stderr[-600:]}"})  # fmt: skip
        seed = started + 1
    Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    per = collections.defaultdict(collections.Counter)
    for r in rows:
        per[r["kernel"]][r["outcome"]] += 1
        per["all"][r["outcome"]] += 1
    print(json.dumps({k: dict(v) for k, v in per.items()}, indent=1))
    odd = [r for r in rows if r["outcome"].startswith(("crash", "differ", "numpy refused"))]
    for r in odd[:20]:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
