"""The round-6 campaign's cases (`prepare_round6`): this round's new surfaces, in turn by seed.

- `capture_http`: the recorder (`rollout_audit.capture.proxy.Recorder`, served in this process in front
  of a loopback upstream written here) sent hostile HTTP by raw sockets: session ids and headers of
  every shape, bodies cut, chunked or gzip-encoded (broken or not), `/end` and `/capture/weight_version`
  bodies of every type, an upstream answering garbage, a cut stream or an HTTP error. Judged here:
  every request answered (no hang), nothing escaped the recorder's handlers, every body the upstream
  received equal to the one sent (a recorder never changes what it forwards); then its records are
  audited (`check --from openai OUT`) and judged like any case.
- `capture_records`: a real recording (made once per process by the same recorder) with its lines
  mutated (`fuzzlib.mutated_lines`) or its recorded bodies replaced by hostile ones.
- `rllm_gateway_sqlite`: the gateway's SQLite store built from mutated traces (a table of another
  shape, a WAL file beside it, the file truncated or its bytes flipped); `rllm_gateway_json`,
  `agent_lightning`, `nemo_gym`, `art`, `verl_v1` (the record `integrations/verl_v1.py` dumps): their
  fixtures mutated; `prime_rl`: a batch directory with its traces mutated and its msgpack batch damaged.
- `trust`: a file or folder under audit that says something that would weaken the audit: a broken
  fixture whose finding's column is dropped and waived in the file's own metadata, a configuration
  inside the log or the dump folder setting a key only the user may set, a value past its bound, a
  truncation penalty above the rewards, a recorder's `rollout_audit_unrecorded` naming a field the
  adapter records. Each must end in a finding or a refusal naming the file (exit 1 or 2), never exit 0.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import random
import shutil
import socket
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fuzzlib import DUMP_CONTEXT, HOSTILE, LEAVES, FollowUp, WorkflowCase, mutated_lines

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "frameworks"
BROKEN = ROOT / "fixtures" / "broken"

ROUND6 = (
    "capture_http",
    "capture_records",
    "rllm_gateway_sqlite",
    "rllm_gateway_json",
    "agent_lightning",
    "nemo_gym",
    "prime_rl",
    "art",
    "verl_v1",
    "trust",
)
_CTX = [x for kv in DUMP_CONTEXT for x in ("--context", kv)]
# the readers' fixtures and the context their pages document
READERS = {
    "rllm_gateway_json": ("rllm_gateway", ["compliant", "compliant_streamed", "control_token_replaced"], []),
    "agent_lightning": (
        "agent_lightning",
        ["compliant", "compliant_retried", "control_token_replaced", "stale_server_version", "temperature_override"],
        ["--context", "rollout_temperature=1.0", "--context", "top_p=1.0"],
    ),
    "nemo_gym": ("nemo_gym", ["compliant", "parent_prefix_mismatch", "weight_version_regressed"], []),
    "art": ("art", ["compliant", "render_drops_separator", "sampled_without_logprob", "versions_span_update"], []),
    "verl_v1": ("verl", ["compliant_v1", "trainer_v1_advantages_mispaired"], []),
}
_PRIME = ["--context", "algo=grpo", "--context", "policy_version=3"]
_TIMEOUT = 20.0  # seconds a raw HTTP request may wait for its answer before the case is a hang


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _fmt(rng: random.Random) -> tuple[str, str]:
    f = rng.choice(["json", "json", "github", "junit"])
    return f, f if f == "json" else "text"


# ---------------------------------------------------------------- the capture layer's readers


def _reader(what: str, seed: int, work: Path, rng: random.Random) -> WorkflowCase:
    fw, cases, extra = READERS[what]
    base = FIXTURES / fw / f"{rng.choice(cases)}.jsonl"
    dump = work / "dump.jsonl"
    dump.write_bytes(mutated_lines(rng, _lines(base)))
    fmt, judged = _fmt(rng)
    args = ["check", "--from", fw, str(dump), *_CTX, *extra, "--format", fmt]
    return WorkflowCase("round6", seed, args, [dump], f"{what}:{base.stem}", judged)


def _gateway_store(seed: int, work: Path, rng: random.Random, more: bool = False) -> WorkflowCase:
    """The gateway's store: table `traces(trace_id, data, created_at)` (store/sqlite_store.py) of
    mutated traces, its end lines in a JSON Lines file beside it; sometimes damaged. `more`: also a
    table whose `data` SQLite computes on read (a generated column of a gigabyte, a call of
    load_extension), a virtual table, a hot journal left beside the store."""
    base = FIXTURES / "rllm_gateway" / f"{rng.choice(['compliant', 'compliant_streamed', 'logprobs_false_kept'])}.jsonl"
    data = mutated_lines(rng, _lines(base))
    store = work / "store"
    store.mkdir()
    db = store / "gateway_traces.db"
    con = sqlite3.connect(db)
    shape = rng.choice(
        ["gateway", "gateway", "gateway", "no_table", "view", "typed", "wal"]
        + (["generated_bomb", "generated_ext", "virtual"] if more else [])
    )
    if shape == "generated_bomb":  # a few kB on disk, a gigabyte per row when read
        n = rng.choice([300_000_000, 900_000_000, 2_000_000_000])
        what = rng.choice([f"zeroblob({n})", f"'\"' || replace(hex(zeroblob({n // 2})), '0', 'a') || '\"'"])
        con.execute("CREATE TABLE traces (trace_id TEXT, created_at REAL, data GENERATED ALWAYS AS (abs(1)))")
        con.executemany("INSERT INTO traces (trace_id, created_at) VALUES (?, ?)", [(f"t{k}", k) for k in range(3)])
        con.execute("PRAGMA writable_schema = ON")  # the value computed only when read, not here
        con.execute("UPDATE sqlite_master SET sql = replace(sql, 'abs(1)', ?) WHERE name = 'traces'", (what,))
    elif shape == "generated_ext":  # SQLite refuses such a column: the schema is rewritten in place
        con.execute("CREATE TABLE traces (trace_id TEXT, created_at REAL, data GENERATED ALWAYS AS (abs(1)))")
        con.execute("INSERT INTO traces (trace_id, created_at) VALUES ('t', 0)")
        con.execute("PRAGMA writable_schema = ON")
        con.execute(
            "UPDATE sqlite_master SET sql = replace(sql, 'abs(1)', ?) WHERE name = 'traces'",
            (rng.choice(["load_extension('/nonexistent/evil')", "load_extension('./x.so', 'init')", "random()"]),),
        )
    elif shape == "virtual":
        con.execute("CREATE VIRTUAL TABLE traces USING fts5(trace_id, data, created_at)")
        con.execute("INSERT INTO traces VALUES ('t', '{}', 0)")
    elif shape == "no_table":
        con.execute("CREATE TABLE other (x)")
    elif shape == "view":
        con.execute("CREATE TABLE t (a)")
        con.execute("CREATE VIEW traces AS SELECT a AS trace_id, a AS data, a AS created_at FROM t")
    else:
        if shape == "wal":
            con.execute("PRAGMA journal_mode=WAL")
        kind = "BLOB" if shape == "typed" else "TEXT"
        con.execute(f"CREATE TABLE traces (trace_id TEXT PRIMARY KEY, data {kind} NOT NULL, created_at REAL NOT NULL)")
        ends = []
        for k, line in enumerate(data.splitlines()):
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                rec = None
            if isinstance(rec, dict) and "end" in rec:
                ends.append(line)
                continue
            tid = rec.get("trace_id") if isinstance(rec, dict) else None
            value: object = line if shape != "typed" or rng.random() < 0.5 else line
            if shape == "typed" and rng.random() < 0.3:
                value = rng.choice([b"\xff\xfe\x00", 12, 3.5])
            con.execute(
                "INSERT OR REPLACE INTO traces VALUES (?, ?, ?)",
                (str(tid if isinstance(tid, (str, int)) else f"t{k}"), value, float(k)),
            )
        (store / "outcomes.jsonl").write_bytes(b"".join(e + b"\n" for e in ends))
    con.commit()
    con.close()
    damage = rng.choice(
        ["none", "none", "none", "truncate", "flip", "wal_beside", "not_sqlite"] + (["journal_beside"] if more else [])
    )
    raw = db.read_bytes()
    if damage == "truncate":
        db.write_bytes(raw[: rng.randrange(1, len(raw))])
    elif damage == "flip":
        b = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        db.write_bytes(bytes(b))
    elif damage == "wal_beside":
        (store / "gateway_traces.db-wal").write_bytes(
            bytes(rng.randrange(256) for _ in range(rng.choice([0, 32, 4096])))
        )
    elif damage == "journal_beside":  # a rollback journal a writer left: SQLite would roll it back into the store
        (store / "gateway_traces.db-journal").write_bytes(
            bytes.fromhex("d9d505f920a163d7") + bytes(rng.randrange(256) for _ in range(rng.choice([0, 504, 4096])))
        )
    elif damage == "not_sqlite":
        db.write_bytes(b"\x00\x01 not a database" * rng.randint(1, 100))
    target = rng.choice([store, db])
    fmt, judged = _fmt(rng)
    args = ["check", "--from", "rllm_gateway", str(target), *_CTX, "--format", fmt]
    return WorkflowCase("round6", seed, args, [store], f"rllm_gateway_sqlite:{shape}:{damage}", judged)


def _prime_rl(seed: int, work: Path, rng: random.Random, more: bool = False) -> WorkflowCase:
    """A prime-rl run directory, its traces mutated or its msgpack batch damaged; `more`: also batches
    that claim a map, a string or a binary of 4 GiB, a map nested 100,000 deep, an extension type, and
    a bomb of empty arrays (one byte each on disk, a Python list each when decoded)."""
    base = FIXTURES / "prime_rl" / rng.choice(["compliant", "baseline_dropped", "logprobs_shifted", "padding_trained"])
    run = work / "outputs"
    shutil.copytree(base, run)
    what = rng.choice(["traces", "traces", "batch", "both"])
    how = ""
    if what in ("traces", "both"):
        traces = run / "traces.jsonl"
        traces.write_bytes(mutated_lines(rng, _lines(traces)))
    if what in ("batch", "both"):
        batch = next(run.rglob("rank_*.bin"))
        raw = bytearray(batch.read_bytes())
        how = rng.choice(
            ["truncate", "flip", "append", "empty", "deep", "huge_len"]
            + (["huge_map", "huge_str", "huge_bin", "deep_map", "ext", "bomb"] if more else [])
        )
        if how == "truncate":
            raw = raw[: rng.randrange(len(raw))]
        elif how == "flip":
            for _ in range(rng.randint(1, 6)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        elif how == "append":
            raw += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        elif how == "empty":
            raw = bytearray()
        elif how == "deep":
            raw = bytearray(b"\x91" * 100_000 + b"\xc0")  # a list nested 100,000 deep
        elif how == "huge_len":
            raw = bytearray(b"\xdd\xff\xff\xff\xff")  # an array that claims 2^32 - 1 items
        elif how == "huge_map":
            raw = bytearray(b"\xdf\xff\xff\xff\xff")
        elif how == "huge_str":
            raw = bytearray(b"\x91\xdb\xff\xff\xff\xff" + b"a" * 64)
        elif how == "huge_bin":
            raw = bytearray(b"\x91\xc6\xff\xff\xff\xff" + b"a" * 64)
        elif how == "deep_map":
            raw = bytearray(b"\x81\xa1k" * 100_000 + b"\xc0")
        elif how == "ext":
            raw = bytearray(b"\x91\xd4\x05\x00" if rng.random() < 0.5 else b"\x91\xc7\x08\xff" + b"\x00" * 8)
        else:  # 8 MB of empty arrays in one array of arrays
            n = rng.choice([1 << 20, 8 << 20])
            raw = bytearray(b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n)
        batch.write_bytes(bytes(raw))
    fmt, judged = _fmt(rng)
    args = ["check", "--from", "prime_rl", str(run), *_CTX, *_PRIME, "--format", fmt]
    return WorkflowCase("round6", seed, args, [run], f"prime_rl:{base.name}:{what}{':' + how if how else ''}", judged)


# ---------------------------------------------------------------- the recorder's HTTP input


class _Upstream:
    """A loopback HTTP/1.1 server that keeps every request body it receives (Content-Length or
    chunked) by the `X-Case-Request` header, and answers as `answer` says."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.received: dict[str, bytes] = {}
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if not size:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_GET(self) -> None:
                self._reply(b'{"data": []}', "application/json")

            def do_POST(self) -> None:
                try:
                    body = self._body()
                except (ValueError, OSError):
                    return
                up.received[self.headers.get("X-Case-Request", "")] = body
                self._reply(*_answer(up.answer, body))

            def _reply(self, data: bytes, ctype: str, status: int = 200) -> None:
                try:
                    if up.answer == "cut":
                        self.send_response(200)
                        self.send_header("Content-Type", "text/event-stream")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data[:40]), data[:40]))
                        self.close_connection = True
                        return
                    self.send_response(500 if up.answer == "error" else status)
                    self.send_header("Content-Type", ctype)
                    if up.answer == "gzip":
                        self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _completion(ids: list[int]) -> dict:
    lp = [{"token": f"token_id:{i}", "logprob": -0.5, "bytes": None, "top_logprobs": []} for i in ids]
    choice = {"index": 0, "message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop"}
    choice |= {"logprobs": {"content": lp}, "token_ids": ids}
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "prompt_token_ids": [1, 2, 3]} | {
        "choices": [choice]
    }


