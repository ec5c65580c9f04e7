"""`rollout-audit capture` under load and on the shapes it had not been run on: 64 sessions at once
through the real `openai` client, a body over the recorder's limit, gzip-encoded bodies, and SGLang's
native `/generate`. The recorder runs in-process in front of a real HTTP server on loopback
(`capturehelp`); what it wrote is audited with `check --from openai` through the CLI."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from capturehelp import Reply, Running, Upstream, check, end, lines, record, upstream

openai = pytest.importorskip("openai")

__all__ = ["record", "upstream"]  # fixtures

SESSIONS = 64
TURNS = 2
BOS, EOT, ASSISTANT, USER = 1, 2, 3, 4
ROLES = {"assistant": ASSISTANT, "user": USER}
AT_ONCE = 60.0  # the longest the upstream waits for all sessions to be in flight (a bound, never a pause)


def tokens(text: str) -> list[int]:
    """The test engine's tokenizer: a message is space-separated integers, the token of n is n + 10."""
    return [int(w) + 10 for w in text.split()]


def chat_reply(barrier: threading.Barrier) -> Callable[[str, bytes], Reply]:
    """A chat engine whose answer depends only on the conversation: the prompt ids are the chat
    template's (BOS, then per message its role, its tokens and EOT, then the generation prompt), the
    answer of a conversation opened by user message `k` at its turn `t` is "k+100 t+200" then EOT,
    streamed or not as the request asks. Each session's first turn waits at `barrier` until every
    session's first turn has arrived: all of them are in flight through the recorder at once."""

    def reply(path: str, body: bytes) -> Reply:
        req = json.loads(body)
        messages = req["messages"]
        prompt = [BOS]
        for m in messages:
            prompt += [ROLES[m["role"]], *tokens(m["content"]), EOT]
        prompt.append(ASSISTANT)
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn == 0:
            barrier.wait()
        text = f"{int(messages[0]['content']) + 100} {turn + 200}"
        ids = [*tokens(text), EOT]
        entries = [{"token": f"token_id:{i}", "logprob": -0.25, "bytes": None, "top_logprobs": []} for i in ids]
        head = {"id": f"c{turn}", "created": 0, "model": "m"}
        if not req.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": {"content": entries}}
            doc = head | {"object": "chat.completion", "prompt_token_ids": prompt}
            doc["choices"] = [choice | {"finish_reason": "stop", "token_ids": ids}]
            return Reply([json.dumps(doc).encode()])
        head["object"] = "chat.completion.chunk"
        first = {"index": 0, "delta": {"role": "assistant"}}
        chunks = [head | {"prompt_token_ids": prompt, "choices": [first]}]
        words = [*text.split(" "), ""]
        for k, (i, e) in enumerate(zip(ids, entries)):
            delta = {"content": (" " if k == 1 else "") + words[k]}
            choice = {"index": 0, "delta": delta, "logprobs": {"content": [e]}, "token_ids": [i]}
            chunks.append(head | {"choices": [choice | {"finish_reason": "stop" if i == EOT else None}]})
        sse = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
        return Reply([*sse, b"data: [DONE]\n\n"], content_type="text/event-stream", chunked=True)

    return reply


async def _session(url: str, k: int, http: httpx.AsyncClient) -> list[str]:
    """One agent loop: TURNS turns (streamed and not, alternating by session), then its end."""
    sid = f"s{k:02d}"
    answers = []
    c = openai.AsyncOpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="none", max_retries=0, http_client=http)
    messages = [{"role": "user", "content": str(k)}]
    options: dict[str, Any] = {"model": "m", "temperature": 0.7, "top_p": 1.0}
    options["extra_body"] = {"return_token_ids": True}
    for t in range(TURNS):
        if (k + t) % 2:
            stream = await c.chat.completions.create(messages=messages, stream=True, **options)
            text = "".join([p.choices[0].delta.content or "" async for p in stream if p.choices])
        else:
            r = await c.chat.completions.create(messages=messages, **options)
            text = r.choices[0].message.content or ""
        answers.append(text)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": str(t)}]
    done = await http.post(f"{url}/sessions/{sid}/end", json={"stop_reason": "success", "reward": 1.0})
    assert done.json() == {"session": sid, "exchanges": TURNS}
    return answers


