"""`rollout-audit capture` off the happy path: a streamed response, a dead or silent upstream, a client
gone mid-stream, and a recorded fault. The recorder runs in-process (its aiohttp application on an
ephemeral loopback port, in a thread of its own) in front of a real HTTP server on loopback written
here; the real `openai` client talks to it; what it wrote is audited through the CLI."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")
import httpx  # noqa: E402
from aiohttp import web  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from rollout_audit.capture.proxy import Recorder  # noqa: E402
from rollout_audit.cli.main import main  # noqa: E402

CONTEXT = ["--context", "environment_id=doors", "--context", "environment_version=v1"]
CONTEXT += ["--context", "verifier_version=v1", "--context", "reset_seed=0"]
PROMPT = [1, 31, 3, 22, 23, 24, 2, 3, 1, 30, 3]
IDS = [50, 51, 2]
GATE = 2.0  # the longest a test's upstream waits on its release (a bound, never a pause)


def _chunk(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def sse(finish: str = "stop") -> list[bytes]:
    """vLLM's streamed chat completion with return_token_ids: prompt ids on the first chunk, each
    chunk's token ids and `token_id:N` log-prob entries, the finish reason, `[DONE]`."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    out = [_chunk(head | {"prompt_token_ids": PROMPT, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})]
    for k, i in enumerate(IDS):
        lp = {"content": [{"token": f"token_id:{i}", "logprob": -0.5, "bytes": None, "top_logprobs": []}]}
        choice = {"index": 0, "delta": {"content": "ab"[k] if k < 2 else ""}, "logprobs": lp, "token_ids": [i]}
        choice["finish_reason"] = finish if k == len(IDS) - 1 else None
        out.append(_chunk(head | {"choices": [choice]}))
    return [*out, b"data: [DONE]\n\n"]


class Upstream:
    """A loopback HTTP/1.1 server; `mode` says what it answers: `stream` (chunked SSE), `stall`
    (nothing, not even a status line, until released), `cut` (the first chunk, then nothing until released),
    `gated` (the first chunk, the rest once released), `late` (a JSON answer once released)."""

    def __init__(self) -> None:
        self.mode = "stream"
        self.chunks = sse()
        self.release = threading.Event()
        self.sent = threading.Event()  # the first chunk is out
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if up.mode == "stall":  # no status line until released
                    up.release.wait(GATE)
                    return
                if up.mode == "late":  # a whole JSON answer, once released
                    up.release.wait(GATE)
                    data = b'{"choices": []}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                try:
                    for n, c in enumerate(up.chunks):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                        self.wfile.flush()
                        if n == 0:
                            up.sent.set()
                            if up.mode in ("cut", "gated"):
                                up.release.wait(GATE)
                            if up.mode == "cut":
                                self.close_connection = True
                                return
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    threading.Thread(target=up.server.serve_forever, daemon=True).start()
    yield up
    up.release.set()
    up.server.shutdown()
    up.server.server_close()


class Running:
    """A Recorder served on an ephemeral loopback port by its own event loop in a thread."""

    def __init__(self, upstream: str, out: Path, **options: Any) -> None:
        self.recorder = Recorder(upstream, out, **options)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(self.recorder.app(), access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _, ctx: self.errors.append(ctx))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def idle(self) -> bool:
        """True once no exchange is in flight (bounded wait)."""
        for _ in range(200):
            if all(s.inflight == 0 for s in self.recorder.sessions.values()):
                return True
            threading.Event().wait(0.01)
        return False

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(GATE)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(GATE)
        self.loop.close()


@pytest.fixture
def record(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    made: list[Running] = []

    def start(url: str, **options: Any) -> Running:
        made.append(Running(url, tmp_path / "cap", **options))
        return made[-1]

    yield start
    for r in made:
        r.close()
        assert not r.errors, r.errors  # nothing escaped the recorder's handlers


def lines(tmp_path: Path, sid: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "cap" / f"{sid}.jsonl").read_text().splitlines()]


def client(url: str, sid: str, **kw: Any) -> Any:
    return openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="none", max_retries=0, **kw)


def ask(c: Any, stream: bool = True) -> Any:
    return c.chat.completions.create(
        model="m",
        messages=[
            {"role": "user", "content": "hi"},
        ],
        temperature=0.7,
        top_p=1.0,
        stream=stream,
        extra_body={"return_token_ids": True},
    )


