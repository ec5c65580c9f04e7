"""A passive recording proxy in front of an OpenAI-compatible server (vLLM, SGLang, a router).

Every request is forwarded to the upstream as the client sent it (its body byte for byte, its
headers but the hop-by-hop ones), and every response back as the upstream sent it, streamed
chunk by chunk when it streams; nothing is added, rendered or converted. Each exchange is one
line of `rollout_audit.contract.capture` in the session's file, written with one `write` and
synced to disk before the client can hold the whole response: a body of known length within the
limit is sent after the sync; a stream's chunks go out as they arrive, but the chunk holding
`data: [DONE]` and the end of the response only after it; any other body relayed as it arrives
(over the limit, chunked, encoded) goes out one chunk behind, its last chunk after the sync.

Routes (on the recorder's own address):

- `/sessions/{id}/…` forwards `…` to the upstream, recorded as session `id`; any other path is
  forwarded as it is, recorded under the session of the `X-Rollout-Session` header;
- `POST /sessions/{id}/end` (or `POST /end` with the header), a JSON object of `stop_reason`,
  `reward`, `policy_version`, `task_id`, `group_id`: the session's end, answered once every
  exchange of the session in flight is recorded; never forwarded;
- `POST /capture/weight_version` `{"version": N}`: the policy version stamped on the exchanges
  dispatched from then on (a request's own `X-Weight-Version` header wins); never forwarded.

A request without a session is forwarded unrecorded when it is a GET (a client listing models)
and refused (400) otherwise: a recorder that drops what it was asked to record would pass in
silence. An unreachable upstream is answered 502, a timeout 504, both recorded; an upstream's
own error is relayed as it is. A client gone before its answer (mid-stream, or past its own
timeout) leaves the exchange recorded with that error and its session marked incomplete.

Memory per exchange in flight is bounded by `max_body`: a request or response body over it is
forwarded unchanged as it arrives (never cut, never refused), recorded without its body (null),
and its session marked incomplete with the reason. A body in an HTTP content coding (gzip) is
forwarded and recorded as it came, with its coding named; the reader decodes it. A live session
holds two counters, a lock and no open file; an ended one nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientError, ClientResponse, ClientSession, ClientTimeout, StreamReader, TCPConnector, web
from aiohttp.http_exceptions import HttpProcessingError

from ..contract import capture as F

HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)


class _OneLine(logging.Handler):
    """aiohttp's word on a request it could not handle (a malformed request line, a header over 8190
    bytes, a bad chunk size: answered 400) as one line on stderr, escaped, without aiohttp's traceback:
    what a client sends is never printed raw, and a client's garbage is not a crash of the recorder."""

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        said = str(getattr(exc, "message", None) or exc or "").strip()
        why = f": {type(exc).__name__}: {said.splitlines()[0] if said else ''}" if exc else ""
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in f"{record.getMessage()}{why}")
        if isinstance(exc, HttpProcessingError):
            level = "warning: a malformed request"
        elif isinstance(exc, ConnectionError):  # the client went away before its answer was written
            level = "warning: a client gone"
        else:
            level = "error"
        try:
            sys.stderr.write(f"rollout-audit capture: {level}: {text[:500]}\n")
        except (OSError, ValueError):
            pass


# the recorder's server log (aiohttp's `logger=`): warnings and errors only, one escaped line each
SERVER_LOG = logging.getLogger("rollout_audit.capture.server")
SERVER_LOG.propagate = False
SERVER_LOG.setLevel(logging.WARNING)
SERVER_LOG.addHandler(_OneLine())

_SESSION_PATH = re.compile(rf"^/sessions/({F.SESSION_PATTERN})(/.*)?$")
_SESSION = re.compile(rf"^{F.SESSION_PATTERN}$")
DONE = b"data: [DONE]"


