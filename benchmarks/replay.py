"""Replay throughput on CPU (CUDA for the Hugging Face replayer when present): the reference agent's
replayer and a tiny transformers model, in-process and through the loopback completions server.

    python -m benchmarks.replay [--trajectories 128] [--turn-tokens 16]

Prints one row per replayer: trajectories, context tokens read, policy tokens scored, wall and CPU
seconds (the HTTP server runs in the same process), scored and context tokens per wall and per CPU
second (on a shared machine the CPU figure is the stable one). The first pass loads the model; the
timed pass is the second.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from rollout_audit.replay import HFReplayer, HTTPReplayer, replay_frame


def _summary(path: Path) -> pl.DataFrame:
    """The (file, trajectory_id, pv_min) frame replay samples from, read straight from the log."""
    import rollout_audit as ra

    log = ra.scan(str(path))
    first = log.turns.group_by("trajectory_id").agg(pl.col("policy_version").min().alias("pv_min")).collect()
    files = sorted(str(p) for p in (path / "trajectories").glob("*.parquet"))
    return first.with_columns(pl.lit(files[0]).alias("file"))


def _time(name: str, traj: pl.DataFrame, replayer: Any) -> dict[str, Any]:
    """Replay every trajectory twice; report the second pass."""
    replay_frame(traj, traj.height, replayer)
    t0, c0 = time.perf_counter(), time.process_time()
    frame = replay_frame(traj, traj.height, replayer)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    context = int(frame.group_by("_row").agg(pl.col("position").max())["position"].sum())
    return {
        "replayer": name,
        "trajectories": traj.height,
        "context_tokens": context,
        "scored_tokens": frame.height,
        "seconds": round(seconds, 3),
        "cpu_s": round(cpu, 3),
        "scored_tok_s": round(frame.height / seconds),
        "context_tok_s": round(context / seconds),
        "scored_tok_cpu_s": round(frame.height / cpu),
        "context_tok_cpu_s": round(context / cpu),
    }


def agent(work: Path) -> dict[str, Any]:
    """Train the agent's fixture profile (128 episodes) and replay all of it from its checkpoints."""
    from reference_agent.replay import AgentReplayer
    from reference_agent.train import PROFILES, train

    train(replace(PROFILES["fixture"], seed=0), work / "agent")
    return _time(
        "reference agent (GRU, CPU)",
        _summary(work / "agent"),
        AgentReplayer(str(work / "agent" / "checkpoints" / "v{version}.safetensors")),
    )


def tiny_lm(work: Path, n: int, turn_tokens: int) -> list[dict[str, Any]]:
    """Build the tiny GPT-2, sample n trajectories per version, replay them in-process and over HTTP."""
    from benchmarks.tinylm import build, sample_log, serve

    dirs = build(work / "tinylm")
    log = sample_log(dirs, work / "tinylog", n=n, turn_tokens=turn_tokens)
    traj = _summary(log)
    rows = [_time("tiny GPT-2, transformers in-process", traj, HFReplayer(dirs, batch_size=16))]
    servers = {v: serve(d) for v, d in dirs.items()}
    try:
        urls = {v: url for v, (_, url) in servers.items()}
        rows.append(_time("tiny GPT-2, HTTP prompt_logprobs (loopback)", traj, HTTPReplayer(urls, batch_size=16)))
    finally:
        for server, _ in servers.values():
            server.shutdown()
    return rows


def main() -> None:
    """Run both benchmarks and print a Markdown table."""
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=64, help="per policy version (tiny model)")
    parser.add_argument("--turn-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [agent(Path(tmp)), *tiny_lm(Path(tmp), args.trajectories, args.turn_tokens)]
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