async def _all(url: str) -> list[list[str]]:
    """Every session at once, through one connection pool (one TLS context, not one per client)."""
    limits = httpx.Limits(max_connections=2 * SESSIONS)
    async with httpx.AsyncClient(limits=limits, timeout=AT_ONCE) as http:
        return await asyncio.gather(*(_session(url, k, http) for k in range(SESSIONS)))


def _answer(doc: dict[str, Any]) -> str:
    """The reply text of a recorded response body: a chat completion or its Server-Sent Events."""
    text = doc["text"]
    if not text.startswith("data:"):
        return json.loads(text)["choices"][0]["message"]["content"]
    events = [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events)


@pytest.mark.slow  # 128 calls through the real openai client and an audit of 64 sessions
def test_64_sessions_at_once_through_the_openai_client_are_each_recorded_whole_and_audit_clean(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path
) -> None:
    upstream.mode, upstream.reply = "reply", chat_reply(threading.Barrier(SESSIONS, timeout=AT_ONCE))
    rec = record(upstream.url)
    answers = asyncio.run(_all(rec.url))
    assert answers == [[f"{k + 100} {t + 200}" for t in range(TURNS)] for k in range(SESSIONS)]
    assert rec.recorder.sessions == {}  # an ended session leaves nothing behind in the recorder
    for k in range(SESSIONS):  # every exchange in its own session's file, in order, nothing of another's
        got = lines(tmp_path, f"s{k:02d}")
        assert [x["kind"] for x in got] == ["start", *["exchange"] * TURNS, "end"]
        ex = got[1:-1]
        assert [x["turn"] for x in ex] == list(range(TURNS))
        assert [_answer(x["response_body"]) for x in ex] == [f"{k + 100} {t + 200}" for t in range(TURNS)]
        assert all(json.loads(x["request_body"]["text"])["messages"][0]["content"] == str(k) for x in ex)
    done = check(tmp_path / "cap", "--format", "json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["summary"]["rows_read"] == SESSIONS


def chat(text: str = "ab", stream: bool = False) -> Reply:
    """vLLM's chat completion of `text` for the fixed prompt, whole or as Server-Sent Events."""
    ids = [*range(50, 50 + len(text)), EOT]
    entries = [{"token": f"token_id:{i}", "logprob": -0.5, "bytes": None, "top_logprobs": []} for i in ids]
    if not stream:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": {"content": entries}}
        doc = {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "prompt_token_ids": PROMPT}
        doc["choices"] = [choice | {"finish_reason": "stop", "token_ids": ids}]
        return Reply([json.dumps(doc).encode()])
    head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    events = [head | {"prompt_token_ids": PROMPT, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    for i, e, c in zip(ids, entries, [*text, ""]):
        choice = {"index": 0, "delta": {"content": c}, "logprobs": {"content": [e]}, "token_ids": [i]}
        events.append(head | {"choices": [choice | {"finish_reason": "stop" if i == EOT else None}]})
    chunks = [b"data: " + json.dumps(ev).encode() + b"\n\n" for ev in events]
    return Reply([*chunks, b"data: [DONE]\n\n"], content_type="text/event-stream", chunked=True)


PROMPT = [BOS, USER, 11, 12, EOT, ASSISTANT]
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "1 2"}], "temperature": 0.7, "top_p": 1.0}


def post(url: str, sid: str, body: bytes, **headers: str) -> tuple[httpx.Headers, bytes]:
    """A request through the recorder as raw bytes; the response's headers and raw bytes as received."""
    path = f"{url}/sessions/{sid}/v1/chat/completions"
    headers = {"Content-Type": "application/json", **headers}
    with httpx.stream("POST", path, content=body, headers=headers, timeout=AT_ONCE) as r:
        return r.headers, b"".join(r.iter_raw())


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_response_over_the_body_limit_is_forwarded_unchanged_and_its_session_not_audited(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path, stream: bool
) -> None:
    reply = chat("x" * 300, stream)  # about 2 kB whole, 60 kB streamed: over a limit of 1 kB
    upstream.mode, upstream.reply = "reply", lambda path, body: reply
    rec = record(upstream.url, max_body=1024)
    _, got = post(rec.url, "s1", json.dumps(REQUEST | {"stream": stream}).encode())
    assert got == b"".join(reply.chunks)  # byte for byte, never cut at the limit
    c = openai.OpenAI(base_url=f"{rec.url}/sessions/s2/v1", api_key="none", max_retries=0)
    if stream:
        text = "".join(p.choices[0].delta.content or "" for p in c.chat.completions.create(stream=True, **REQUEST))
    else:
        text = c.chat.completions.create(**REQUEST).choices[0].message.content
    assert text == "x" * 300
    for sid in ("s1", "s2"):
        assert end(rec.url, sid)["exchanges"] == 1
        got_lines = lines(tmp_path, sid)
        assert [x["kind"] for x in got_lines] == ["start", "exchange", "incomplete", "end"]
        assert got_lines[1]["response_body"] is None and got_lines[1]["request_body"] is not None
        size = sum(map(len, reply.chunks))
        assert got_lines[2]["reason"] == f"turn 0: response body over the limit ({size} > 1024 bytes)"
    done = check(tmp_path / "cap")
    assert done.exit_code == 2, done.output
    assert "not run: capture incomplete: 2 of 2 sessions not audited: session s1" in done.output
    assert "response body over the limit" in done.output and "Traceback" not in done.output


