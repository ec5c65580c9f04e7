"""The native core (rollout_audit/frames/_native.c) against its pure-Python path: the same
prefix digests and per-row token counts on hypothesis-generated batches, and the same audit on
every named fault.

The session compiles the extension with the build hook's own command when the tree was not
installed with it (tests/conftest.py), so these tests always run the C code."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import faultgroups
import numpy as np
import pytest
from conftest import compile_native, load_native
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_audit.frames import batch, native
from rollout_audit.reading.io import discover
from rollout_audit.running.engine import run_audit
from rollout_audit.synth import make_log


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The extension the session runs (tests/conftest.py: installed, or compiled for the session), or
    compiled now by hatch_build.compile_native (a session started with ROLLOUT_AUDIT_NO_NATIVE=1)."""
    if native.ACTIVE is not None:
        return native.ACTIVE
    return load_native(compile_native(tmp_path_factory.mktemp("native")))


def _native_digests(mod, data, lo, hi, first):
    out = np.empty((lo.size, 32), np.uint8)
    mod.prefix_sha256(data, lo.astype(np.int64), hi.astype(np.int64), first.view(np.uint8), out)
    return out


# a batch: per trajectory a token count and the sorted prefix lengths hashed in it
batches = st.lists(
    st.tuples(st.integers(0, 300), st.lists(st.integers(0, 300), min_size=1, max_size=6)), min_size=1, max_size=8
)


def _layout(batch, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(-(2**31), 2**31, sum(n for n, _ in batch), dtype=np.int64).astype("<i4")
    data = ids.data.cast("B")
    lo, hi, first, start = [], [], [], 0
    for n, cuts in batch:
        prev = start * 4
        for k, c in enumerate(sorted(min(c, n) for c in cuts)):
            first.append(k == 0)
            lo.append(prev)
            hi.append((start + c) * 4)
            prev = hi[-1]
        start += n
    return data, ids, np.array(lo), np.array(hi), np.array(first)


@settings(max_examples=150, deadline=None)
@given(batches, st.integers(0, 2**32 - 1))
def test_native_digests_equal_hashlib(compiled, batch, seed):
    data, ids, lo, hi, first = _layout(batch, seed)
    got = _native_digests(compiled, data, lo, hi, first)
    assert np.array_equal(got, native.prefix_sha256_python(data, lo, hi, first))
    # and each row is the digest of its whole prefix, computed from scratch
    start = 0
    for i in range(lo.size):
        start = lo[i] if first[i] else start
        assert got[i].tobytes() == hashlib.sha256(bytes(data[start : hi[i]])).digest()


def test_block_boundaries_and_the_portable_path(compiled):
    """Every length around the 64-byte blocks and the padding's 56-byte edge, with the CPU's SHA
    instructions and with the portable C compression (a process where they are switched off)."""
    code = (
        "import hashlib, sys, numpy as np, importlib.util as u\n"
        "s = u.spec_from_file_location('rollout_audit.frames._native', sys.argv[1]); m = u.module_from_spec(s)\n"
        "s.loader.exec_module(m); d = bytes(range(256)) * 3\n"
        "for n in range(0, 700):\n"
        "    o = np.empty((2, 32), np.uint8)\n"
        "    m.prefix_sha256(d, np.array([0, n // 2]), np.array([n // 2, n]), np.array([1, 0], np.uint8), o)\n"
        "    assert o[1].tobytes() == hashlib.sha256(d[:n]).digest(), n\n"
        "    assert o[0].tobytes() == hashlib.sha256(d[: n // 2]).digest(), n\n"
        "print(m.sha_extensions())\n"
    )
    for off in (False, True):
        env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_AUDIT_NO_SHA_EXTENSIONS"}
        if off:
            env["ROLLOUT_AUDIT_NO_SHA_EXTENSIONS"] = "1"
        done = subprocess.run([sys.executable, "-c", code, compiled.__file__], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        if off:
            assert done.stdout.strip() == "False"


def test_out_of_range_prefixes_are_refused(compiled):
    out = np.empty((1, 32), np.uint8)
    with pytest.raises(ValueError, match="not inside"):
        compiled.prefix_sha256(b"abcd", np.array([0]), np.array([8]), np.array([1], np.uint8), out)
    with pytest.raises(ValueError, match="as many prefixes"):
        compiled.prefix_sha256(b"abcd", np.array([0]), np.array([4]), np.array([1], np.uint8), np.empty(8, np.uint8))


SPECIAL = np.array([-1.5, -0.0, 0.0, 1e-30, 2.0, np.nan, np.inf, -np.inf, -1e30], np.float64)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=0, max_size=12), st.integers(0, 2**32 - 1), st.booleans())
def test_native_token_stats_equal_numpy(compiled, n_tok, seed, single):
    """Per-row token statistics (every count of `Tokens.stats`, and random weights) on random sources
    (out of range: any value above 4), masks, log-probs with NaN, infinities, signed zeros and values
    above 0, some absent; float32 and float64."""
    rng = np.random.default_rng(seed)
    n_tok = np.array(n_tok, np.int64)
    total = int(n_tok.sum())
    source = rng.integers(0, 9, total).astype(np.uint8)
    mask = rng.random(total) < 0.5
    lp = rng.choice(SPECIAL, total).astype(np.float32 if single else np.float64)
    present = rng.random(total) < 0.8
    for weights in (batch._STAT_WEIGHTS, rng.random((36, 5)) < 0.3):
        got, want = _both(compiled, native.token_stats, n_tok, source, mask, lp, present, weights)
        assert got.shape == (weights.shape[1], n_tok.size) and got.dtype == want.dtype == np.int64
        assert np.array_equal(got, want)
    assert list(batch._STAT_CATEGORIES) == list(batch.STAT_INPUTS)  # the frame's columns, in their order


