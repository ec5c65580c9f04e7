"""What `rollout-audit capture` costs: the same calls to an OpenAI-compatible upstream, direct and
through the recorder, interleaved in one run, and the recorder's memory with 64 sessions in flight.

    python -m benchmarks.capture [--calls 2048] [--sessions 64] [--latency-calls 200] [--tokens 64] [--repeat 3]

Three processes on loopback: a minimal aiohttp upstream (a fixed chat completion of `--tokens`
tokens with vLLM's `return_token_ids` fields, whole or as one Server-Sent Event per token), the
recorder as users run it (`python -m rollout_audit.cli capture`, a fresh subprocess, recording
into a temporary directory), and this process as the client (aiohttp). For each of the whole and
the streamed answer, and `--repeat` rounds of direct then recorded:

- throughput: `--calls` calls by `--sessions` concurrent clients, each its own session (turns one
  after another, then the session's end), in calls per second;
- latency: `--latency-calls` calls one at a time, the median and 90th percentile to the last byte;
- CPU: the recorder's CPU time (user + system, from /proc) per recorded call, beside the upstream's
  per direct call: unlike the wall-clock figures, it does not move with other load on the machine.

The ratios (recorded / direct) pair the runs of one round. The recorder's resident memory is read
from /proc: after start-up and one call, the peak (VmHWM) over the runs with `--sessions` in
flight, and after the last round (what the ended sessions left). Every recorded exchange is
counted in the session files at the end (each must be there)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # `benchmarks` and `rollout_audit` are found from here


def answer(tokens: int, stream: bool) -> list[bytes]:
    """The upstream's answer: one body, or one `data:` event per token then `[DONE]`."""
    prompt = list(range(1, 257))
    ids = [100 + i % 50 for i in range(tokens)]
    entry: dict[str, Any] = {"logprob": -0.5, "bytes": None, "top_logprobs": []}
    if not stream:
        lp = {"content": [{"token": f"token_id:{i}"} | entry for i in ids]}
        choice = {"index": 0, "message": {"role": "assistant", "content": "x" * tokens}, "logprobs": lp}
        doc = {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "prompt_token_ids": prompt}
        doc["choices"] = [choice | {"finish_reason": "stop", "token_ids": ids}]
        return [json.dumps(doc).encode()]
    head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    out = [head | {"prompt_token_ids": prompt, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    for k, i in enumerate(ids):
        lp = {"content": [{"token": f"token_id:{i}"} | entry]}
        choice = {"index": 0, "delta": {"content": "x"}, "logprobs": lp, "token_ids": [i]}
        out.append(head | {"choices": [choice | {"finish_reason": "stop" if k == tokens - 1 else None}]})
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in out] + [b"data: [DONE]\n\n"]


def serve_upstream(tokens: int) -> None:
    """The upstream (run in its own process): prints its port, serves until killed."""
    from aiohttp import web

    whole, events = answer(tokens, False)[0], answer(tokens, True)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=whole, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in events:
            await response.write(chunk)
        await response.write_eof()
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def cpu(pid: int) -> float:
    """User and system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MB."""
    got = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M))
    return {k: int(v) / 1024 for k, v in got.items()}


async def calls(base: str, n: int, sessions: int, stream: bool, tag: str, recorded: bool) -> list[float]:
    """`n` calls by `sessions` concurrent clients (each a session of n/sessions turns, then its end
    when recorded); the latency of each call to its last byte."""
    import aiohttp

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7,
                       "top_p": 1.0, "stream": stream, "return_token_ids": True}).encode()  # fmt: skip
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []

    async def one(http: aiohttp.ClientSession, k: int, turns: int) -> None:
        prefix = f"{base}/sessions/{tag}-{k}" if recorded else base
        for _ in range(turns):
            t0 = time.perf_counter()
            async with http.post(f"{prefix}/v1/chat/completions", data=body, headers=headers) as r:
                await r.read()
                assert r.status == 200, r.status
            latencies.append(time.perf_counter() - t0)
        if recorded:
            async with http.post(f"{prefix}/end", json={"stop_reason": "success", "reward": 1.0}) as r:
                assert (await r.json())["exchanges"] == turns

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        per, extra = divmod(n, sessions)
        await asyncio.gather(*(one(http, k, per + (k < extra)) for k in range(sessions)))
    return latencies