def test_a_request_over_the_body_limit_reaches_the_upstream_unchanged_and_its_session_not_audited(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path
) -> None:
    upstream.mode, upstream.reply = "reply", lambda path, body: chat()
    rec = record(upstream.url, max_body=1024)
    big = REQUEST | {"messages": [{"role": "user", "content": "1 " * 2000}]}
    sent = json.dumps(big).encode()
    _, got = post(rec.url, "s1", sent)
    assert got == chat().chunks[0]
    path, headers, body = upstream.received[-1]
    assert path == "/v1/chat/completions" and body == sent and headers["Content-Length"] == str(len(sent))
    end(rec.url, "s1")
    got_lines = lines(tmp_path, "s1")
    assert [x["kind"] for x in got_lines] == ["start", "incomplete", "exchange", "end"]
    assert got_lines[2]["request_body"] is None and got_lines[2]["response_body"] is not None
    assert got_lines[1]["reason"] == "turn 0: request body over the limit (> 1024 bytes)"
    done = check(tmp_path / "cap")
    assert done.exit_code == 2 and "session s1" in done.output, done.output
    assert "request body over the limit" in done.output


def _gzip(reply: Reply, pieces: int) -> Reply:
    """`reply` gzip-encoded (one gzip member), sent in `pieces` chunks when it is chunked."""
    packed = gzip.compress(b"".join(reply.chunks), mtime=0)
    step = -(-len(packed) // pieces)
    chunks = [packed[i : i + step] for i in range(0, len(packed), step)] if reply.chunked else [packed]
    return Reply(chunks, reply.content_type, reply.chunked, {"Content-Encoding": "gzip"})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_gzip_response_is_forwarded_as_received_and_recorded_with_its_encoding(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path, stream: bool
) -> None:
    reply = _gzip(chat("ab", stream), pieces=3)
    upstream.mode, upstream.reply = "reply", lambda path, body: reply
    rec = record(upstream.url)
    headers, got = post(rec.url, "raw", json.dumps(REQUEST | {"stream": stream}).encode())
    assert got == b"".join(reply.chunks) and headers["Content-Encoding"] == "gzip"  # never decoded on the way
    c = openai.OpenAI(base_url=f"{rec.url}/sessions/s1/v1", api_key="none", max_retries=0)
    if stream:
        text = "".join(p.choices[0].delta.content or "" for p in c.chat.completions.create(stream=True, **REQUEST))
    else:
        text = c.chat.completions.create(**REQUEST).choices[0].message.content
    assert text == "ab"  # the client decodes it
    for sid in ("raw", "s1"):
        end(rec.url, sid)
        ex = lines(tmp_path, sid)[1]
        assert ex["content_encoding"] == "gzip" and "base64" in ex["response_body"]
    done = check(tmp_path / "cap")  # the reader decodes what was recorded
    assert done.exit_code == 0, done.output


def test_a_gzip_request_reaches_the_upstream_encoded_and_is_read_decoded(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path
) -> None:
    upstream.mode, upstream.reply = "reply", lambda path, body: chat()
    rec = record(upstream.url)
    packed = gzip.compress(json.dumps(REQUEST).encode(), mtime=0)
    _, got = post(rec.url, "s1", packed, **{"Content-Encoding": "gzip"})
    assert got == chat().chunks[0]
    _, headers, body = upstream.received[-1]
    assert body == packed and headers["Content-Encoding"] == "gzip"
    end(rec.url, "s1")
    ex = lines(tmp_path, "s1")[1]
    assert ex["request_content_encoding"] == "gzip" and "base64" in ex["request_body"]
    done = check(tmp_path / "cap")
    assert done.exit_code == 0, done.output


def sglang(finish: str, incremental: bool = False) -> Callable[[str, bytes], Reply]:
    """SGLang's native `/generate` (sglang 0.5.23; the request's `input_ids`, `sampling_params`,
    `return_logprob`, `stream`: srt/managers/io_struct.py:188-256). The answer is `text`, `output_ids`
    and `meta_info` (tokenizer_manager.py:2507-2513, 2552-2558, 2664-2669) with `finish_reason` as
    `{"type": "stop", "matched": id}` or `{"type": "length", "length": n}` (schedule_batch.py:284-329)
    and `output_token_logprobs` as `[logprob, id, None]` triples (tokenizer_manager.py:3098-3108);
    streamed, each event holds the whole output so far (tokenizer_manager.py:2649-2663), or with
    `incremental` (the server's incremental_streaming_output, off by default: api/v1/api_types.py:759)
    its new ids and triples only (:2636-2647, :364-374), then `data: [DONE]` (http_server.py:951-975)."""

    def reply(path: str, body: bytes) -> Reply:
        assert path == "/generate"
        req = json.loads(body)
        out = [60 + len(req["input_ids"]) % 7, 61, EOT]
        triples = [[-0.5 - k / 8, i, None] for k, i in enumerate(out)]
        reason = {"type": "stop", "matched": EOT} if finish == "stop" else {"type": "length", "length": len(out)}

        def doc(n: int) -> dict[str, Any]:
            k = n - 1 if incremental and req.get("stream") else 0  # the event holds out[k:n]
            meta = {"id": "r0", "finish_reason": reason if n == len(out) else None}
            meta |= {"prompt_tokens": len(req["input_ids"]), "weight_version": "default", "num_retractions": 0}
            meta |= {"input_token_logprobs": [], "output_token_logprobs": triples[k:n]}
            meta |= {"output_token_logprobs_length": n, "reasoning_tokens": 0, "completion_tokens": n}
            meta["cached_tokens"] = 0
            return {"text": " ".join(map(str, out[k:n])), "output_ids": out[k:n], "meta_info": meta}

        if not req.get("stream"):
            return Reply([json.dumps(doc(len(out))).encode()])
        events = [b"data: " + json.dumps(doc(n)).encode() + b"\n\n" for n in range(1, len(out) + 1)]
        return Reply([*events, b"data: [DONE]\n\n"], content_type="text/event-stream", chunked=True)

    return reply


@pytest.mark.parametrize(
    ("finish", "incremental"), [("stop", False), ("length", False), ("stop", True)], ids=["stop", "length", "deltas"]
)
def test_sglang_generate_whole_and_streamed_is_recorded_and_audited(
    upstream: Upstream, record: Callable[..., Running], tmp_path: Path, finish: str, incremental: bool
) -> None:
    engine = sglang(finish, incremental)
    upstream.mode, upstream.reply = "reply", engine
    rec = record(upstream.url)
    ids = [BOS, USER, 11, 12, EOT, ASSISTANT]
    for stream in (True, False):  # the loop's two turns: the second context extends the first
        req = {"input_ids": ids, "sampling_params": {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 3}}
        req |= {"return_logprob": True, "stream": stream}
        r = httpx.post(f"{rec.url}/sessions/g1/generate", json=req, headers={"X-Weight-Version": "3"})
        assert r.content == b"".join(engine("/generate", json.dumps(req).encode()).chunks)
        events = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")] if stream else [r.json()]
        out = [i for e in events for i in e["output_ids"]] if incremental else events[-1]["output_ids"]
        ids = [*ids, *out, USER, 13, EOT, ASSISTANT]
    end(rec.url, "g1")
    ex = [x for x in lines(tmp_path, "g1") if x["kind"] == "exchange"]
    assert [x["endpoint"] for x in ex] == ["generate", "generate"] and [x["weight_version"] for x in ex] == ["3", "3"]
    done = check(tmp_path / "cap", "--format", "json")
    if finish == "stop":  # no finding at all: each turn's ids and log-probs read whole, the second extends the first
        assert done.exit_code == 0 and json.loads(done.output)["findings"] == [], done.output
        return
    assert done.exit_code == 1, done.output  # an engine stop at its budget, ended as a success with a reward
    found = json.loads(done.output)["findings"]
    assert {f["code"] for f in found} == {"T305"} and "'length'" in found[0]["message"], found