def _answer(answer: str, body: bytes) -> tuple[bytes, str]:
    """What the upstream sends back for `body` in mode `answer`."""
    rng = random.Random(body)
    if answer == "garbage":
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))), rng.choice(
            ["application/json", "text/event-stream", "text/plain"]
        )
    if answer == "join":
        return json.dumps(_joined(b"tool" in body)).encode(), "application/json"
    doc = _completion([rng.choice([5, 6, 7, -1, 2**31 - 1]) for _ in range(rng.randint(0, 4))])
    if answer == "mutated":
        return mutated_lines(rng, [doc]).strip(), "application/json"
    data = json.dumps(doc).encode()
    if answer == "gzip":
        return (gzip.compress(data) if rng.random() < 0.7 else data[:20]), "application/json"
    if answer in ("stream", "cut"):
        events = [b"data: " + json.dumps(doc).encode() + b"\n\n", b"data: [DONE]\n\n"]
        return b"".join(events), "text/event-stream"
    return data, "application/json"


_SIDS = ["s1", "s-2", "a" * 200, "../etc", "%2e%2e", "s 1", "s\x1b[2J", "é", "", "s1/../../x", "::error::x"]


def _request(rng: random.Random, k: int) -> tuple[bytes, bytes | None]:
    """One raw HTTP request (bytes on the wire) and the body the upstream must receive unchanged
    (None when the request is malformed by design, or is not forwarded)."""
    sid = rng.choice(_SIDS)
    kind = rng.choice(["chat", "chat", "chat", "end", "weight", "garbage", "chunked", "short", "header"])
    body_doc: object = {
        "model": "m",
        "messages": [{"role": "user", "content": rng.choice(HOSTILE)}],
        "stream": rng.random() < 0.4,
        "logprobs": True,
        "extra_body": {"return_token_ids": True},
    }
    if rng.random() < 0.3:
        body_doc = rng.choice(LEAVES)
    if kind == "end":
        body_doc = {
            "stop_reason": rng.choice(["success", 7, None, "\x1b[2J", ["x"]]),
            "reward": rng.choice([1.0, "nan", float("inf"), 2**70, None, {"a": 1}]),
            "policy_version": rng.choice([3, -1, 2**63, "3", 2.5]),
        }
    elif kind == "weight":
        body_doc = {"version": rng.choice([1, -1, "x", None, 2**64, [1], "\x00"])}
    try:
        body = json.dumps(body_doc, allow_nan=True).encode()
    except (TypeError, ValueError):
        body = b"{}"
    if rng.random() < 0.15:
        body = rng.choice([b"{not json", b"", b"\xff\xfe", b"[" * 50_000 + b"]" * 50_000, b"x" * 70_000])
    path = {
        "chat": f"/sessions/{sid}/v1/chat/completions",
        "chunked": f"/sessions/{sid}/v1/chat/completions",
        "short": f"/sessions/{sid}/v1/chat/completions",
        "header": "/v1/chat/completions",
        "end": rng.choice([f"/sessions/{sid}/end", "/end"]),
        "weight": "/capture/weight_version",
        "garbage": "/",
    }[kind]
    path = path.replace(" ", "%20").encode("utf-8", "surrogateescape").decode("latin-1")
    headers = [f"X-Case-Request: {k}", "Connection: close", "Content-Type: application/json"]
    if kind == "header" or rng.random() < 0.2:
        headers.append(f"X-Rollout-Session: {rng.choice(_SIDS)}")
    if rng.random() < 0.3:
        headers.append(f"X-Weight-Version: {rng.choice(['3', '-1', '1e309', '9' * 40, 'x', ''])}")
    if rng.random() < 0.15:
        headers.append("Content-Encoding: gzip")
        if rng.random() < 0.6:
            body = gzip.compress(body)
    if rng.random() < 0.05:
        headers.append("X-Long: " + "h" * rng.choice([100, 9000, 70_000]))
    exact: bytes | None = body if kind in ("chat", "chunked") else None
    if kind == "garbage":
        return rng.choice(
            [b"GARBAGE\r\n\r\n", b"POST / HTTP/9.9\r\n\r\n", b"\x00\x01\x02", b"GET /" + b"a" * 20000]
        ), None
    if kind == "chunked":
        pieces = [body[i : i + 97] for i in range(0, len(body), 97)]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        if rng.random() < 0.3:  # a chunk size that is not hex, or lies
            payload, exact = rng.choice([b"zz\r\nab\r\n0\r\n\r\n", b"ffffffff\r\nab"]), None
        head = [f"POST {path} HTTP/1.1", "Host: x", "Transfer-Encoding: chunked", *headers]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1", "replace") + payload, exact
    length = len(body) + (rng.randint(1, 50) if kind == "short" else 0)  # short: a body cut before its length
    if kind == "short":
        exact = None
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {length}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1", "replace") + body, exact