# a batch for the per-turn pass: per row, its turn count and its tokens' token_turn values (in
# range, -1, past the row's turns, and out of turn order)
turn_rows = st.lists(
    st.tuples(st.integers(0, 5), st.lists(st.integers(-2, 6), min_size=0, max_size=300)), min_size=0, max_size=8
)


@settings(max_examples=150, deadline=None)
@given(turn_rows, st.integers(0, 2**32 - 1), st.booleans(), st.booleans())
def test_native_turn_pass_equals_numpy(compiled, rows, seed, single, ordered):
    """Turn keys, policy tokens grouped by turn, per-turn counts, first positions and float64
    log-prob sums: the same bits as the numpy path (np.add.reduceat's pairwise order), on log-probs
    of every magnitude with NaN, infinities, signed zeros and absent values."""
    rng = np.random.default_rng(seed)
    n_tok = np.array([len(t) for _, t in rows], np.int64)
    turn_count = np.array([k for k, _ in rows], np.int64)
    turn_start = np.zeros(n_tok.size, np.int64)
    np.cumsum(turn_count[:-1], out=turn_start[1:])
    turn = np.array([x for _, t in rows for x in (sorted(t) if ordered else t)], np.int32)
    total = turn.size
    source = rng.integers(0, 6, total).astype(np.uint8)
    source[rng.random(total) < 0.5] = 2
    mask = rng.random(total) < 0.5
    lp = -np.exp(rng.normal(0, 8, total)) * rng.choice([1, -1], total, p=[0.95, 0.05])
    special = rng.random(total) < 0.1
    lp[special] = rng.choice(SPECIAL, int(special.sum()))
    lp = lp.astype(np.float32 if single else np.float64)
    present = rng.random(total) < 0.9
    args = (n_tok, turn_start, turn_count, turn, source, mask, lp, present)
    want = native.turn_pass_numpy(*args, key_t=np.int32)
    active = native.ACTIVE
    native.ACTIVE = compiled
    try:
        got = native.turn_pass(*args)
    finally:
        native.ACTIVE = active
    for name, g, w in zip(want._fields, got, want):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes(), name