def timed(base: str, n: int, sessions: int, stream: bool, tag: str, recorded: bool) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    lat = asyncio.run(calls(base, n, sessions, stream, tag, recorded))
    return time.perf_counter() - t0, lat


def start(cmd: list[str], pattern: str, on_stdout: bool) -> tuple[subprocess.Popen, str]:
    """A subprocess and the first match of `pattern` in the line it announces itself with."""
    pipe = {"stdout" if on_stdout else "stderr": subprocess.PIPE}
    p = subprocess.Popen(cmd, text=True, cwd=ROOT, **pipe)  # type: ignore[call-overload]
    stream = p.stdout if on_stdout else p.stderr
    assert stream is not None
    m = re.search(pattern, stream.readline())
    if not m:
        p.kill()
        raise SystemExit(f"{cmd[:4]} did not start")
    return p, m.group(1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2048)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--latency-calls", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)  # run as the upstream
    args = ap.parse_args(argv)
    if args.upstream:
        serve_upstream(args.tokens)
        return {}
    out = Path(tempfile.mkdtemp(prefix="capture-bench-"))
    up, port = start(
        [sys.executable, "-m", "benchmarks.capture", "--upstream", "--tokens", str(args.tokens)], r"(\d+)", True
    )
    upstream = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "rollout_audit.cli", "capture", "--upstream", upstream, "--out", str(out / "cap")]
    rec, url = start([*cmd, "--port", "0"], r"(http://\S+) ->", False)
    report: dict[str, Any] = {"calls": args.calls, "sessions": args.sessions, "tokens": args.tokens}
    report["load_average_start"] = os.getloadavg()[0]
    try:
        timed(url, 1, 1, False, "warm", True)
        timed(upstream, 1, 1, False, "warm", False)
        report["rss_start_mb"] = memory(rec.pid)["VmRSS"]
        recorded = 1
        for stream in (False, True):
            kind = "streamed" if stream else "whole"
            rows: dict[str, list[float]] = {}
            for r in range(args.repeat):
                for where, base, on in (("direct", upstream, False), ("recorded", url, True)):
                    used = cpu(rec.pid), cpu(up.pid)
                    wall, _ = timed(base, args.calls, args.sessions, stream, f"{kind}{r}t", on)
                    _, lat = timed(base, args.latency_calls, 1, stream, f"{kind}{r}l", on)
                    n = args.calls + args.latency_calls
                    recorded += n if on else 0
                    if on:
                        rows.setdefault("recorder_cpu_ms_per_call", []).append(1000 * (cpu(rec.pid) - used[0]) / n)
                    else:
                        rows.setdefault("upstream_cpu_ms_per_call", []).append(1000 * (cpu(up.pid) - used[1]) / n)
                    rows.setdefault(f"{where}_calls_per_s", []).append(args.calls / wall)
                    rows.setdefault(f"{where}_median_ms", []).append(1000 * statistics.median(lat))
                    rows.setdefault(f"{where}_p90_ms", []).append(1000 * statistics.quantiles(lat, n=10)[-1])
                    print(f"{kind} round {r} {where}: {args.calls / wall:.0f} calls/s, "
                          f"median {1000 * statistics.median(lat):.2f} ms", file=sys.stderr)  # fmt: skip
            summary = {k: statistics.median(v) for k, v in rows.items()}
            pairs = zip(rows["direct_calls_per_s"], rows["recorded_calls_per_s"])
            summary["throughput_ratio"] = statistics.median(d / p for d, p in pairs)
            pairs = zip(rows["recorded_median_ms"], rows["direct_median_ms"])
            summary["added_ms"] = statistics.median(p - d for p, d in pairs)
            pairs = zip(rows["recorded_median_ms"], rows["direct_median_ms"])
            summary["latency_ratio"] = statistics.median(p / d for p, d in pairs)
            report[kind] = summary
        mem = memory(rec.pid)
        report["rss_peak_mb"], report["rss_end_mb"] = mem["VmHWM"], mem["VmRSS"]
        report["load_average_end"] = os.getloadavg()[0]
        files = list((out / "cap").glob("*.jsonl"))
        exchanges = sum(f.read_text().count('"kind":"exchange"') for f in files)
        assert exchanges == recorded, f"{exchanges} exchanges recorded of {recorded}"
        report["exchanges_recorded"] = exchanges
        report["session_files"] = len(files)
    finally:
        rec.kill()
        up.kill()
        rec.wait()
        up.wait()
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