def _send(url: str, raw: bytes, half_close: bool) -> bytes | None:
    """`raw` sent to the recorder; its answer (until it closes), None when none came in time."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=_TIMEOUT) as s:
        try:
            s.sendall(raw)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            return b""  # the recorder closed first (a request it refused before reading it whole)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            return None
        except OSError:
            return out
        return out


def _capture_http(seed: int, work: Path, rng: random.Random) -> WorkflowCase:
    from aiohttp.http_exceptions import HttpProcessingError

    from rollout_audit.capture.proxy import SERVER_LOG

    class Collect(logging.Handler):  # the recorder's server log: a request it failed on, not a malformed one
        def emit(self, record: logging.LogRecord) -> None:
            exc = record.exc_info[1] if record.exc_info else None
            if not isinstance(exc, (HttpProcessingError, ConnectionError)):  # malformed, or the client gone
                errors.append(f"{record.getMessage()}: {exc!r}"[:200])

    answer = rng.choice(["json", "json", "stream", "gzip", "garbage", "mutated", "cut", "error"])
    cap = work / "cap"
    errors: list[str] = []
    collect = Collect()
    SERVER_LOG.addHandler(collect)
    found: list[str] = []
    sent: dict[str, bytes] = {}
    try:
        with _recorder(answer, cap, max_body=rng.choice([64, 4096, 1 << 20]), read_timeout=5.0) as (url, up, loop):
            loop.set_exception_handler(
                lambda _, ctx: errors.append(str(ctx.get("exception") or ctx.get("message"))[:200])
            )
            for k in range(rng.randint(1, 4)):
                raw, exact = _request(rng, k)
                got = _send(url, raw, half_close=exact is None)
                if got is None:
                    found.append("recorder hang")
                elif got and not got.startswith(b"HTTP/1."):
                    found.append("recorder answered without a status line")
                elif b" 500 " in got.split(b"\r\n", 1)[0] and answer != "error":
                    found.append("recorder answered 500 (an error of its own)")
                if exact is not None and got and b" 200 " in got.split(b"\r\n", 1)[0]:
                    sent[str(k)] = exact
    finally:
        SERVER_LOG.removeHandler(collect)
    for k, body in sent.items():
        if k in up.received and up.received[k] != body:
            found.append("recorder changed a body it forwarded")
    if errors:
        found.append(f"recorder handler error: {errors[0]}")
    cap.mkdir(exist_ok=True)
    fmt, judged = _fmt(rng)
    args = ["check", "--from", "openai", str(cap), *_CTX, "--format", fmt]
    return WorkflowCase("round6", seed, args, [cap], f"capture_http:{answer}", judged, found=found)


_RECORDING: list[bytes] = []


@contextlib.contextmanager
def _recorder(answer: str, out: Path, **options: Any) -> Iterator[tuple[str, _Upstream, Any]]:
    """The recorder (recording into `out`, with `options`) served in this process on an event loop in a
    thread of its own, in front of an upstream answering in mode `answer`: its URL, the upstream and the
    loop; everything stopped on exit."""
    import asyncio

    from aiohttp import web

    from rollout_audit.capture.proxy import Recorder

    up = _Upstream(answer)
    rec = Recorder(up.url, out, **options)
    loop = asyncio.new_event_loop()
    runner = rec.runner()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", up, loop
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(_TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_TIMEOUT)
        loop.close()
        up.close()


def _post(url: str, path: str, body: str) -> None:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    _send(url, (head + f"Content-Length: {len(body)}\r\n\r\n{body}").encode(), False)


def recording() -> list[bytes]:
    """The lines of one real recording (made once per process): two sessions through the recorder in
    front of the upstream here, one streamed and one whole, each ended with its outcome."""
    if _RECORDING:
        return _RECORDING
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rng = random.Random("recording")
        work = Path(tmp)
        for sid, answer in (("episode-0", "json"), ("episode-1", "stream")):
            with _recorder(answer, work / "cap") as (url, _, _):
                body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True})
                _post(url, f"/sessions/{sid}/v1/chat/completions", body)
                end = json.dumps({"stop_reason": "success", "reward": rng.choice([0.0, 1.0]), "policy_version": 3})
                _post(url, f"/sessions/{sid}/end", end)
        for f in sorted((work / "cap").glob("*.jsonl")):
            _RECORDING.append(f.read_bytes())
    return _RECORDING


def _capture_records(seed: int, work: Path, rng: random.Random) -> WorkflowCase:
    cap = work / "cap"
    cap.mkdir()
    files = recording()
    for n, data in enumerate(files):
        lines = [json.loads(x) for x in data.splitlines() if x.strip()]
        if rng.random() < 0.7:
            out = mutated_lines(rng, lines)
        else:  # a recorded body replaced by a hostile one (garbage, an SSE stream cut, a bomb's head)
            for x in lines:
                if x.get("response_body") and rng.random() < 0.7:
                    text = rng.choice(
                        [
                            'data: {"choices": [\n\n',
                            "data: [DONE]\n\n" * 3,
                            "\x1b[2J::error::x",
                            json.dumps(_completion([2**31, -5])),
                            "{" * 5000,
                        ]
                    )
                    x["response_body"] = {"text": text} if rng.random() < 0.8 else rng.choice(LEAVES)
            out = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        (cap / f"episode-{n}.jsonl").write_bytes(out)
    fmt, judged = _fmt(rng)
    args = ["check", "--from", "openai", str(cap), *_CTX, "--format", fmt]
    return WorkflowCase("round6", seed, args, [cap], "capture_records", judged)


# ---------------------------------------------------------------- the trust rule

# broken fixtures and a column their finding reads: dropped and waived in the file's own metadata
_WAIVE = [
    ("positive_logprob", "behavior_logprobs"),
    ("stop_reason_contradicts_flag", "stop_reason"),
    ("loss_over_whole_transcript", "token_source"),
    ("excluded_trajectory_trained", "reward"),
    ("two_stop_flags", "truncated"),
    ("policy_version_decreasing", "turns.policy_version"),
]
# keys only the user may set (they decide which checks run, how much is tolerated, what is read, or run code)
_USER_KEYS = [
    ("not_recorded", '["behavior_logprobs", "stop_reason", "token_source"]'),
    ("denominator_not_recorded", "true"),
    ("preview", "false"),
    ("select", '["S001"]'),
    ("ignore", '["L201", "T301", "M101", "R401"]'),
    ("tolerated_share", "1.0"),
    ("atol", "1e9"),
    ("logprob_atol", "1e9"),
    ("max_tokens_per_trajectory", "1"),
    ("replayer", '"os:system"'),
    ("replay", "true"),
    ("vocabulary_size", "1"),
]
_BOUNDED = [("grpo_epsilon", "1.0"), ("max_policy_lag", "100000"), ("max_response_tokens", "1e12")]
_DUMP_FAULTS = [
    ("verl", "trainer_v1_advantages_mispaired"),
    ("agent_lightning", "control_token_replaced"),
    ("art", "sampled_without_logprob"),
    ("rllm_gateway", "control_token_replaced"),
]


def _config(root: Path, rng: random.Random, body: str) -> Path:
    """A configuration inside `root` (its pyproject.toml, or one in a sub-folder of it)."""
    where = root if rng.random() < 0.7 else root / rng.choice(["trajectories", "sub"])
    where.mkdir(exist_ok=True)
    p = where / "pyproject.toml"
    p.write_text("[tool.rollout-audit]\n" + body + "\n")
    return p


def _trust(seed: int, work: Path, rng: random.Random) -> WorkflowCase:
    how = rng.choice(["waive_meta", "user_key", "bounded", "penalty_log", "penalty_dump", "unrecorded"])
    fmt, judged = _fmt(rng)
    never_ok = [FollowUp([], (0,), (1, 2), f"trust: {how} weakened the audit (exit 0 on a broken input)")]
    if how in ("penalty_dump", "unrecorded"):
        fw, case = rng.choice(_DUMP_FAULTS)
        folder = work / "dump"
        folder.mkdir()
        dump = folder / "dump.jsonl"
        lines = _lines(FIXTURES / fw / f"{case}.jsonl")
        if how == "unrecorded":
            field = rng.choice(["behavior_logprobs", "token_ids", "loss_mask", "reward", "turns.context_sha256"])
            for x in lines:
                x["rollout_audit_unrecorded"] = {field: "not recorded here"}
        else:
            _config(folder, rng, f"truncation_penalty = {rng.choice(['1e9', '1e300', '2.0', '1.5'])}")
        dump.write_text("".join(json.dumps(x) + "\n" for x in lines))
        extra = READERS["agent_lightning"][2] if fw == "agent_lightning" else []
        args = ["check", "--from", fw, str(dump), *_CTX, *extra, "--format", fmt]
        never_ok[0].args = args
        return WorkflowCase("round6", seed, args, [folder], f"trust:{how}:{fw}", judged, never_ok)
    name, col = rng.choice(_WAIVE)
    log = work / name
    shutil.copytree(BROKEN / name, log)
    for f in (log / "trajectories").glob("*.parquet"):
        t = pq.read_table(f)
        meta = dict(t.schema.metadata or {})
        if how == "waive_meta":
            top = col.split(".")[0]
            if col.startswith("turns.") and "turns" in t.column_names:
                turns = t.column("turns").combine_chunks()
                inner = turns.values
                keep = [
                    inner.type.field(i).name
                    for i in range(inner.type.num_fields)
                    if inner.type.field(i).name != col[6:]
                ]
                rebuilt = pa.StructArray.from_arrays([inner.field(k) for k in keep], names=keep)
                t = t.set_column(
                    t.schema.get_field_index("turns"), "turns", pa.ListArray.from_arrays(turns.offsets, rebuilt)
                )
            elif top in t.column_names:
                t = t.drop_columns([top])
            meta[b"rollout_log.not_recorded"] = json.dumps({col: rng.choice(HOSTILE) or "not recorded"}).encode()
        pq.write_table(t.replace_schema_metadata(meta), f)
    if how == "user_key":
        k, v = rng.choice(_USER_KEYS)
        _config(log, rng, f"{k} = {v}")
    elif how == "bounded":
        k, v = rng.choice(_BOUNDED)
        _config(log, rng, f"{k} = {v}")
    elif how == "penalty_log":
        _config(log, rng, f"truncation_penalty = {rng.choice(['1e9', '1e300', '100.0'])}")
    args = ["check", str(log), "--format", fmt]
    never_ok[0].args = args
    return WorkflowCase("round6", seed, args, [log], f"trust:{how}:{name}", judged, never_ok)


def prepare_round6(seed: int, work: Path) -> WorkflowCase:
    """The case of `seed`: surface ROUND6[seed % 10], its files drawn from a stream of its own."""
    builders = {
        "capture_http": _capture_http,
        "capture_records": _capture_records,
        "rllm_gateway_sqlite": _gateway_store,
        "prime_rl": _prime_rl,
        "trust": _trust,
    }
    return _prepare("round6", ROUND6, builders, seed, work)


def _prepare(name: str, surfaces: tuple[str, ...], builders: dict, seed: int, work: Path) -> WorkflowCase:
    """The case of `seed` of campaign `name`: surface `surfaces[seed % len]`, its files drawn from the
    stream `name:seed` (so a seed replays the same case), by the readers' builder or its own."""
    rng = random.Random(f"{name}:{seed}")
    what = surfaces[seed % len(surfaces)]
    if what in READERS:
        return _reader(what, seed, work, rng)
    return builders[what](seed, work, rng)