@dataclass
class Session:
    """What the recorder keeps of a live session: the next turn, the exchanges in flight, a write lock."""

    turns: int = 0
    inflight: int = 0
    idle: asyncio.Condition = field(default_factory=asyncio.Condition)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Recorder:
    """The proxy: `app()` is its aiohttp application."""

    def __init__(
        self,
        upstream: str,
        out: str | os.PathLike,
        *,
        max_body: int = 64 << 20,
        connect_timeout: float = 10.0,
        read_timeout: float = 600.0,
        version: str = "",
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.out = Path(out)
        self.max_body = max_body
        self.timeout = ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self.version = version
        self.weight_version: str | None = None
        self.sessions: dict[str, Session] = {}
        self.client: ClientSession | None = None

    # ------------------------------------------------------------ the application

    def runner(self) -> web.AppRunner:
        """The application's runner; request bodies are read as the client sent them (a
        gzip-encoded request is forwarded and recorded encoded, never decoded on the way)."""
        return web.AppRunner(self.app(), access_log=None, auto_decompress=False, logger=SERVER_LOG)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _: web.Application) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        # no pool limit: 64 sessions streaming at once each hold one upstream connection
        self.client = ClientSession(
            connector=TCPConnector(limit=0),
            timeout=self.timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def _stop(self, _: web.Application) -> None:
        if self.client is not None:
            await self.client.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/capture/weight_version" and request.method == "POST":
            return await self._set_weight_version(request)
        sid, rest = self._session(request)
        if sid is not None and not _SESSION.match(sid):
            return _refuse(400, f"session {sid[:80]!r} is not {F.SESSION_PATTERN}")
        if rest == "/end" and request.method == "POST":
            if sid is None:
                return _refuse(400, f"POST /end needs a session: /sessions/ID/end or the {F.SESSION_HEADER} header")
            return await self._end(request, sid)
        if sid is None and request.method != "GET":
            return _refuse(
                400, f"no session: send to /sessions/ID/… or set the {F.SESSION_HEADER} header (nothing forwarded)"
            )
        return await self._forward(request, sid, rest)

    def _session(self, request: web.Request) -> tuple[str | None, str]:
        """The session of a request and the upstream path it goes to."""
        m = _SESSION_PATH.match(request.path)
        if m:
            return m.group(1), m.group(2) or "/"
        return request.headers.get(F.SESSION_HEADER), request.path

    # ------------------------------------------------------------ forwarding

    async def _forward(self, request: web.Request, sid: str | None, path: str) -> web.StreamResponse:
        assert self.client is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        url = self.upstream + path + (f"?{request.query_string}" if request.query_string else "")
        # the request body: kept whole up to max_body; a larger one is forwarded as it arrives, unrecorded
        first, whole = await _read_upto(request.content, self.max_body)
        body = b"".join(first) if whole else None
        data: Any = body if body is not None else _relay(first, request.content)
        if body is None and request.headers.get("Content-Length"):  # the same framing as the client's
            headers["Content-Length"] = request.headers["Content-Length"]
        if sid is None:
            return await self._pass(request, url, headers, data)
        state = self.sessions.setdefault(sid, Session())
        turn, state.turns = state.turns, state.turns + 1
        state.inflight += 1
        version, source = request.headers.get(F.WEIGHT_HEADER), "header"
        if version is None:
            version, source = self.weight_version, "set"
        line: dict[str, Any] = {
            F.KEY: F.VERSION,
            "kind": "exchange",
            "session": sid,
            "turn": turn,
            "method": request.method,
            "path": path,
            "endpoint": _endpoint(path),
            "dispatched_at": time.time(),
            "weight_version": version,
            "weight_version_from": source if version is not None else None,
            "request_body": F.body(body) if body is not None else None,
        }
        if request.headers.get("Content-Encoding"):
            line["request_content_encoding"] = request.headers["Content-Encoding"]
        try:
            if body is None:
                await self._incomplete(sid, f"turn {turn}: request body over the limit (> {self.max_body} bytes)")
            return await self._exchange(request, sid, url, headers, data, line)
        finally:
            state.inflight -= 1
            async with state.idle:
                state.idle.notify_all()

    async def _exchange(
        self, request: web.Request, sid: str, url: str, headers: dict[str, str], data: Any, line: dict[str, Any]
    ) -> web.StreamResponse:
        """Forward one recorded request; record the exchange before the client holds all of the response."""
        assert self.client is not None
        try:
            upstream = await self.client.request(request.method, url, headers=headers, data=data, allow_redirects=False)
        except (ClientError, OSError, asyncio.TimeoutError) as e:
            timed_out = isinstance(e, asyncio.TimeoutError)
            status = 504 if timed_out else 502
            why = f"upstream {self.upstream} {'timed out' if timed_out else 'unreachable'}: {type(e).__name__}: {e}"
            reply = _error_body(why, "upstream_timeout" if timed_out else "upstream_unreachable")
            line |= {"status": status, "content_type": "application/json", "response_body": F.body(reply)}
            await self._write(sid, line | {"completed_at": time.time(), "error": why})
            return web.Response(status=status, body=reply, content_type="application/json")
        async with upstream:
            line |= {"status": upstream.status, "content_type": upstream.headers.get("Content-Type")}
            if upstream.headers.get("Content-Encoding"):  # forwarded as it came; the reader decodes it
                line["content_encoding"] = upstream.headers["Content-Encoding"]
            length = upstream.content_length
            if length is not None and length <= self.max_body:
                return await self._whole(request, sid, upstream, line)
            return await self._relayed(request, sid, upstream, line)

    async def _whole(
        self, request: web.Request, sid: str, upstream: ClientResponse, line: dict[str, Any]
    ) -> web.StreamResponse:
        """A body of a known length within the limit: read, recorded, then sent."""
        try:
            data = await upstream.read()
        except (ClientError, asyncio.TimeoutError) as e:
            return await self._broken(request, sid, line, b"", f"upstream failed mid-response: {e!r}", None)
        if _gone(request):  # the client stopped waiting: the answer never reached it
            return await self._broken(request, sid, line, data, "client gone before the response (it stopped waiting)")
        await self._write(sid, line | {"completed_at": time.time(), "response_body": F.body(data)})
        return web.Response(status=upstream.status, body=data, headers=_headers(upstream))

    async def _relayed(
        self, request: web.Request, sid: str, upstream: ClientResponse, line: dict[str, Any]
    ) -> web.StreamResponse:
        """A stream, or a body over the limit: forwarded as it arrives, kept up to the limit. The end
        waits for the record: a stream's chunks from the one holding `data: [DONE]` on, any other
        body's last chunk (each chunk goes out when the next arrives; an encoded stream's too)."""
        response = await _prepared(request, upstream)
        # `[DONE]` is seen only in a stream sent without a content coding (gzip hides it)
        events = "event-stream" in (upstream.headers.get("Content-Type") or "")
        events = events and not upstream.headers.get("Content-Encoding")
        kept: list[bytes] | None = []
        pending: list[bytes] = []  # received, not yet forwarded
        size = 0
        held = False
        try:
            async for chunk in upstream.content.iter_any():
                size += len(chunk)
                if kept is not None and size > self.max_body:
                    kept = None
                elif kept is not None:
                    kept.append(chunk)
                pending.append(chunk)
                held = held or (events and DONE in chunk)
                if held:
                    continue
                send, pending = (pending, []) if events else (pending[:-1], pending[-1:])
                try:
                    for c in send:
                        await response.write(c)
                except (ConnectionError, RuntimeError) as e:  # aiohttp's reset is a ClientError too
                    why = f"client gone mid-stream: {e!r}"
                    return await self._broken(request, sid, line, _joined(kept), why)
        except (ClientError, asyncio.TimeoutError) as e:
            why = f"upstream failed mid-stream: {e!r}"
            return await self._broken(request, sid, line, _joined(kept), why, response, b"".join(pending))
        await self._write(sid, line | {"completed_at": time.time(), "response_body": _recorded(kept)})
        if kept is None:
            why = f"response body over the limit ({size} > {self.max_body} bytes)"
            await self._incomplete(sid, f"turn {line['turn']}: {why}")
        try:
            for c in pending:
                await response.write(c)
            await response.write_eof()
        except (ConnectionError, RuntimeError) as e:
            await self._incomplete(sid, f"turn {line['turn']}: client gone before the end of the stream: {e!r}")
        return response

    async def _broken(
        self,
        request: web.Request,
        sid: str,
        line: dict[str, Any],
        got: bytes | None,
        why: str,
        response: web.StreamResponse | None = None,
        held: bytes = b"",
    ) -> web.StreamResponse:
        """An exchange cut off mid-way: what arrived is recorded with the reason (no body when it was
        over the limit), the session marked incomplete, and the client's connection closed without a
        clean end (as the upstream's was)."""
        record = line | {"completed_at": time.time(), "response_body": _recorded(got), "error": why}
        await self._write(sid, record)
        await self._incomplete(sid, f"turn {line['turn']}: {why}")
        if response is not None:
            if held:
                try:
                    await response.write(held)
                except (ConnectionError, RuntimeError):
                    pass
            if request.transport is not None:
                request.transport.abort()
            return response
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=502)

    async def _pass(self, request: web.Request, url: str, headers: dict[str, str], data: Any) -> web.StreamResponse:
        """A request of no session (a GET): forwarded and relayed as it arrives, not recorded."""
        assert self.client is not None
        try:
            async with self.client.request(
                request.method, url, headers=headers, data=data, allow_redirects=False
            ) as upstream:
                response = await _prepared(request, upstream)
                try:
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
                except (ClientError, asyncio.TimeoutError, ConnectionError, RuntimeError):
                    if request.transport is not None:
                        request.transport.abort()
                return response
        except (ClientError, OSError, asyncio.TimeoutError) as e:
            why = f"upstream {self.upstream} unreachable: {type(e).__name__}: {e}"
            return web.Response(
                status=502, body=_error_body(why, "upstream_unreachable"), content_type="application/json"
            )

    # ------------------------------------------------------------ the recorder's own calls

    async def _end(self, request: web.Request, sid: str) -> web.Response:
        try:
            fields = json.loads(await request.read() or b"{}")
        except RecursionError:
            return _refuse(400, "end: the body is JSON nested too deeply")
        except ValueError as e:
            return _refuse(400, f"end: the body is not JSON: {e}")
        if not isinstance(fields, dict):
            return _refuse(400, "end: the body must be a JSON object")
        state = self.sessions.setdefault(sid, Session())
        async with state.idle:  # every exchange dispatched before the end is recorded before it
            await state.idle.wait_for(lambda: state.inflight == 0)
        await self._write(sid, {F.KEY: F.VERSION, "kind": "end", "session": sid, "end": fields})
        turns = state.turns
        if state.inflight == 0:
            self.sessions.pop(sid, None)
        return web.json_response({"session": sid, "exchanges": turns})

    async def _set_weight_version(self, request: web.Request) -> web.Response:
        try:
            doc = json.loads(await request.read())
        except RecursionError:
            return _refuse(400, "weight_version: the body is JSON nested too deeply")
        except ValueError as e:
            return _refuse(400, f"weight_version: the body is not JSON: {e}")
        version = doc.get("version") if isinstance(doc, dict) else None
        if version is None or isinstance(version, bool) or not isinstance(version, (int, str)):
            return _refuse(400, 'weight_version: expected {"version": N}')
        self.weight_version = str(version)
        return web.json_response({"weight_version": self.weight_version})

    # ------------------------------------------------------------ the record

    async def _incomplete(self, sid: str, reason: str) -> None:
        await self._write(sid, {F.KEY: F.VERSION, "kind": "incomplete", "session": sid, "reason": reason})

    async def _write(self, sid: str, record: dict[str, Any]) -> None:
        """Append one line to the session's file and sync it (in a worker thread, never on the loop)."""
        state = self.sessions.setdefault(sid, Session())
        data = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
        async with state.lock:
            await asyncio.to_thread(self._append, sid, data)

    def _append(self, sid: str, data: bytes) -> None:
        path = self.out / f"{sid}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size:
                _cut_torn_tail(fd, path)
            if os.fstat(fd).st_size == 0:
                start = {F.KEY: F.VERSION, "kind": "start", "session": sid, "upstream": self.upstream}
                start |= {"recorder": self.version, "started_at": time.time()}
                data = (json.dumps(start, separators=(",", ":")) + "\n").encode() + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)