def test_long_turns_sum_as_numpy_does(compiled):
    """Turns of up to 20,000 policy tokens: the pairwise sum's recursion and numpy's buffering."""
    rng = np.random.default_rng(7)
    lens = [1, 7, 8, 9, 127, 128, 129, 130, 1000, 8191, 8193, 20000]
    n_tok = np.array(lens, np.int64)
    ones = np.ones(n_tok.size, np.int64)
    total = int(n_tok.sum())
    args = (n_tok, np.arange(n_tok.size, dtype=np.int64), ones, np.zeros(total, np.int32))
    for dt in (np.float32, np.float64):
        lp = (-np.exp(rng.normal(0, 6, total))).astype(dt)
        tail = (np.full(total, 2, np.uint8), np.zeros(total, bool), lp, np.ones(total, bool))
        want = native.turn_pass_numpy(*args, *tail, key_t=np.int32)
        active, native.ACTIVE = native.ACTIVE, compiled
        try:
            got = native.turn_pass(*args, *tail)
        finally:
            native.ACTIVE = active
        assert got.lp_sum.tobytes() == want.lp_sum.tobytes()


def test_turn_sums_refuse_inconsistent_counts(compiled):
    n_tok, ts, tc = np.array([3], np.int64), np.array([0], np.int64), np.array([1], np.int64)
    key, src = np.zeros(3, np.int32), np.full(3, 2, np.uint8)
    lp, pres = np.zeros(3, np.float32), np.ones(3, np.uint8)
    out = [np.empty(1, t) for t in (np.int64, np.int64, np.float64, np.int64)]
    with pytest.raises(ValueError, match="not those of turn_keys"):  # two policy tokens counted, three found
        compiled.turn_sums(n_tok, ts, tc, key, src, lp, pres, np.array([2]), np.empty(2, np.int64), *out)
    with pytest.raises(ValueError, match="as many entries"):  # a negative count
        compiled.turn_sums(n_tok, ts, tc, key, src, lp, pres, np.array([-1]), np.empty(0, np.int64), *out)
    with pytest.raises(ValueError, match="outside the batch"):
        compiled.turn_sums(n_tok, ts, np.array([2]), key, src, lp, pres, np.array([3]), np.empty(3, np.int64), *out)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=0, max_size=10), st.integers(0, 2**32 - 1), st.booleans())
def test_native_to_go_equals_numpy(compiled, lens, seed, wide):
    """The reward-to-go per row: the same bits as numpy's cumulative sum and differences, on values
    of every magnitude with NaN, infinities and signed zeros."""
    rng = np.random.default_rng(seed)
    row = np.repeat(np.arange(len(lens)), lens).astype(np.int64 if wide else np.int32)
    v = rng.normal(0, 1, row.size) * np.exp(rng.normal(0, 10, row.size))
    special = rng.random(row.size) < 0.05
    v[special] = rng.choice(SPECIAL, int(special.sum()))
    out = np.empty(row.size, np.float64)
    compiled.to_go(v, row, out)
    with np.errstate(invalid="ignore"):  # inf - inf
        want = native.to_go_numpy(v, row)
    # the same bits, NaN aside: which NaN operand an addition passes on is the compiler's choice
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan) and out[~nan].tobytes() == want[~nan].tobytes()