# ---------------------------------------------------------------- round 7: the rest of this round's surfaces
#
# `prepare_round7` draws from ROUND7: the round-6 surfaces (the same builders, a stream of their own, the
# SQLite store and the prime-rl batch with more shapes) and
# - `calls_join`: `check --from slime DUMP --calls CAPTURE` on a real recording of the recorder joined to a
#   slime dump by token prefix, either side mutated, the calls path hostile; a dump row re-rendered or a call
#   resampled must never exit 0 (a join in silence);
# - `integration_dumps`: the records the integrations write (verl's legacy and V1 trainers, SkyRL's trainer,
#   rLLM's backend and workflow trainer, slime, TRL's rollouts, the OpenAI client), mutated.

ROUND7 = (*ROUND6, "calls_join", "integration_dumps")
# what the round-7 campaign found: 371 and 5675 (a TRL rollout record whose step is infinite, whose turn
# fields disagree in count: "TRL: malformed record (...)", naming neither record nor field), 4634 (a gateway
# store whose index name is not UTF-8: UnicodeDecodeError escaped sqlite3, "internal error"), 10547 (an rLLM
# batch row whose traj_rewards holds a string: float()-ed, "a field has the wrong shape")
REGRESSION_SEEDS_7 = [371, 5675, 4634, 10547]
# the join's engine calls (the recorder's upstream in "join" mode): the first call's prompt, what it sampled,
# the tool's reply and what the second call sampled, with their log-probs
_P0 = [1, 31, 3, 22, 23, 24, 2, 3, 1, 30, 3]
_A0, _A1 = [50, 51, 2], [60, 61, 62, 2]
_TOOL = [3, 1, 33, 3, 40, 41, 2, 3, 1, 30, 3]
_LPS = {tuple(_A0): [-0.5, -0.25, -0.125], tuple(_A1): [-0.75, -0.375, -0.0625, -0.03125]}
_JOIN_CTX = ["--context", "temperature=1.0", "--context", "top_p=1.0"]
# (framework, fixture, context its page documents): each integration's own record
INTEGRATION_DUMPS = [
    ("verl", "trainer_compliant.jsonl", []),
    ("verl", "trainer_rejected_in_group_statistics.jsonl", []),
    ("verl", "compliant_v1.jsonl", []),
    ("skyrl", "trainer.jsonl", []),
    ("skyrl", "trainer_mask_trains_more.jsonl", []),
    ("rllm", "trainer_compliant.jsonl", []),
    ("rllm", "trainer_fully_async.jsonl", []),
    ("rllm", "compliant_workflow.jsonl", []),
    ("rllm", "workflow_grouped_by_trajectory_uid.jsonl", []),
    ("slime", "compliant.jsonl", []),
    ("openai", "compliant.jsonl", []),
    ("trl", "compliant", []),
    ("nemo_gym", "token_rewritten_after_capture.jsonl", []),
    ("agent_lightning", "temperature_override.jsonl", ["--context", "rollout_temperature=1.0"]),
]
# the recorder's join answers, keyed by the second call's tool message
_JOIN: dict[bool, dict] = {}