def _cut_torn_tail(fd: int, path: Path) -> None:
    """A file a killed recorder left with a torn last line is cut back to its last whole line
    before anything is appended (the torn line was never answered: its client saw no response)."""
    size = os.fstat(fd).st_size
    with path.open("rb") as fh:
        fh.seek(max(0, size - 1))
        if fh.read(1) == b"\n":
            return
        back = min(size, 1 << 20)
        while True:
            fh.seek(size - back)
            tail = fh.read(back)
            cut = tail.rfind(b"\n")
            if cut >= 0 or back == size:
                os.truncate(path, size - back + cut + 1 if cut >= 0 else 0)
                return
            back = min(size, back * 2)


def _headers(upstream: ClientResponse) -> dict[str, str]:
    """The upstream's response headers but the hop-by-hop ones."""
    return {k: v for k, v in upstream.headers.items() if k.lower() not in HOP}


async def _prepared(request: web.Request, upstream: ClientResponse) -> web.StreamResponse:
    """The client's response, started with the upstream's status, headers and framing."""
    response = web.StreamResponse(status=upstream.status, headers=_headers(upstream))
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    await response.prepare(request)
    return response


async def _read_upto(stream: StreamReader, limit: int) -> tuple[list[bytes], bool]:
    """The first chunks of a body, up to just past `limit` bytes; True when that is the whole body."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await stream.read(limit + 1 - size)
        if not chunk:
            return chunks, True
        chunks.append(chunk)
        size += len(chunk)
    return chunks, False


async def _relay(first: list[bytes], rest: StreamReader) -> AsyncIterator[bytes]:
    """A body forwarded as it arrives: the chunks already read, then the rest."""
    for chunk in first:
        yield chunk
    async for chunk in rest.iter_any():
        yield chunk


def _joined(kept: list[bytes] | None) -> bytes | None:
    return None if kept is None else b"".join(kept)


def _recorded(data: list[bytes] | bytes | None) -> dict[str, str] | None:
    """A body as recorded: None when it was over the limit (the incomplete marker says so)."""
    if data is None:
        return None
    return F.body(data if isinstance(data, bytes) else b"".join(data))


def _gone(request: web.Request) -> bool:
    """True when the client's connection is closed or closing."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _endpoint(path: str) -> str:
    """`chat/completions` of `/v1/chat/completions`, `generate` of `/generate`."""
    p = path.lstrip("/")
    return p[3:] if p.startswith("v1/") else p


def _error_body(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": None}}).encode()


def _refuse(status: int, message: str) -> web.Response:
    return web.Response(
        status=status, body=_error_body(f"rollout-audit capture: {message}", "capture"), content_type="application/json"
    )


async def serve(recorder: Recorder, host: str, port: int, ready: Any = None) -> None:
    """Run `recorder` on host:port until cancelled; `ready(url)` is called once it listens."""
    runner = recorder.runner()
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        bound = runner.addresses[0][1] if runner.addresses else port
        if ready is not None:
            ready(f"http://{host}:{bound}")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
