"""Hostile input, round 6: a dump's token ids outside int32 (the contract's token type, the one a context
hash is computed over) and a verifiers trace whose `calls` is not a list are one line naming file,
record and field, exit 2 (they were "a field has the wrong shape" naming no field); the native core
refuses token counts that would wrap its sums instead of reading past its arrays. Through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostilehelp import cli

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ROOT / "fixtures" / "frameworks"
IDENTITY = ["--context", "environment_id=doors", "--context", "environment_version=v1"]
IDENTITY += ["--context", "verifier_version=v1", "--context", "reset_seed=0"]


def _dump(tmp: Path, fw: str, case: str, edit) -> Path:
    recs = [json.loads(x) for x in (FRAMEWORKS / fw / f"{case}.jsonl").read_text().splitlines() if x.strip()]
    edit(recs[0])
    f = tmp / "dump.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f


def _refusal(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, (r.returncode, r.stderr)
    assert "wrong shape" not in lines[0] and "internal error" not in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**63 - 1])
@pytest.mark.parametrize("field", ["template_ids", "prompt_ids", "token_ids"])
def test_a_verl_engine_call_id_outside_int32_names_file_record_and_field(tmp_path, field, value):
    def edit(rec):
        rec["engine_calls"][0][field][0] = value

    f = _dump(tmp_path, "verl", "compliant", edit)
    line = _refusal(cli("check", "--from", "verl", str(f), *IDENTITY))
    assert f"{f}:1:" in line and f"engine_calls[0]: {field}[0]: token id {value} is outside int32" in line, line


def test_a_skyrl_engine_call_id_outside_int32_names_file_record_and_field(tmp_path):
    def edit(rec):
        rec["engine_calls"][0]["prompt_token_ids"][2] = 2**40

    f = _dump(tmp_path, "skyrl", "compliant", edit)
    line = _refusal(cli("check", "--from", "skyrl", str(f), *IDENTITY))
    assert f"{f}:1:" in line and "engine_calls[0]: prompt_token_ids[2]: token id 1099511627776" in line, line


def test_an_engine_context_id_outside_int32_names_the_field(tmp_path):
    """The exchange readers hash the engine's prompt through one helper (`steps.engine_context`)."""

    def edit(rec):
        rec["trajectory"][0]["response"]["prompt_token_ids"][0] = -(2**40)

    f = _dump(tmp_path, "verifiers", "compliant", edit)
    line = _refusal(cli("check", "--from", "verifiers", str(f), *IDENTITY))
    assert f"{f}:1:" in line and "prompt_token_ids[0]: token id -1099511627776 is outside int32" in line, line


@pytest.mark.parametrize("calls", [7, "calls", {"node": 2}, [1, 2]])
def test_a_verifiers_trace_whose_calls_are_not_objects_names_the_field(tmp_path, calls):
    def edit(rec):
        rec["calls"] = calls

    f = _dump(tmp_path, "verifiers", "v1_compliant", edit)
    line = _refusal(cli("check", "--from", "verifiers", str(f), *IDENTITY))
    assert f"{f}:1:" in line and "trace trace-0: calls" in line, line


def test_a_verifiers_trace_without_calls_still_converts(tmp_path):
    def edit(rec):
        rec.pop("calls", None)

    f = _dump(tmp_path, "verifiers", "v1_compliant", edit)
    r = cli("check", "--from", "verifiers", str(f), *IDENTITY, "--format", "json")
    assert r.returncode in (0, 1) and json.loads(r.stdout)["summary"]["rows_read"] > 0, r.stderr