@settings(max_examples=150, deadline=None)
@given(turn_rows, st.integers(0, 2**32 - 1), st.booleans())
def test_native_routes_equal_numpy(compiled, rows, seed, complete):
    """P505's per-token conditions: lost routes, policy tokens replayed with another version than
    their turn's, other tokens outside their row's versions; int64 routes as stored (absent ones
    among them) against NaN versions, rows whose list does not fit, and tokens outside every turn."""
    rng = np.random.default_rng(seed)
    n_tok = np.array([len(t) for _, t in rows], np.int64)
    turn_count = np.array([k for k, _ in rows], np.int64)
    turn_start = np.zeros(n_tok.size, np.int64)
    np.cumsum(turn_count[:-1], out=turn_start[1:])
    turn = np.array([x for _, t in rows for x in t], np.int32)
    source = rng.integers(0, 6, turn.size).astype(np.uint8)
    key = native.turn_pass_numpy(
        n_tok,
        turn_start,
        turn_count,
        turn,
        source,
        *(np.zeros(turn.size, t) for t in (bool, np.float32, bool)),
        key_t=np.int32,
    ).key
    pv = rng.integers(0, 4, int(turn_count.sum())).astype(np.float64)
    pv[rng.random(pv.size) < 0.1] = np.nan
    lo, hi = rng.integers(0, 3, n_tok.size).astype(np.float64), rng.integers(1, 5, n_tok.size).astype(np.float64)
    # routes as stored (int64, extreme values among them; a slot without a value holds anything)
    v = rng.choice(np.r_[0, 1, 2, 3, 4, -1, 2**53 + 1, 2**63 - 1, -(2**63)], turn.size).astype(np.int64)
    present = None if complete else rng.random(turn.size) < 0.8
    fits = rng.random(n_tok.size) < 0.8
    args = (n_tok, key, source, v, present, fits, pv, lo, hi)
    got, want = _both(compiled, native.routes, *args)
    for g, w, old in zip(got, want, native.routes_numpy(n_tok, key, source, native.floats(v, present), *args[4:])):
        assert g.dtype == w.dtype == np.bool_ and np.array_equal(g, w) and np.array_equal(w, old)


def _both(compiled, func, *args):
    """`func` on the native core, then on the numpy path."""
    active, native.ACTIVE = native.ACTIVE, compiled
    try:
        got = func(*args)
    finally:
        native.ACTIVE = None
    try:
        want = func(*args)
    finally:
        native.ACTIVE = active
    return got, want


@settings(max_examples=150, deadline=None)
@given(turn_rows, st.integers(0, 2**32 - 1), st.booleans(), st.booleans(), st.booleans())
def test_native_reward_terms_and_placement_equal_numpy(compiled, rows, seed, single, with_kl, complete):
    """R411's misplaced rewards and per-row placed counts, R413's reward − KL terms: the same on
    float32 and float64 lists with NaN, infinities, signed zeros, zeros and absent values."""
    rng = np.random.default_rng(seed)
    n_tok = np.array([len(t) for _, t in rows], np.int64)
    turn = np.array([x for _, t in rows for x in t], np.int32)
    source = rng.integers(0, 6, turn.size).astype(np.uint8)
    source[rng.random(turn.size) < 0.5] = 2
    dt = np.float32 if single else np.float64
    lists = [rng.choice(np.r_[SPECIAL, 0.0, 0.0, 0.5], turn.size).astype(dt) for _ in range(2)]
    present = [None if complete else rng.random(turn.size) < 0.8 for _ in range(2)]
    at = np.flatnonzero(source == 2)
    with np.errstate(invalid="ignore"):  # inf - inf
        got, want = _both(compiled, native.terms, at, lists[0], present[0], lists[1] if with_kl else None, present[1])
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and got[~nan].tobytes() == want[~nan].tobytes()
    flags = np.ones(turn.size, bool) if complete else present[0]
    got, want = _both(compiled, native.placement, n_tok, source, turn, lists[0], flags)
    assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want))


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2000),
    st.integers(0, 2**32 - 1),
    st.booleans(),
    st.sampled_from(["both", "stream", "weight"]),
    st.booleans(),
    st.booleans(),
)
def test_native_loss_streams_equal_numpy(compiled, n, seed, single, columns, stream_complete, weight_complete):
    """M110's per-token bits: uint8 streams 0, 1, 2 and above, some absent, on every source, in and out of the loss; float32 and float64 weights with NaN, infinities,
    signed zeros, zeros and absent values; either column alone."""
    rng = np.random.default_rng(seed)
    mask = rng.random(n) < 0.5
    source = rng.integers(0, 7, n).astype(np.uint8)
    stream = weight = stream_present = weight_present = None
    if columns != "weight":
        stream = rng.choice(np.r_[0, 1, 1, 2, 255], n).astype(np.uint8)  # a slot without a value holds anything
        stream_present = None if stream_complete else rng.random(n) < 0.8
    if columns != "stream":
        dt = np.float32 if single else np.float64
        weight = rng.choice(np.r_[SPECIAL, 0.0, 0.0, 0.5, 1.0, 1.0], n).astype(dt)
        weight_present = None if weight_complete else rng.random(n) < 0.8
    args = (mask, source, stream, stream_present, weight, weight_present)
    (got, got_seen), (want, want_seen) = _both(compiled, native.streams, *args)
    assert got.dtype == want.dtype == np.uint8 and np.array_equal(got, want) and got_seen == want_seen
    assert want_seen == int(np.bitwise_or.reduce(want)) if n else want_seen == 0
    if stream is not None:  # the float path: the same stream values, NaN where absent
        floats = np.where(stream_present, stream, np.nan) if stream_present is not None else stream.astype(float)
        assert np.array_equal(native.streams_numpy(mask, source, floats, stream_present, *args[4:])[0], want)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 500), st.integers(0, 2**32 - 1), st.booleans())