def _joined(second: bool) -> dict:
    """vLLM's chat answer with return_token_ids for the join's first or second call."""
    prompt, ids = (_P0 + _A0 + _TOOL, _A1) if second else (_P0, _A0)
    content = [{"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
               for i, lp in zip(ids, _LPS[tuple(ids)])]  # fmt: skip
    choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "logprobs": {"content": content}}
    choice |= {"finish_reason": "stop" if second else "tool_calls", "token_ids": ids}
    return {"id": "c", "object": "chat.completion", "model": "m", "choices": [choice], "prompt_token_ids": prompt}


_JOIN_RECORDING: list[bytes] = []


def join_recording() -> list[bytes]:
    """The session files of one real recording (made once per process): two sessions of two calls each
    through the recorder, the upstream answering the join's calls; the trainer posts no end."""
    if _JOIN_RECORDING:
        return _JOIN_RECORDING
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        with _recorder("join", Path(tmp) / "cap") as (url, _, _):
            for sid in ("s0", "s1"):
                for messages in (
                    [{"role": "user", "content": "open"}],
                    [{"role": "user", "content": "open"}, {"role": "tool", "content": "tool says"}],
                ):
                    body = json.dumps({"model": "m", "messages": messages, "temperature": 1.0, "top_p": 1.0,
                                       "return_token_ids": True, "logprobs": True})  # fmt: skip
                    _post(url, f"/sessions/{sid}/v1/chat/completions", body)
        _JOIN_RECORDING.extend(f.read_bytes() for f in sorted((Path(tmp) / "cap").glob("*.jsonl")))
    return _JOIN_RECORDING