def end(url: str, sid: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/sessions/{sid}/end", json={"stop_reason": "success", "reward": 1.0, "policy_version": 5})
    return r.json()


def check(path: Path) -> Any:
    return CliRunner().invoke(main, ["check", "--from", "openai", str(path), *CONTEXT])


def test_a_stream_reaches_the_client_byte_for_byte_and_audits_clean(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path
) -> None:
    rec = record(upstream.url)
    body = {"model": "m", "messages": [], "stream": True}
    with httpx.stream("POST", f"{rec.url}/sessions/raw/v1/chat/completions", json=body) as r:
        got = b"".join(r.iter_raw())
    assert got == b"".join(upstream.chunks)
    parts = list(ask(client(rec.url, "s1")))  # the real client parses what went through
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == "ab"
    assert parts[-1].choices[0].finish_reason == "stop"
    assert end(rec.url, "s1") == {"session": "s1", "exchanges": 1}
    assert end(rec.url, "raw") == {"session": "raw", "exchanges": 1}
    ex = [x for x in lines(tmp_path, "s1") if x["kind"] == "exchange"]
    assert len(ex) == 1 and ex[0].get("error") is None and ex[0]["status"] == 200
    assert ex[0]["response_body"]["text"].encode() == b"".join(upstream.chunks)
    assert json.loads(ex[0]["request_body"]["text"])["stream"] is True
    done = check(tmp_path / "cap")
    assert done.exit_code == 0, done.output


def test_a_dead_upstream_is_a_502_recorded_as_a_failure_not_a_turn(
    record: Callable[..., Running], tmp_path: Path
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    rec = record(dead)
    with pytest.raises(openai.APIStatusError) as e:
        ask(client(rec.url, "s1"), stream=False)
    assert e.value.status_code == 502 and "unreachable" in e.value.message
    assert end(rec.url, "s1") == {"session": "s1", "exchanges": 1}
    ex = [x for x in lines(tmp_path, "s1") if x["kind"] == "exchange"]
    assert len(ex) == 1 and ex[0]["status"] == 502 and "unreachable" in ex[0]["error"]
    done = check(tmp_path / "cap")  # the failed exchange is no turn: the session is not audited, and said
    assert done.exit_code == 2 and len(done.output.strip().splitlines()) == 1, done.output
    assert "capture incomplete: 1 of 1 sessions not audited: session s1: no exchange was a turn" in done.output
    assert "s1.jsonl:2: status 502" in done.output


def test_a_silent_upstream_is_a_504_and_the_recorder_stays_up(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path
) -> None:
    upstream.mode = "stall"
    rec = record(upstream.url, read_timeout=0.2)
    with pytest.raises(openai.APIStatusError) as e:
        ask(client(rec.url, "s1", timeout=GATE), stream=False)
    assert e.value.status_code == 504
    ex = [x for x in lines(tmp_path, "s1") if x["kind"] == "exchange"]
    assert len(ex) == 1 and ex[0]["status"] == 504 and "timed out" in ex[0]["error"]
    upstream.release.set()
    upstream.mode = "stream"  # the same recorder serves the next request
    assert "".join(p.choices[0].delta.content or "" for p in ask(client(rec.url, "s2")) if p.choices) == "ab"
    end(rec.url, "s1")  # the loop ends both: s1 is no pass for want of a turn
    end(rec.url, "s2")
    done = check(tmp_path / "cap")
    assert done.exit_code == 2, done.output
    assert "capture incomplete: 1 of 2 sessions not audited: session s1: no exchange was a turn" in done.output
    assert "s1.jsonl:2: status 504" in done.output


def test_an_upstream_cut_mid_stream_cuts_the_client_and_marks_the_session(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path
) -> None:
    upstream.mode = "cut"
    rec = record(upstream.url, read_timeout=GATE)
    stream = ask(client(rec.url, "s1", timeout=GATE))
    it = iter(stream)
    next(it)  # the first chunk went through before the cut
    upstream.release.set()
    with pytest.raises(httpx.HTTPError):  # the client sees a broken stream, never a clean end
        list(it)
    assert rec.idle()
    end(rec.url, "s1")
    kinds = [x["kind"] for x in lines(tmp_path, "s1")]
    assert kinds == ["start", "exchange", "incomplete", "end"]
    ex = lines(tmp_path, "s1")[1]
    assert "mid-stream" in ex["error"] and ex["response_body"]["text"].encode() == upstream.chunks[0]
    done = check(tmp_path / "cap")
    assert done.exit_code == 2 and "not run: capture incomplete" in done.output, done.output
    assert "Traceback" not in done.output


def test_a_client_gone_mid_stream_marks_the_session_and_the_recorder_survives(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path
) -> None:
    upstream.mode = "gated"
    rec = record(upstream.url, read_timeout=GATE)
    c = client(rec.url, "s1", timeout=GATE)
    stream = ask(c)
    next(iter(stream))
    stream.close()  # the client hangs up with the stream half read
    c.close()
    upstream.release.set()  # the rest arrives at a recorder whose client is gone
    assert rec.idle()
    end(rec.url, "s1")
    got = lines(tmp_path, "s1")
    assert [x["kind"] for x in got] == ["start", "exchange", "incomplete", "end"], got
    assert "client gone" in got[2]["reason"]
    done = check(tmp_path / "cap")
    assert done.exit_code == 2 and "not run: capture incomplete" in done.output, done.output
    assert "session s1" in done.output and "Traceback" not in done.output
    upstream.mode = "stream"
    upstream.release.clear()
    assert [p for p in ask(client(rec.url, "s2")) if p.choices]  # still serving


def test_a_stream_cut_at_its_token_budget_then_rewarded_is_a_finding(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path
) -> None:
    upstream.chunks = sse(finish="length")  # the engine stopped at max_tokens, said in the last chunk
    rec = record(upstream.url)
    list(ask(client(rec.url, "s1")))
    end(rec.url, "s1")  # the loop still posts success and a reward
    done = check(tmp_path / "cap")
    assert done.exit_code == 1, done.output
    assert "T305" in done.output and "s1.jsonl:2, trajectory s1, turn 0" in done.output
    assert "finish_reason 'length'" in done.output


def test_an_answer_the_client_stopped_waiting_for_is_not_recorded_as_received(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path
) -> None:
    upstream.mode = "late"
    rec = record(upstream.url, read_timeout=GATE)
    with pytest.raises(openai.APITimeoutError):
        ask(client(rec.url, "s1", timeout=0.2), stream=False)
    upstream.release.set()  # the answer arrives after the client hung up
    assert rec.idle()
    got = lines(tmp_path, "s1")
    assert [x["kind"] for x in got] == ["start", "exchange", "incomplete"], got
    assert "client gone" in got[1]["error"] and "client gone" in got[2]["reason"]
    end(rec.url, "s1")
    done = check(tmp_path / "cap")
    assert done.exit_code == 2 and "session s1" in done.output and "client gone before the response" in done.output
