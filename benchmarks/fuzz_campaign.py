"""The long fuzz campaign (outside CI): N mutated logs, each audited by the CLI's `main` in a
worker process; a worker that dies (signal) or stalls is a crash or a hang, and is replaced.

    python benchmarks/fuzz_campaign.py --cases 5000 --workers 2 --out fuzz.jsonl
    python benchmarks/fuzz_campaign.py --kind dumps --cases 5000 --workers 2 --out dumps.jsonl
    python benchmarks/fuzz_campaign.py --kind configs --cases 1000 --workers 2 --out configs.jsonl

`--kind dumps` converts mutated trainer dumps (`check --from`, the six adapters in turn) and
`--kind configs` audits a log under mutated configuration files (inside the log, or `--config`);
each of those cases runs in a fresh process forked from a preloaded server, so its peak memory is
its own: a case over 60 s is a hang, over 2 GB a failure.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _worker(conn) -> None:
    """Audit the cases the parent sends, in this process, as a user's `rollout-audit check`."""
    os.environ.pop("ROLLOUT_AUDIT_DEBUG", None)
    os.environ["ROLLOUT_AUDIT_NO_PROGRESS"] = "1"
    from click.testing import CliRunner
    from fuzzlib import Outcome, build_log, digest, random_case

    from rollout_audit.cli import main
    from rollout_audit.synth import make_log

    records = make_log(n_tasks=2, group_size=2, n_versions=2, seed=5)
    while True:
        seed = conn.recv()
        traj, upd, how, fmt = random_case(seed)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                log = build_log(Path(tmp) / "log", records, traj, upd, how)
            except Exception as e:  # noqa: BLE001 - a harness bug, counted apart from the auditor's
                conn.send({"seed": seed, "exit": None, "fmt": fmt, "problems": ["generator error"], "stderr": repr(e)})
                continue
            before = digest(log)
            r = CliRunner().invoke(main, ["check", str(log), "--format", fmt])
            tb = "" if r.exception is None or isinstance(r.exception, SystemExit) else f"Traceback {r.exception!r}"
            out = Outcome(r.exit_code, r.stdout, r.stderr + tb)
            problems = [p for p in out.problems if fmt == "json" or p != "unparseable JSON"]
            if digest(log) != before:
                problems.append("input written")
        conn.send(
            {
                "seed": seed,
                "exit": r.exit_code,
                "fmt": fmt,
                "problems": problems,
                "stderr": out.stderr[-300:] if problems else "",
            }
        )


class Worker:
    def __init__(self, ctx) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()


def _files_campaign(kind: str, seeds: range, workers: int, timeout: float, fh) -> None:
    """Dumps or configuration files: `workers` cases at once, each in its own forked process."""
    from concurrent.futures import ThreadPoolExecutor

    from fuzzlib import run_config_case, run_dump_case

    from rollout_audit.faults import write_records
    from rollout_audit.synth import make_log

    base = Path(tempfile.mkdtemp(prefix="fuzz-configs-"))
    log = base / "log"
    write_records(log, *make_log(n_tasks=2, group_size=2, n_versions=1, seed=3))

    def one(seed: int) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.time()
            if kind == "dumps":
                out, problems = run_dump_case(seed, Path(tmp), timeout)
            else:
                out, problems = run_config_case(seed, Path(tmp), log, timeout)
            return {
                "seed": seed,
                "exit": out.exit,
                "problems": problems,
                "seconds": round(time.time() - t, 2),
                "peak_mb": round(out.peak_mb),
                "stderr": out.stderr[-300:] if problems else "",
            }

    with ThreadPoolExecutor(workers) as pool:
        for row in pool.map(one, seeds):
            fh.write(json.dumps(row) + "\n")
            fh.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["logs", "dumps", "configs"], default="logs")
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--out", default="fuzz.jsonl")
    a = ap.parse_args()
    if a.kind != "logs":
        t0 = time.time()
        with open(a.out, "w") as fh:
            _files_campaign(a.kind, range(a.first_seed, a.first_seed + a.cases), a.workers, min(a.timeout, 60), fh)
        _summary(a.out, t0)
        return
    ctx = mp.get_context("spawn")
    workers = [Worker(ctx) for _ in range(a.workers)]
    seeds = iter(range(a.first_seed, a.first_seed + a.cases))
    busy: dict[int, tuple[int, float]] = {}  # worker index -> (seed, start)
    t0 = time.time()
    done = 0
    with open(a.out, "w") as fh:

        def record(row: dict) -> None:
            nonlocal done
            fh.write(json.dumps(row) + "\n")
            done += 1

        while True:
            for i, w in enumerate(workers):
                if i not in busy:
                    s = next(seeds, None)
                    if s is not None:
                        w.conn.send(s)
                        busy[i] = (s, time.time())
            if not busy:
                break
            for i in list(busy):
                w, (s, start) = workers[i], busy[i]
                if w.conn.poll(0.05):
                    try:
                        record(w.conn.recv())
                    except EOFError:  # died while answering
                        record({"seed": s, "exit": w.proc.exitcode, "problems": ["crash"]})
                        workers[i] = Worker(ctx)
                    del busy[i]
                elif not w.proc.is_alive():
                    record({"seed": s, "exit": w.proc.exitcode, "problems": ["crash"]})
                    workers[i] = Worker(ctx)
                    del busy[i]
                elif time.time() - start > a.timeout:
                    w.proc.kill()
                    record({"seed": s, "exit": None, "problems": ["hang"]})
                    workers[i] = Worker(ctx)
                    del busy[i]
    _summary(a.out, t0)


def _summary(path: str, t0: float) -> None:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    problems = collections.Counter(p for r in rows for p in r["problems"])
    print(
        json.dumps(
            {
                "cases": len(rows),
                "seconds": round(time.time() - t0, 1),
                "exits": dict(collections.Counter(str(r["exit"]) for r in rows)),
                "problems": dict(problems),
                "failing_seeds": [r["seed"] for r in rows if r["problems"]][:20],
                "max_seconds": max((r.get("seconds", 0) for r in rows), default=0),
                "max_peak_mb": max((r.get("peak_mb", 0) for r in rows), default=0),
            }
        )
    )


if __name__ == "__main__":
    main()
