"""`rollout-audit capture`: the real `openai` client through the recorder (a subprocess) in front of a
real HTTP server on loopback returning vLLM's `return_token_ids` shapes; what it wrote audited with
`check --from openai`."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# the client is imported where a test uses it: at collection, every worker would pay for its import
for _needed in ("openai", "aiohttp"):
    if importlib.util.find_spec(_needed) is None:
        pytest.skip(f"could not import {_needed!r}", allow_module_level=True)

CONTEXT = ["--context", "environment_id=doors", "--context", "environment_version=v1"]
CONTEXT += ["--context", "verifier_version=v1", "--context", "reset_seed=0"]
PROMPT = [1, 31, 3, 22, 23, 24, 2, 3, 1, 30, 3]


class Engine(BaseHTTPRequestHandler):
    """vLLM's chat completion with return_token_ids and `token_id:N` log-prob tokens."""

    protocol_version = "HTTP/1.1"
    logprob = -0.5

    def log_message(self, *a: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        ids = [50, 51, 2]
        lp = {
            "content": [
                {"token": f"token_id:{i}", "logprob": self.logprob, "bytes": None, "top_logprobs": []} for i in ids
            ]
        }
        choice = {"index": 0, "message": {"role": "assistant", "content": "ab"}, "logprobs": lp}
        choice |= {"finish_reason": "stop", "token_ids": ids}
        body = json.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [choice],
                "prompt_token_ids": PROMPT,
            }
        )
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def engine() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.fixture
def proxy(engine: str, tmp_path: Path) -> Iterator[str]:
    cmd = [sys.executable, "-m", "rollout_audit.cli", "capture", "--upstream", engine, "--out", str(tmp_path / "cap")]
    p = subprocess.Popen([*cmd, "--port", "0"], stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    m = re.search(r"(http://\S+) ->", p.stderr.readline())
    assert m, "the recorder did not say where it listens"
    yield m.group(1)
    p.kill()
    p.wait()


def _turn(url: str, sid: str) -> str:
    import openai

    c = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="none")
    r = c.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0.7,
        top_p=1.0,
        extra_body={"return_token_ids": True},
    )
    return r.choices[0].message.content or ""


def _check(path: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rollout_audit.cli", "check", "--from", "openai", str(path), *CONTEXT]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _end(url: str, sid: str) -> None:
    import httpx

    assert httpx.post(
        f"{url}/sessions/{sid}/end", json={"stop_reason": "success", "reward": 1.0, "policy_version": 5}
    ).json() == {
        "session": sid,
        "exchanges": 1,
    }


def test_a_recorded_session_forwards_unchanged_and_audits_clean(proxy: str, tmp_path: Path) -> None:
    assert _turn(proxy, "s1") == "ab"
    _end(proxy, "s1")
    lines = [json.loads(x) for x in (tmp_path / "cap" / "s1.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["start", "exchange", "end"]
    raw = json.loads(lines[1]["response_body"]["text"])
    assert raw["prompt_token_ids"] == PROMPT and raw["choices"][0]["logprobs"]["content"][0]["bytes"] is None
    done = _check(tmp_path / "cap")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # a recorder process and an audit process each; the first test keeps the path fast
def test_a_session_without_its_end_is_not_run_capture_incomplete(proxy: str, tmp_path: Path) -> None:
    _turn(proxy, "s1")
    _end(proxy, "s1")
    _turn(proxy, "s2")  # never ended
    done = _check(tmp_path / "cap")
    assert done.returncode == 2
    # why the audit is incomplete is said on stderr, with the prefix; stdout keeps the verdict
    assert "not run: capture incomplete: 1 of 2 sessions not audited: session s2: no end record" in done.stderr
    assert done.stderr.startswith("rollout-audit: error: ") and "INCOMPLETE" in done.stdout


@pytest.mark.slow  # a recorder process and an audit process each; the first test keeps the path fast
def test_a_torn_last_line_is_tolerated_and_a_newer_format_refused(proxy: str, tmp_path: Path) -> None:
    _turn(proxy, "s1")
    _end(proxy, "s1")
    f = tmp_path / "cap" / "s1.jsonl"
    whole = f.read_text()
    f.write_text(whole + '{"capture":1,"kind":"exch')  # a recorder killed mid-write
    done = _check(tmp_path / "cap")
    assert done.returncode == 2 and "a torn last line" in done.stderr + done.stdout
    f.write_text(whole.replace('"capture":1,"kind":"end"', '"capture":2,"kind":"end"'))
    done = _check(tmp_path / "cap")
    assert done.returncode == 2
    assert "capture record format 2 is newer than the format 1" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
