"""`rollout-audit capture` off the happy path: a streamed response, a dead or silent upstream, a client
gone mid-stream, and a recorded fault. The recorder runs in-process in front of a real HTTP server on
loopback (`capturehelp`); the real `openai` client talks to it; what it wrote is audited through the CLI."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from capturehelp import GATE, Running, Upstream, ask, check, client, end, lines, record, sse, upstream

openai = pytest.importorskip("openai")

__all__ = ["record", "upstream"]  # fixtures


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


def test_a_recorder_killed_mid_stream_leaves_its_session_not_run_capture_incomplete(
    upstream: Upstream, tmp_path: Path
) -> None:
    """The recorder as users run it (a process), SIGKILLed while a stream of a session's second turn is
    in flight: the client's stream breaks, the session has no end, and the audit says "not run: capture
    incomplete" (exit 2), never a pass on the turn that was whole."""
    import re
    import signal
    import subprocess
    import sys
    import threading

    cmd = [sys.executable, "-m", "rollout_audit.cli", "capture", "--upstream", upstream.url]
    p = subprocess.Popen([*cmd, "--out", str(tmp_path / "cap"), "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        m = re.search(r"(http://\S+) ->", p.stderr.readline())
        assert m, "the recorder did not say where it listens"
        c = client(m.group(1), "s1")
        assert list(ask(c))  # a whole streamed turn
        upstream.mode = "gated"  # the next stream sends its first chunk, then waits
        failed: list[str] = []

        def second() -> None:
            try:
                list(ask(c))
            except (openai.APIError, httpx.HTTPError) as e:  # a cut stream is httpx's RemoteProtocolError
                failed.append(type(e).__name__)

        t = threading.Thread(target=second, daemon=True)
        t.start()
        assert upstream.sent.wait(GATE)
        p.send_signal(signal.SIGKILL)
        p.wait(GATE)
    finally:
        p.kill()
        p.wait()
    upstream.release.set()
    t.join(GATE)
    assert failed, "the client's stream did not break"
    res = check(tmp_path / "cap")
    assert res.exit_code == 2 and "not run: capture incomplete: 1 of 1 sessions not audited: session s1" in res.output