def _slime_sample(index: int, prompt: list[int] = _P0) -> dict:
    """A slime sample of the join's two calls as its generate hook keeps them (no call ids, no contexts)."""
    resp = _A0 + _TOOL + _A1
    return {
        "rollout_id": None, "group_index": 0, "index": index, "tokens": prompt + resp,
        "response_length": len(resp), "reward": 1.0, "status": "completed", "remove_sample": False,
        "loss_mask": [1] * len(_A0) + [0] * len(_TOOL) + [1] * len(_A1), "weight_versions": ["5", "5"],
        "rollout_log_probs": _LPS[tuple(_A0)] + [0.0] * len(_TOOL) + _LPS[tuple(_A1)],
        "metadata": {"engine_calls": [{"response_length": 0, "tokens": list(_A0), "weight_version": "5"},
                                      {"response_length": len(_A0 + _TOOL), "tokens": list(_A1), "weight_version": "5"}]},
    }  # fmt: skip


def _calls_join(seed: int, work: Path, rng: random.Random) -> WorkflowCase:
    dump = work / "rollout_dumps.jsonl"
    cap = work / "cap"
    cap.mkdir()
    samples = [_slime_sample(0), _slime_sample(1)]
    files = [[json.loads(x) for x in data.splitlines() if x.strip()] for data in join_recording()]
    how = rng.choice(["dump", "calls", "calls", "both", "drift", "resampled", "calls_path"])
    fmt, judged = _fmt(rng)
    never_ok: list[FollowUp] = []
    calls = str(cap)
    if how == "drift":  # the trainer re-rendered a prefix: M105 at that row, never joined in silence
        prompt = list(_P0)
        prompt[rng.randrange(len(prompt))] += rng.choice([1, 7, 1000])
        samples[rng.randrange(2)] = _slime_sample(1, prompt)
    elif how == "resampled":  # a call's sampled ids are not the trainer's: the row meets no call
        x = next(r for f in files for r in f if isinstance(r.get("response_body"), dict))
        body = json.loads(x["response_body"]["text"]) if "text" in x["response_body"] else x["response_body"]
        body["choices"][0]["token_ids"][0] += 1
        x["response_body"] = {"text": json.dumps(body)} if "text" in x["response_body"] else body
    dump.write_bytes(
        mutated_lines(rng, samples)
        if how in ("dump", "both")
        else b"".join(json.dumps(s).encode() + b"\n" for s in samples)
    )
    for n, lines in enumerate(files):
        out = (
            mutated_lines(rng, lines)
            if how in ("calls", "both")
            else b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        )
        (cap / f"s{n}.jsonl").write_bytes(out)
    if how == "calls_path":
        where = rng.choice(["missing", "empty", "dump", "fifo", "devzero", "hidden", "not_jsonl"])
        calls = str(work / "calls")
        if where == "empty":
            (work / "calls").mkdir()
        elif where == "dump":
            calls = str(dump)
        elif where == "fifo":
            import os

            os.mkfifo(work / "calls.jsonl")
            calls = str(work / "calls.jsonl")
        elif where == "devzero":
            (work / "calls.jsonl").symlink_to("/dev/zero")
            calls = str(work / "calls.jsonl")
        elif where == "hidden":
            (work / "calls").mkdir()
            shutil.copy(cap / "s0.jsonl", work / "calls" / ".s0.jsonl")
        elif where == "not_jsonl":
            (work / "calls.txt").write_bytes(b"\x00" * 100)
            calls = str(work / "calls.txt")
        how = f"calls_path:{where}"
    args = ["check", "--from", "slime", str(dump), "--calls", calls, *_CTX, *_JOIN_CTX, "--format", fmt]
    if how in ("drift", "resampled"):
        never_ok = [FollowUp(args, (0,), (1, 2), f"calls_join: {how} joined in silence (exit 0)")]
    named = [Path(calls)] if how.startswith("calls_path") else None
    return WorkflowCase("round6", seed, args, [dump, cap], f"calls_join:{how}", judged, never_ok, named=named)


