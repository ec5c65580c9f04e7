"""A log of many tiny files against the same rows in one file.

    python -m benchmarks.tinyfiles [--files 3000] [--out /tmp/tinyfiles] [--repeat 1] [--profile] [--reuse]

Writes a compliant `rollout_audit.synth.make_log` log twice under `--out`: `one/` with every
trajectory in one file (written with `RolloutWriter`) and `many/` with one trajectory per file
(the rows of `one/`, one per file, with its schema and metadata); both share one update file.
Then times `rollout-audit check DIR` on each in a fresh subprocess (wall clock, the median of `--repeat`), and checks that both audits
give the same findings (the file names aside). `--profile` prints a cProfile of the audit of
`many/` instead (the top 40 functions by cumulative time).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq


def write_logs(out: Path, n_files: int) -> tuple[Path, Path]:
    """`out/many` (one trajectory per file) and `out/one` (the same in one file)."""
    from rollout_audit import RolloutWriter
    from rollout_audit.synth import make_log

    group = 8
    trajs, updates = make_log(n_tasks=max(1, n_files // group), group_size=group, n_versions=1, seed=3)
    trajs = trajs[:n_files]
    kept = {t["trajectory_id"] for t in trajs}
    for u in updates:  # an update names only trajectories the log holds
        keep = [i for i, t in enumerate(u["trajectory_ids"]) if t in kept]
        u["trajectory_ids"] = [u["trajectory_ids"][i] for i in keep]
        u["advantages"] = [u["advantages"][i] for i in keep]
    many, one = out / "many", out / "one"
    for d in (many, one):
        shutil.rmtree(d, ignore_errors=True)
        with RolloutWriter(d / "updates" / "updates.parquet", kind="updates") as w:
            w.write(updates)
    with RolloutWriter(one / "trajectories" / "part-00000.parquet") as w:
        w.write(trajs)
    table = pq.read_table(one / "trajectories" / "part-00000.parquet")
    (many / "trajectories").mkdir(parents=True)
    for i in range(table.num_rows):  # the writer's schema and metadata, without its fsync per file
        pq.write_table(table.slice(i, 1), many / "trajectories" / f"part-{i:05d}.parquet")
    return many, one


def timed_check(log: Path) -> tuple[float, dict]:
    """Wall-clock seconds of `rollout-audit check LOG --format json` in a fresh process, and its report."""
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "rollout_audit.cli", "check", str(log), "--format", "json"],
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"check {log} exited {r.returncode}: {r.stderr[-2000:]}")
    return took, json.loads(r.stdout)


def findings(report: dict) -> list[tuple]:
    return sorted((f["code"], f["trajectory_id"], f["turn"], f["position"]) for f in report["findings"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--out", default="/tmp/tinyfiles")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="audit the logs a previous run wrote under --out")
    a = ap.parse_args()
    out = Path(a.out)
    many, one = (out / "many", out / "one") if a.reuse else write_logs(out, a.files)
    if a.profile:
        import cProfile
        import pstats

        from rollout_audit import audit

        cProfile.runctx("audit(many)", {"audit": audit, "many": many}, {}, str(Path(a.out) / "audit.prof"))
        pstats.Stats(str(Path(a.out) / "audit.prof")).sort_stats("cumulative").print_stats(40)
        return
    times: dict[str, list[float]] = {"many": [], "one": []}
    reports: dict[str, dict] = {}
    for _ in range(a.repeat):
        for name, log in (("many", many), ("one", one)):
            took, reports[name] = timed_check(log)
            times[name].append(took)
    same = findings(reports["many"]) == findings(reports["one"])
    for name, log in (("many", many), ("one", one)):
        n = len(list((log / "trajectories").iterdir()))
        print(f"{name}: {n} trajectory files, check {statistics.median(times[name]):.2f} s (median of {a.repeat})")
    print(f"findings identical: {same} ({len(reports['many']['findings'])} findings)")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