def test_float_loss_streams_truncate_toward_zero(n, seed, complete):
    """A loss_stream of another type than the contract's uint8 (a table built without the reader's
    cast) goes through the numpy path: fractions, negatives, NaN and infinities count as their
    value truncated toward zero, NaN as 0."""
    rng = np.random.default_rng(seed)
    mask, source = np.ones(n, bool), rng.integers(0, 6, n).astype(np.uint8)
    stream = rng.choice(np.r_[0.0, 1.0, 2.0, 255.0, 1.5, 0.99, -1.0, np.nan, np.inf, -np.inf], n)
    present = None if complete else rng.random(n) < 0.8
    bits, _ = native.streams(mask, source, stream, present, None, None)
    t = np.where(np.isnan(stream), 0.0, np.trunc(stream))
    if present is not None:
        t[~present] = 0.0
    assert np.array_equal(bits & native.UNKNOWN_STREAM != 0, t > 1)
    assert np.array_equal(bits & native.ECHO_WRONG != 0, (t == 1) & (source != 1) & (source != 3))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=0, max_size=400), st.integers(0, 2**32 - 1), st.booleans())
def test_native_nucleus_membership_equals_numpy(compiled, spans, seed, wide):
    """L210's tokens outside their recorded nucleus: empty spans, the token first, last, absent or
    repeated in its span, negative and extreme ids, int32 and int64 kept ids (a null kept id is -1)."""
    rng = np.random.default_rng(seed)
    length = np.array(spans, np.int64)
    held = rng.choice(np.r_[0, 1, 2, -1, 2**31 - 1, -(2**31)], length.size).astype(np.int32)
    ids = rng.choice(np.r_[0, 1, 2, -1, 2**31 - 1, -(2**31)], int(length.sum())).astype(np.int64 if wide else np.int32)
    got, want = _both(compiled, native.outside, held, length, ids)
    assert got.dtype == want.dtype == np.bool_ and np.array_equal(got, want)
    if length.size:
        with pytest.raises(ValueError, match="do not add up"):
            compiled.outside(held, length + 1, ids, np.empty(length.size, np.uint8))


@pytest.fixture(scope="module")
def base():
    return make_log(n_tasks=4, group_size=4, n_versions=2, seed=0)


def _findings(result):
    return sorted(result.findings.to_dicts(), key=json.dumps), result.summary, result.not_run


@pytest.mark.parametrize("group", faultgroups.GROUPS, ids=faultgroups.group_id)
def test_every_named_fault_audits_alike_with_and_without_the_native_core(compiled, base, tmp_path, monkeypatch, group):
    faultgroups.write_group(tmp_path / "log", group, *base)
    cfg = faultgroups.config(group)
    monkeypatch.setattr(native, "ACTIVE", compiled)
    with_core = _findings(run_audit(discover([tmp_path / "log"]), cfg, batch_rows=5))
    monkeypatch.setattr(native, "ACTIVE", None)
    assert _findings(run_audit(discover([tmp_path / "log"]), cfg, batch_rows=5)) == with_core


