"""The native core (rollout_audit/frames/_native.c) against its pure-Python path: the same
prefix digests and per-row token counts on hypothesis-generated batches, and the same audit on
every named fault.

The extension is compiled here with the build hook's own command when the tree was not
installed with it, so these tests always run the C code."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import faultgroups
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_audit.frames import native
from rollout_audit.reading.io import discover
from rollout_audit.running.engine import run_audit
from rollout_audit.synth import make_log

ROOT = Path(__file__).resolve().parent.parent


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("rollout_audit.frames._native", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The extension as installed, or compiled now by hatch_build.compile_native."""
    if native.ACTIVE is not None:
        return native.ACTIVE
    spec = importlib.util.spec_from_file_location("hatch_build", ROOT / "hatch_build.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return _load(hook.compile_native(ROOT, tmp_path_factory.mktemp("native")))


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
def test_native_token_counts_equal_numpy(compiled, n_tok, seed, single):
    """Per-row category counts on random sources (out-of-range folded to 5), masks, log-probs with
    NaN, infinities, signed zeros and values above 0, some absent; float32 and float64."""
    rng = np.random.default_rng(seed)
    n_tok = np.array(n_tok, np.int64)
    total = int(n_tok.sum())
    source = rng.integers(0, 6, total).astype(np.uint8)
    mask = rng.random(total) < 0.5
    lp = rng.choice(SPECIAL, total).astype(np.float32 if single else np.float64)
    present = rng.random(total) < 0.8
    got = np.empty((n_tok.size, native.N_SOURCE, 2, native.N_LP), np.int64)
    compiled.token_counts(n_tok, source, mask, lp, present, got)
    want = native.token_counts_numpy(n_tok, source, mask, native.lp_states(lp, present))
    assert np.array_equal(got, want)


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