_CAPPED = r"""
import resource, sys
import msgpack, polars, pyarrow.parquet  # noqa: F401 - what the audit maps, before the cap
from rollout_audit.cli import main

def mapped():
    with open("/proc/self/status") as fh:
        return next(int(x.split()[1]) * 1024 for x in fh if x.startswith("VmSize:"))

cap = mapped() + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
main(sys.argv[1:], prog_name="rollout-audit")
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads its address space from /proc")
def test_a_prime_rl_batch_is_read_within_its_size_under_an_address_space_limit(tmp_path):
    """A 1 GB address-space limit (`ulimit -v`, the fuzz campaign's workers) above what the audit
    maps: a batch file of a few kB audits clean. It was read with read(MAX_DUMP_BYTES + 1), which
    allocates 4 GiB before reading a byte: "internal error: MemoryError" under any such limit."""
    pytest.importorskip("msgpack")
    script = tmp_path / "capped.py"
    script.write_text(_CAPPED)
    args = ["check", "--from", "prime_rl", str(FRAMEWORKS / "prime_rl" / "compliant"), *IDENTITY]
    args += ["--context", "algo=grpo", "--context", "policy_version=3"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ROLLOUT_AUDIT_NO_PROGRESS": "1"}
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


def test_the_recorder_says_a_malformed_request_in_one_escaped_line_not_a_traceback(tmp_path):
    """`rollout-audit capture` in its own process sent what no HTTP client sends (a header over aiohttp's
    8190 bytes, a chunk size that is not hex, an escape sequence in the request line): each is answered
    400 and said on stderr in one escaped line; aiohttp printed its traceback for each, and the client's
    bytes with it."""
    pytest.importorskip("aiohttp")
    import signal
    import socket
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "rollout_audit.cli", "capture", "--upstream", "http://127.0.0.1:9"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "cap"), "--port", "0"], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        ready = proc.stderr.readline()
        port = int(ready.split("http://127.0.0.1:")[1].split(" ")[0])
        sent = [
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"h" * 9000 + b"\r\n\r\n",
            b"POST /sessions/s1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"GET /\x1b[2J HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
        for raw in sent:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(raw)
                assert s.recv(64).startswith(b"HTTP/1.0 400"), raw[:40]
        time.sleep(0.2)  # the log lines are written after the answers
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=30)[1]
    lines = err.strip().splitlines()
    said = [x for x in lines if "malformed request" in x]
    assert "Traceback" not in err and "\x1b" not in err, err[-3000:]
    assert len(said) == 3 and all(x.startswith("rollout-audit capture: warning: ") for x in said), lines


def test_a_gateway_store_with_a_wal_file_beside_it_is_refused_not_written_beside(tmp_path):
    """A rollback-journal store (the gateway's journal_mode=DELETE) with a `-wal` file beside it, stale
    or planted: SQLite opened it even read-only and created a `-shm` file in the audited folder."""
    import sqlite3

    db = tmp_path / "gateway_traces.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE traces (trace_id TEXT PRIMARY KEY, data TEXT NOT NULL, created_at REAL NOT NULL)")
    con.execute("INSERT INTO traces VALUES ('t1', '{}', 0.0)")
    con.commit()
    con.close()
    (tmp_path / "gateway_traces.db-wal").write_bytes(bytes(range(256)) * 16)
    line = _refusal(cli("check", "--from", "rllm_gateway", str(tmp_path), *IDENTITY))
    assert f"{db}: a store with a gateway_traces.db-wal beside it" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gateway_traces.db", "gateway_traces.db-wal"]


@pytest.mark.parametrize("where", ["sessions/s1/end", "capture/weight_version"])
def test_the_recorder_refuses_a_body_nested_too_deeply_in_one_line(tmp_path, where):
    """A `/end` or `/capture/weight_version` body of JSON nested 50,000 deep: 400 naming why, in the
    recorder's answer; json's RecursionError escaped its handler (aiohttp answered 500 and logged it)."""
    pytest.importorskip("aiohttp")
    from capturehelp import Running

    rec = Running("http://127.0.0.1:9", tmp_path / "cap")
    try:
        import httpx

        r = httpx.post(f"{rec.url}/{where}", content=b"[" * 50_000 + b"]" * 50_000, timeout=30)
    finally:
        rec.close()
    assert r.status_code == 400 and "nested too deeply" in r.text, (r.status_code, r.text[:300])


@pytest.mark.parametrize("parent", [["call-a"], {"id": 1}, 3])
def test_a_nemo_gym_receipt_whose_parent_call_id_is_not_an_id_names_the_field(tmp_path, parent):
    """A receipt manifest entry whose parent_call_id is a list: "malformed record (TypeError:
    unhashable type: 'list')", naming no record nor field (round-6 campaign seed 6625)."""
    lines = [json.loads(x) for x in (FRAMEWORKS / "nemo_gym" / "compliant.jsonl").read_text().splitlines() if x]
    rec = next(x for x in lines if isinstance(x.get("manifest"), list) and len(x["manifest"]) > 1)
    rec["manifest"][1]["parent_call_id"] = parent
    f = tmp_path / "dump.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    line = _refusal(cli("check", "--from", "nemo_gym", str(f), *IDENTITY))
    assert f"{f}:" in line and "parent_call_id: expected a call id" in line, line