# Token counts that wrap a 64-bit sum around to the token arrays' length: four counts of 2**62 add
# up to 0 (mod 2**64), so a kernel that only compares the sum walks 2**62 tokens past its arrays.
_WRAPPING = r"""
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("rollout_audit.frames._native", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
huge = [2**62] * 4
n_tok = np.array([*huge, 3], np.int64)
rows, total = n_tok.size, 3
z8, one = np.zeros(total, np.uint8), np.ones(total, np.uint8)
src = np.full(total, 2, np.uint8)
f64, i32 = np.zeros(total, np.float64), np.zeros(total, np.int32)
calls = {
    "token_stats": lambda: mod.token_stats(n_tok, src, z8, f64, one, np.ones(36, np.uint8), np.empty(rows, np.int64)),
    "turn_keys": lambda: mod.turn_keys(n_tok, np.zeros(rows, np.int64), np.zeros(rows, np.int64), i32, src, z8,
                                       np.empty(total, np.int32), np.empty(0, np.int64), np.empty(0, np.int64)),
    "placement": lambda: mod.placement(n_tok, src, i32, f64, one, np.empty(total, np.uint8), np.empty(rows, np.int64)),
    "routes64": lambda: mod.routes64(n_tok, i32, src, np.zeros(total, np.int64), one, np.ones(rows, np.uint8),
                                     np.zeros(1), np.zeros(rows), np.zeros(rows), *(np.empty(total, np.uint8) for _ in range(3))),
    "turn_sums": lambda: mod.turn_sums(np.array([total], np.int64), np.zeros(1, np.int64), np.full(1, 5, np.int64),
                                       i32, src, f64, one, np.array([*huge, 3], np.int64), np.empty(3, np.int64),
                                       *(np.empty(5, t) for t in (np.int64, np.int64, np.float64, np.int64))),
    "turn_tags": lambda: mod.turn_tags(n_tok, i32, i32, *(np.empty(rows, np.int64) for _ in range(4))),
}
for name, call in calls.items():
    try:
        call()
        print(name, "accepted")
    except ValueError as e:
        print(name, "refused:", e)
    sys.stdout.flush()
"""


def test_token_counts_that_wrap_the_sum_around_are_refused_not_read_past(compiled, tmp_path):
    """Every kernel that walks rows of token counts checks each count against what is left of the arrays
    before adding it (a sum compared only at the end wraps around and the kernel reads out of bounds:
    SIGSEGV). In a child process, so that a kernel reading out of bounds is an exit code."""
    script = tmp_path / "wrap.py"
    script.write_text(_WRAPPING)
    r = subprocess.run([sys.executable, str(script), compiled.__file__], capture_output=True, text=True, timeout=120)
    said = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert set(said) == {"token_stats", "turn_keys", "placement", "routes64", "turn_sums", "turn_tags"}, r.stdout
    assert all(v.startswith("refused:") for v in said.values()), said


# S004's token_turn tags and M105/M107's recorded digests (native.turn_tags, native.hex_differs)


