"""Local workers against Ray workers on one machine, and a scaling model from the measured costs.

    python -m benchmarks.scale [--size 12M] [--fault-share 0.01] [--repeat 2] [--rows-per-share 4096]

Each configuration runs in a fresh subprocess (imports and, for Ray, `ray.init` done before
the clock starts; one warm-up audit, then the median of `--repeat` timed ones):

- local 1 / local 2: `run_audit(discover(path), workers=N, tune=True)` (the CLI's path);
- ray 1 / ray 2: `ray.init(num_cpus=N)`, then `run_audit(..., executor=RayExecutor(...))` with shares of
  `--rows-per-share` rows; the warm-up run also starts the worker processes.

Peak RSS is VmHWM from /proc: of the process for local runs; for Ray of the driver, and of the
largest worker process (`ray::` processes of this session, read after the runs). Every
configuration's findings are compared with local 1 (identical or the script fails).

Per-task costs for the model (measured in-process, no Ray): a share's batch checks per row,
bytes a share reads (compressed column chunks of the columns the audit reads), a partitioned
log check per row, the summary bytes per trajectory that each partitioned and gathered check
keeps, and the driver's log checks per row. `model()` extrapolates them to a 10B-token log.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq

from rollout_audit.frames.views import LogView

from .run import dataset

HERE = Path(__file__).resolve().parent


def _vmhwm(pid: int | str = "self") -> float:
    """Peak resident set of a process in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _ray_workers() -> list[int]:
    """Process ids of this machine's Ray worker processes (`ray::...`)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes().startswith(b"ray::"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _findings(rep) -> list[dict]:
    return sorted(rep.findings.to_dicts(), key=json.dumps)


def child(path: str, mode: str, workers: int, repeat: int, rows_per_share: int, parts: int | None = None) -> dict:
    """One configuration, in this (fresh) process: warm-up, timed runs, peak RSS, findings."""
    from rollout_audit.contract.config import Config
    from rollout_audit.reading.io import discover
    from rollout_audit.running.engine import run_audit

    init = 0.0
    if mode == "ray":
        import ray

        from rollout_audit.running.distributed import RayExecutor

        t0 = time.perf_counter()
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        init = time.perf_counter() - t0

        def once():
            return run_audit(
                discover([path]), Config(), executor=RayExecutor(rows_per_share=rows_per_share, partitions=parts)
            )
    else:

        def once():
            return run_audit(discover([path]), tune=True, workers=workers)

    t0 = time.perf_counter()
    rep = once()
    cold = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        rep = once()
        times.append(time.perf_counter() - t0)
    out = {
        "mode": mode,
        "workers": workers,
        "parts": parts,
        "init_s": round(init, 2),
        "first_s": round(cold, 2),
        "median_s": round(statistics.median(times), 2),
        "times": [round(t, 2) for t in times],
        "rss_mb": round(_vmhwm(), 1),
        "findings": _findings(rep),
        "rows": rep.summary["rows_read"],
        "tokens": rep.summary["tokens_read"],
    }
    if mode == "ray":
        out["worker_rss_mb"] = round(max((_vmhwm(p) for p in _ray_workers()), default=0.0), 1)
        out["task_overhead_ms"] = round(_task_overhead() * 1e3, 2)
        import ray

        ray.shutdown()
    return out


def _task_overhead(n: int = 200) -> float:
    """Seconds per Ray task round trip (submit, schedule, run nothing, get), with `n` in flight."""
    import ray

    noop = ray.remote(lambda: None)
    ray.get([noop.remote() for _ in range(20)])
    t0 = time.perf_counter()
    ray.get([noop.remote() for _ in range(n)])
    return (time.perf_counter() - t0) / n


def costs(path: str, rows_per_share: int, parts: int = 8) -> dict:
    """CPU seconds of each kind of task of a Ray audit, measured in this process without Ray (the
    work a task does, minus transport), in process CPU time (`time.process_time`: all threads,
    so other jobs on a shared machine do not inflate it), the least of three passes; the
    driver's own work on the outcomes; and the bytes each stage hands on. `parts` partitions."""
    import polars as pl

    from rollout_audit.contract.config import Config
    from rollout_audit.reading.batches import shares
    from rollout_audit.reading.io import discover
    from rollout_audit.reading.read import read_updates
    from rollout_audit.running import distributed as D
    from rollout_audit.running.runner import Runner, plan

    disc = discover([path])
    cfg = Config()
    runner = Runner(cfg)
    for f in disc.files:
        runner.declare(f.schema.metadata)
    keyed, by_update = D._keyed(runner)
    routed = tuple(c for k in keyed if k.key == D._ID for c in k.codes if D._reads_updates(runner.rules[c]))
    kept = [r for r in runner.log_rules if not r.partition]
    gather = frozenset(q for r in kept for q in r.reads) if kept else None
    job = D.Job(
        cfg, None, None, None, dict(runner.declared), plan(runner), 2048, gather, keyed, by_update, parts, routed
    )
    units = shares(disc.of_kind("trajectories"), rows_per_share)

    def best(fn):
        out, t = None, float("inf")
        for _ in range(3):
            t0 = time.process_time()
            out = fn()
            t = min(t, time.process_time() - t0)
        return out, t

    updates, t_updates = best(lambda: read_updates(disc.of_kind("updates"), [], cfg.max_row_group_bytes))
    assert updates is not None

    D.check_share(job, units[0], 0)  # warm-up (imports, first polars plans)
    results, t_share = best(lambda: [D.check_share(job, u, i) for i, u in enumerate(units)])
    rows = sum(r[0]["rows"] for r in results)
    tokens = sum(r[0]["tokens"] for r in results)
    schema: dict = {}
    for r in results:
        schema.update({k: v for k, v in r[0]["schema"].items() if k not in schema})
    out: dict = {
        "shares": len(units),
        "rows": rows,
        "tokens": tokens,
        "parts": parts,
        "updates": updates.height,
        "members": int(updates["trajectory_ids"].list.len().sum()),
        "share_cpu_s_per_mtok": t_share / tokens * 1e6,
        "read_bytes_per_token": _bytes_read(disc.of_kind("trajectories"), job.plan.columns) / tokens,
        "update_bytes_per_row": updates.estimated_size() / rows,
        "update_read_cpu_s_per_mb": t_updates / updates.estimated_size() * 1e6,
        "groups": sum(1 for k in job.keyed if any(c not in routed for c in k.codes)),
    }
    outcomes: dict = {}
    keyed_cpu = 0.0
    for g, k in enumerate(job.keyed):
        pieces = [[r[2 + g * parts + i] for r in results] for i in range(parts)]
        out[f"key_{'+'.join(k.key)}_bytes_per_row"] = sum(x.estimated_size() for p in pieces for x in p) / rows
        codes = tuple(c for c in k.codes if c not in routed)
        if not codes:
            continue
        kk = replace(k, codes=codes)
        sub = D._sub(schema, k.reads)
        got, t = best(lambda kk=kk, sub=sub, pieces=pieces: [D.check_partition(job, kk, sub, *p) for p in pieces])
        keyed_cpu += t
        for code in codes:
            outcomes[code] = [o[code] for o in got if o is not None]
    out["keyed_cpu_s_per_mrow"] = keyed_cpu / rows * 1e6
    chunks = range(0, updates.height, D.UPDATES_PER_TASK)
    members, t = best(lambda: [D.split_members(updates.slice(lo, D.UPDATES_PER_TASK), lo, parts) for lo in chunks])
    members = [m if isinstance(m, list) else [m] for m in members]
    out["split_cpu_s_per_mmember"] = t / out["members"] * 1e6
    idx = pl.int_range(pl.len(), dtype=pl.Int64)
    steps = updates.select(idx.alias("_u"), "update_step", pl.lit(None, pl.List(pl.String)).alias("trajectory_ids"))
    route = job.keyed[job.route]
    sub = D._sub(schema, route.reads)
    base = 2 + job.route * parts
    routed_out, t = best(
        lambda: [
            D.route(job, sub, steps, len(results), *[r[base + i] for r in results], *[m[i] for m in members])
            for i in range(parts)
        ]
    )
    out["route_cpu_s_per_mrow"] = t / rows * 1e6
    for code in routed:
        outcomes[code] = [o[-1][code] for o in routed_out if o[-1] is not None]
    last = [r[2 + len(job.keyed) * parts] for r in results]
    env = {"broken": [], "update_files": []}
    got, t = best(
        lambda: [
            D.check_updates(
                job, j, sub, {**env, "updates": updates.filter(idx % parts == j)}, len(last), *last,
                *[routed_out[i][j] for i in range(parts)],
            )
            for j in range(parts)
        ]
    )  # fmt: skip
    out["updates_cpu_s_per_mrow"] = t / rows * 1e6
    out["routed_bytes_per_row"] = (
        sum(routed_out[i][j].estimated_size() for i in range(parts) for j in range(parts)) / rows
    )
    for code in by_update:
        outcomes[code] = [o[code] for o in got if o is not None]

    def driver():  # what the driver does with the outcomes: merge them, account for every check
        r = Runner(cfg)
        base_view = LogView(pl.DataFrame(), updates, [])
        swap = {c: (D._replayed(r.rules[c], o), D._sized(base_view, rows)) for c, o in outcomes.items()}
        r.file_inputs = dict(runner_files)
        r.check_log(base_view, unusable=False, swap=swap)
        return r

    runner_files = {}
    for res in results:
        runner_files.update(res[0]["state"]["file_inputs"])
    _, t = best(driver)
    out["driver_merge_cpu_s_per_part"] = t / parts
    return out


