"""The harness of the `rollout-audit capture` tests: a real HTTP/1.1 server on loopback written here
(the upstream), the recorder's aiohttp application served in-process on an ephemeral loopback port
by an event loop in a thread of its own, the real `openai` client, and the audit through the CLI."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout_audit.cli.main import main

# the client, the HTTP libraries and the recorder are imported where a test uses them: a module of
# the fast tier imports this one, and at collection every worker would pay for their import
for _needed in ("openai", "aiohttp"):
    if importlib.util.find_spec(_needed) is None:
        pytest.skip(f"could not import {_needed!r}", allow_module_level=True)

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


@dataclass
class Reply:
    """What the upstream answers in `reply` mode: its body as `chunks`, sent with a Content-Length
    (`chunked` False) or as HTTP/1.1 chunks, one per item."""

    chunks: list[bytes]
    content_type: str = "application/json"
    chunked: bool = False
    headers: dict[str, str] = field(default_factory=dict)


class Upstream:
    """A loopback HTTP/1.1 server; `mode` says what it answers: `stream` (chunked SSE), `stall`
    (nothing, not even a status line, until released), `cut` (the first chunk, then nothing until released),
    `gated` (the first chunk, the rest once released), `late` (a JSON answer once released), `reply`
    (what `reply(path, body)` returns). `received` holds every request as it arrived: path, headers, body."""

    def __init__(self) -> None:
        self.mode = "stream"
        self.chunks = sse()
        self.release = threading.Event()
        self.sent = threading.Event()  # the first chunk is out
        self.reply: Callable[[str, bytes], Reply] | None = None
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                up.received.append((self.path, dict(self.headers), body))
                if up.mode == "reply" and up.reply is not None:
                    return self._send(up.reply(self.path, body))
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

            def _send(self, reply: Reply) -> None:
                self.send_response(200)
                self.send_header("Content-Type", reply.content_type)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                if reply.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(sum(map(len, reply.chunks))))
                self.end_headers()
                for c in reply.chunks:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c) if reply.chunked else c)
                if reply.chunked:
                    self.wfile.write(b"0\r\n\r\n")

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # 64 sessions connect at once

        self.server = Server(("127.0.0.1", 0), Handler)
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
        from aiohttp import web

        from rollout_audit.capture.proxy import Recorder

        self.recorder = Recorder(upstream, out, **options)
        self.loop = asyncio.new_event_loop()
        self.runner = self.recorder.runner()
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
    import openai

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
    import httpx

    r = httpx.post(f"{url}/sessions/{sid}/end", json={"stop_reason": "success", "reward": 1.0, "policy_version": 5})
    return r.json()


def check(path: Path, *options: str) -> Any:
    return CliRunner().invoke(main, ["check", "--from", "openai", str(path), *CONTEXT, *options])