@settings(max_examples=150, deadline=None)
@given(turn_rows, st.booleans(), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4))
def test_native_turn_tags_equal_numpy(compiled, rows, wide, extremes):
    """S004's per-row counts and first positions of late -1 tags and of tags naming no turn: the same
    on both paths and as defined token by token, with null fillers (-2), int32's ends, values past
    the row's turns and out of turn order, and int32 and int64 turn keys."""
    n_tok = np.array([len(t) for _, t in rows], np.int64)
    count = np.array([k for k, _ in rows], np.int64)
    start = np.zeros(n_tok.size, np.int64)
    np.cumsum(count[:-1], out=start[1:])
    turn = np.array([x for _, t in rows for x in t], np.int32)
    if turn.size:
        turn[: len(extremes)] = extremes[: turn.size]
    row = np.repeat(np.arange(n_tok.size), n_tok)
    inside = (turn >= 0) & (turn < count[row])
    key = np.where(inside, start[row] + turn, -1).astype(np.int64 if wide else np.int32)
    got, want = _both(compiled, native.turn_tags, n_tok, turn, key)
    assert all(g.dtype == w.dtype == np.int64 and np.array_equal(g, w) for g, w in zip(got, want))
    at = 0
    for r, n in enumerate(n_tok.tolist()):
        tags = turn[at : at + n].tolist()
        late = [p for p, t in enumerate(tags) if t == -1 and any(u >= 0 for u in tags[:p])]
        wrong = [p for p, t in enumerate(tags) if key[at + p] < 0 and t != -1]
        assert (want.late_n[r], want.late_first[r]) == (len(late), late[0] if late else -1)
        assert (want.wrong_n[r], want.wrong_first[r]) == (len(wrong), wrong[0] if wrong else -1)
        at += n
    if n_tok.size:
        with pytest.raises(ValueError, match="do not add up"):
            compiled.turn_tags(n_tok + 1, turn, key, *(np.empty(n_tok.size, np.int64) for _ in range(4)))


# a recorded digest: its digest's hex in some case, or one changed, cut, lengthened, non-hex or null
recorded = st.lists(
    st.tuples(
        st.binary(min_size=32, max_size=32),
        st.sampled_from(["lower", "upper", "mixed", "digit", "short", "long", "nonhex", "utf8", "null", "empty"]),
    ),
    max_size=30,
)


def _recorded(digest: bytes, how: str) -> str | None:
    h = digest.hex()
    return {
        "lower": h,
        "upper": h.upper(),
        "mixed": "".join(c.upper() if i % 3 else c for i, c in enumerate(h)),
        "digit": h[:-1] + ("0" if h[-1] != "0" else "1"),
        "short": h[:-1],
        "long": h + "0",
        "nonhex": "g" + h[1:],
        "utf8": "é" + h[2:],  # two bytes: 64 bytes that are no hex digest
        "null": None,
        "empty": "",
    }[how]


@settings(max_examples=150, deadline=None)
@given(recorded, st.booleans(), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_native_hex_digests_compare_as_numpy(compiled, entries, large, cut, seed):
    """M105/M107's recorded digests against ours: equal in any case, different when a digit changes,
    the length is not 64 bytes, a character is no hex digit (or not ASCII) or the value is null; on
    string and large_string arrays, sliced (an offset into the buffers), at a shuffled subset."""
    import pyarrow as pa

    from rollout_audit.reading.arrays import validity

    digests = np.frombuffer(b"".join(d for d, _ in entries), np.uint8).reshape(-1, 32)
    strings = [_recorded(d, how) for d, how in entries]
    arr = pa.array(["x" * 64] * cut + strings, pa.large_string() if large else pa.string()).slice(cut)
    width = np.int64 if large else np.int32
    buf = arr.buffers()
    offsets = np.frombuffer(buf[1], width, len(arr) + 1, arr.offset * np.dtype(width).itemsize)
    data = np.frombuffer(buf[2], np.uint8) if buf[2] is not None else np.zeros(0, np.uint8)
    valid = validity(arr) if arr.null_count else None
    at = np.random.default_rng(seed).permutation(len(arr)).astype(np.int64)
    got, want = _both(compiled, native.hex_differs, offsets, data, valid, at, digests[at])
    expected = [
        strings[i] is None or strings[i].encode().lower() != digests[i].tobytes().hex().encode() for i in at.tolist()
    ]
    assert got.dtype == want.dtype == np.bool_ and got.tolist() == want.tolist() == expected
    if len(arr):
        with pytest.raises(ValueError, match="names no string"):
            compiled.hex_differs(
                offsets, data, np.zeros(0, np.uint8), np.array([len(arr)]), digests[:1], np.empty(1, np.uint8)
            )