def _bytes_read(files, columns) -> int:
    """Compressed bytes of the column chunks the audit reads, over every row group."""
    total = 0
    for f in files:
        md = pq.read_metadata(f.path)
        for rg in range(md.num_row_groups):
            g = md.row_group(rg)
            for c in range(g.num_columns):
                col = g.column(c)
                if col.path_in_schema.split(".")[0] in columns:
                    total += col.total_compressed_size
    return total


def _fit(c1: dict, cp: dict, key: str) -> tuple[float, float]:
    """(CPU s per task, CPU s per row) of a stage, from its total CPU at 1 and at `cp["parts"]` partitions."""
    rows = c1["rows"]
    t1, tp = c1[key] * rows / 1e6, cp[key] * rows / 1e6
    fixed = max(0.0, (tp - t1) / (cp["parts"] - 1))
    return fixed, max(0.0, t1 - fixed) / rows


def refs(shares: float, groups: int, parts: int, splits: float) -> float:
    """Object references the driver owns in one audit: each share's returns, each member split's,
    each routing task's, and one per partition task."""
    return shares * (3 + (groups + 1) * parts) + splits * parts + parts * (parts + 1) + parts * (groups + 1)


def model(c1: dict, cp: dict, overhead_s: float, ref_bytes: float, base_mb: float, tokens: float = 10e9) -> str:
    """A 10B-token log on 8, 64 and 256 nodes of `CORES` cores, from the measured per-task CPU costs."""
    from rollout_audit.running.distributed import MAX_PARTS, UPDATES_PER_TASK

    c = cp
    tok_per_traj = c["tokens"] / c["rows"]
    trajs = tokens / tok_per_traj
    members = c["members"] / c["rows"] * trajs
    updates = c["updates"] / c["rows"] * trajs
    splits = max(1.0, updates / UPDATES_PER_TASK)
    stages = {k: _fit(c1, cp, f"{k}_cpu_s_per_mrow") for k in ("keyed", "route", "updates")}
    g = c["groups"]
    lines = [
        f"Assumptions: nodes of {CORES} cores, each core as fast as one of this machine's; CPU seconds per task "
        f"as measured (batch checks {c['share_cpu_s_per_mtok']:.3f} s per million tokens; per stage a cost per task "
        "and per row, fitted from 1 and "
        f"{cp['parts']} partitions: "
        + ", ".join(f"{k} {f * 1e3:.1f} ms + {r * 1e6:.2f} µs/row" for k, (f, r) in stages.items())
        + f"; member split {c['split_cpu_s_per_mmember']:.2f} s per million members); {tok_per_traj:.0f} tokens and "
        f"{c['members'] / c['rows']:.2f} update members per trajectory as in the benchmark log; shares of 65536 rows, or "
        f"fewer so that there are 4 per core; partitions: one per core, at most {MAX_PARTS} (the default), or at most 32 "
        "(`partitions=32`); the driver pays the "
        f"measured {overhead_s * 1e3:.1f} ms per task (submit, schedule, get), {c['driver_merge_cpu_s_per_part'] * 1e3:.1f} "
        f"ms per partition to merge the outcomes, reads the update records ({c['update_bytes_per_row']:.0f} B per "
        f"trajectory, {c['update_read_cpu_s_per_mb']:.3f} s per MB) and holds {ref_bytes:.0f} B per object reference "
        f"above a {base_mb:.0f} MB base. Every phase is counted one after the other (an upper bound: share "
        "submission overlaps the batch phase).",
        "",
        "| nodes | cores | shares | partitions | batch phase | log checks by key | update stage (split, route, checks) "
        "| driver | total | driver share | driver memory (base + update records + references) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for nodes, cap in ((8, MAX_PARTS), (64, MAX_PARTS), (256, MAX_PARTS), (8, 32), (64, 32), (256, 32)):
        cores = nodes * CORES
        parts = min(cores, cap)
        rows_per_share = min(65536, max(1, trajs / (4 * cores)))
        shares = trajs / rows_per_share
        batch = tokens / 1e6 * c["share_cpu_s_per_mtok"] / cores
        kf, kr = stages["keyed"]
        keyed = (g * parts * kf + trajs * kr) / min(cores, g * parts) if g else 0.0
        rf, rr = stages["route"]
        uf, ur = stages["updates"]
        split = members / 1e6 * c["split_cpu_s_per_mmember"] / min(cores, splits)
        upd = split + (parts * rf + trajs * rr) / min(cores, parts) + (parts * uf + trajs * ur) / min(cores, parts)
        tasks = shares + g * parts + splits + 2 * parts
        upd_mb = c["update_bytes_per_row"] * trajs / 1e6
        driver = tasks * overhead_s + parts * c["driver_merge_cpu_s_per_part"] + upd_mb * c["update_read_cpu_s_per_mb"]
        total = batch + keyed + upd + driver
        ref_mb = refs(shares, g, parts, splits) * ref_bytes / 1e6
        lines.append(
            f"| {nodes} | {cores} | {shares:.0f} | {parts} | {batch:.1f} s | {keyed:.2f} s | {upd:.2f} s | {driver:.1f} s "
            f"| {total:.1f} s | {driver / total:.0%} | {base_mb + upd_mb + ref_mb:.0f} MB ({base_mb:.0f} + {upd_mb:.0f} + "
            f"{ref_mb:.0f}) |"
        )
    return "\n".join(lines)


CORES = 8
WORKER_MB = 0.0  # set from the measured peak worker RSS in main()


def main(argv: list[str] | None = None) -> None:
    global WORKER_MB
    ap = argparse.ArgumentParser(description="local vs Ray workers, and a scaling model")
    ap.add_argument("--size", default="12M")
    ap.add_argument("--fault-share", type=float, default=0.01)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--rows-per-share", type=int, default=4096)
    ap.add_argument("--parts", type=int, default=8, help="partitions of the per-task cost measurement")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "WORKERS", "PARTS"), help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--costs", type=int, metavar="PARTS", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        parts = int(a.child[2]) or None
        print(json.dumps(child(a.path, a.child[0], int(a.child[1]), a.repeat, a.rows_per_share, parts)))
        return
    if a.costs:
        print(json.dumps(costs(a.path, a.rows_per_share, a.costs)))
        return
    path = str(dataset(a.size, a.fault_share))
    rows = []
    for mode, n, parts in (("local", 1, 0), ("local", 2, 0), ("ray", 1, 0), ("ray", 2, 0), ("ray", 2, 64)):
        cmd = [sys.executable, "-m", "benchmarks.scale", "--path", path, "--repeat", str(a.repeat)]
        cmd += ["--rows-per-share", str(a.rows_per_share), "--child", mode, str(n), str(parts)]
        r = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=HERE.parent)
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(f"{mode} {n} ({parts or 'default'} partitions): {rows[-1]['median_s']} s", file=sys.stderr, flush=True)
    ref = rows[0]["findings"]
    for r in rows:
        if r["findings"] != ref:
            raise AssertionError(f"{r['mode']} {r['workers']}: findings differ from local 1")
    cs = []
    for parts in (1, a.parts):
        cmd = [sys.executable, "-m", "benchmarks.scale", "--path", path, "--costs", str(parts)]
        cmd += ["--rows-per-share", str(a.rows_per_share)]
        cs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=HERE.parent).stdout))
    WORKER_MB = max(r.get("worker_rss_mb", 0) for r in rows)
    print(report(a, path, rows, cs))