def _integration_dump(seed: int, work: Path, rng: random.Random) -> WorkflowCase:
    fw, name, extra = rng.choice(INTEGRATION_DUMPS)
    base = FIXTURES / fw / name
    if base.is_dir():  # TRL's run directory: its rollouts mutated, its own completion log beside them
        dump = work / "run"
        shutil.copytree(base, dump)
        for f in dump.glob("*.jsonl"):
            f.write_bytes(mutated_lines(rng, _lines(f)))
    else:
        dump = work / name
        dump.write_bytes(mutated_lines(rng, _lines(base)))
    fmt, judged = _fmt(rng)
    args = ["check", "--from", fw, str(dump), *_CTX, *extra, "--format", fmt]
    return WorkflowCase("round6", seed, args, [dump], f"integration_dumps:{fw}:{Path(name).stem}", judged)


def prepare_round7(seed: int, work: Path) -> WorkflowCase:
    """The case of `seed`: surface ROUND7[seed % 12], its files drawn from a stream of its own."""
    builders = {
        "capture_http": _capture_http,
        "capture_records": _capture_records,
        "rllm_gateway_sqlite": lambda s, w, r: _gateway_store(s, w, r, more=True),
        "prime_rl": lambda s, w, r: _prime_rl(s, w, r, more=True),
        "trust": _trust,
        "calls_join": _calls_join,
        "integration_dumps": _integration_dump,
    }
    return _prepare("round7", ROUND7, builders, seed, work)