def report(a, path: str, rows: list[dict], cs: list[dict]) -> str:
    r0, c = rows[0], cs[-1]
    head = (
        f"{Path(path).name}: {r0['rows']} trajectories, {r0['tokens'] / 1e6:.1f}M tokens, "
        f"{len(r0['findings'])} findings, identical in all {len(rows)} configurations; "
        f"{c['shares']} shares of {a.rows_per_share} rows; {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at the end."
    )
    lines = [
        head,
        "",
        "| configuration | median wall (s) | first run (s) | ray.init (s) | peak RSS driver (MB) | peak RSS largest worker (MB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = f"{r['mode']} {r['workers']}" + (f", {r['parts']} partitions" if r.get("parts") else "")
        lines.append(
            f"| {name} | {r['median_s']} | {r['first_s']} | {r['init_s'] or '-'} | {r['rss_mb']} "
            f"| {r.get('worker_rss_mb', '-')} |"
        )
    # the driver's bytes per object reference: its peak with 64 partitions against 2, per reference more
    two, many = rows[3], rows[4]
    splits = max(1.0, c["updates"] / 4096)
    extra = refs(c["shares"], c["groups"], 64, splits) - refs(c["shares"], c["groups"], 2, splits)
    ref_bytes = max(0.0, (many["rss_mb"] - two["rss_mb"]) * 1e6 / extra)
    lines += [
        "",
        f"Driver: {two['rss_mb']} MB at its peak with 2 partitions, {many['rss_mb']} MB with 64: "
        f"{ref_bytes:.0f} B per object reference it owns.",
        "",
    ]
    for cc in cs:
        lines.append(
            f"Measured CPU costs, {cc['parts']} partitions: " + json.dumps({k: round(v, 4) for k, v in cc.items()})
        )
    lines.append("")
    lines.append(model(cs[0], cs[-1], max(r.get("task_overhead_ms", 0) for r in rows) / 1e3, ref_bytes, two["rss_mb"]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
