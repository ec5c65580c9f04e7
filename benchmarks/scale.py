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
    ex = None
    if mode == "ray":
        import ray

        from rollout_audit.running.distributed import RayExecutor

        t0 = time.perf_counter()
        for attempt in range(3):  # Ray gives its raylet 30 s to start: not always enough on a loaded machine
            try:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
                break
            except Exception as exc:  # Ray raises a bare Exception for this
                if "timed out during startup" not in str(exc) or attempt == 2:
                    raise
                ray.shutdown()
        init = time.perf_counter() - t0

        ex = RayExecutor(rows_per_share=rows_per_share, partitions=parts)

        def once():
            return run_audit(discover([path]), Config(), executor=ex)
    else:

        def once():
            return run_audit(discover([path]), tune=True, workers=workers)

    t0 = time.perf_counter()
    rep = once()
    cold = time.perf_counter() - t0
    times, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        rep = once()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    out = {
        "mode": mode,
        "workers": workers,
        "parts": parts,
        "init_s": round(init, 2),
        "first_s": round(cold, 2),
        "median_s": round(statistics.median(times), 2),
        "times": [round(t, 2) for t in times],
        "cpu_s": round(statistics.median(cpu), 2),  # this process's CPU (for Ray: the driver's)
        "rss_mb": round(_vmhwm(), 1),
        "findings": _findings(rep),
        "rows": rep.summary["rows_read"],
        "tokens": rep.summary["tokens_read"],
    }
    if mode == "ray":
        out["worker_rss_mb"] = round(max((_vmhwm(p) for p in _ray_workers()), default=0.0), 1)
        out["peak_refs"] = ex.peak_refs if ex is not None else None
        out["task_s"] = _task_overhead()
        out["push_s"] = _push_overhead()
        out["task_bytes"] = _task_bytes()
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


def _push_overhead(n: int = 400) -> float:
    """Seconds a store actor takes per call (`Store.put` of a one-row piece from a Ray task;
    the calls submitted back to back, so that the store's own service time is measured, not
    one round trip's latency)."""
    import polars as pl
    import ray

    from rollout_audit.running.distributed import Store

    store = ray.remote(Store).options(num_cpus=0).remote()
    piece = pl.DataFrame({"a": [1]})

    def pusher(store, k: int) -> float:
        t0 = time.perf_counter()
        ray.get([store.put.remote("x", [(0, "x", i, piece)]) for i in range(k)])
        return (time.perf_counter() - t0) / k

    task = ray.remote(pusher)
    ray.get(task.remote(store, 20))
    out = ray.get(task.remote(store, n))
    ray.kill(store)
    return out


def _rss() -> float:
    """Resident set of this process in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0.0


def _task_bytes(n: int = 4000) -> float:
    """Bytes of the driver's memory per finished task whose two returns it still references."""
    import gc

    import ray

    noop = ray.remote(lambda: (None, None)).options(num_returns=2)
    gc.collect()
    before = _rss()
    held = [noop.remote() for _ in range(n)]
    ray.get([h[0] for h in held])
    gc.collect()
    return (_rss() - before) / n


def costs(path: str, rows_per_share: int, parts: int = 8) -> dict:
    """CPU seconds of each kind of task of a Ray audit, measured in this process without Ray (the
    work a task does, the pushes to its partitions' store included, minus transport), in process
    CPU time (`time.process_time`: all threads, so other jobs on a shared machine do not inflate
    it), the least of three passes; the driver's own work on the outcomes; and the bytes each
    stage hands on. `parts` partitions, held by one `Store` object of this process."""
    import polars as pl

    from rollout_audit.contract.config import Config
    from rollout_audit.reading.batches import shares
    from rollout_audit.reading.io import discover
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
    stores = D.Stores("costs", (D.Store(),))
    held = stores.actors[0].held

    def best(fn):
        out, t = None, float("inf")
        for _ in range(3):
            t0 = time.process_time()
            out = fn()
            t = min(t, time.process_time() - t0)
        return out, t

    def stored(kind: str) -> int:
        return sum(x.estimated_size() for (_, _, k), got in held.items() if k == kind for x in got.values())

    chunks = D._chunks(disc.of_kind("updates"))
    read, t_updates = best(lambda: [D.read_updates_task(job, c, files, stores) for c, files in enumerate(chunks)])
    D.check_share(job, units[0], 0, stores)  # warm-up (imports, first polars plans)
    results, t_share = best(lambda: [D.check_share(job, u, i, stores) for i, u in enumerate(units)])
    rows = sum(r[0]["rows"] for r in results)
    tokens = sum(r[0]["tokens"] for r in results)
    schema: dict = {}
    for r in results:
        schema.update({k: v for k, v in r[0]["schema"].items() if k not in schema})
    columns = [pl.DataFrame(schema=s) for got in read for _, s in got["schemas"]]
    updates = pl.concat(columns, how="diagonal_relaxed")
    n_updates = sum(n for got in read for _, n in got["counts"])
    out: dict = {
        "shares": len(units),
        "rows": rows,
        "tokens": tokens,
        "parts": parts,
        "updates": n_updates,
        "members": sum(x.height for (_, _, k), got in held.items() if k == "members" for x in got.values()),
        "share_cpu_s_per_mtok": t_share / tokens * 1e6,
        "read_bytes_per_token": _bytes_read(disc.of_kind("trajectories"), job.plan.columns) / tokens,
        "update_bytes_per_row": stored("updates") / rows,
        "groups": sum(1 for k in job.keyed if any(c not in routed for c in k.codes)),
    }
    out["update_read_cpu_s_per_mmember"] = t_updates / out["members"] * 1e6
    outcomes: dict = {}
    keyed_cpu = 0.0
    for g, k in enumerate(job.keyed):
        out[f"key_{'+'.join(k.key)}_bytes_per_row"] = stored(f"key{g}") / rows
        codes = tuple(c for c in k.codes if c not in routed)
        if not codes:
            continue
        sub = D._sub(schema, k.reads)
        kinds = (f"key{g}",)
        taken = [stores.take(i, kinds, kinds) for i in range(parts)]  # kept: the pieces are measured again
        got, t = best(lambda codes=codes, sub=sub, taken=taken: [D.check_partition(job, codes, sub, x) for x in taken])
        keyed_cpu += t
        for code in codes:
            outcomes[code] = [o[code] for o in got if o is not None]
    out["keyed_cpu_s_per_mrow"] = keyed_cpu / rows * 1e6
    out["members_bytes_per_row"] = stored("members") / rows
    steps = {"listed": "trajectory_ids" in updates.columns, "dtype": updates.schema.get("update_step"), "first": {}}
    sub = D._sub(schema, job.keyed[job.route].reads)
    kinds = (f"key{job.route}", "members")
    taken = [stores.take(i, kinds, kinds) for i in range(parts)]
    routed_out, t = best(lambda: [D.route(job, sub, steps, i, stores, taken[i]) for i in range(parts)])
    out["route_cpu_s_per_mrow"] = t / rows * 1e6
    for code in routed:
        outcomes[code] = [o[code] for o in routed_out if o is not None]
    env = {"columns": dict(updates.schema), "broken": [], "update_files": []}
    kinds = ("last", "routed", "updates")
    taken = [stores.take(j, kinds, kinds) for j in range(parts)]
    got, t = best(lambda: [D.check_updates(job, j, sub, env, taken[j]) for j in range(parts)])
    out["updates_cpu_s_per_mrow"] = t / rows * 1e6
    out["routed_bytes_per_row"] = stored("routed") / rows
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


def tasks_held(shares: float, update_tasks: float, groups: int, parts: int) -> float:
    """Tasks whose references the driver holds at once in one audit: the share tasks, the
    update-reading tasks, a task per key and partition, a routing and an update task per partition."""
    return shares + update_tasks + parts * (groups + 2)


def model(c1: dict, cp: dict, ray_costs: dict, base_mb: float, tokens: float = 10e9) -> str:
    """A 10B-token log on 8, 64 and 256 nodes of `CORES` cores, from the measured per-task CPU
    costs (`c1`, `cp`: at 1 and at `cp["parts"]` partitions) and Ray's measured costs per task,
    per store call and per task the driver holds (`ray_costs`)."""
    from rollout_audit.running.distributed import MAX_PARTS, UPDATES_PER_TASK

    c = cp
    overhead_s, push_s, task_bytes = ray_costs["task_s"], ray_costs["push_s"], ray_costs["task_bytes"]
    tok_per_traj = c["tokens"] / c["rows"]
    trajs = tokens / tok_per_traj
    members = c["members"] / c["rows"] * trajs
    updates = c["updates"] / c["rows"] * trajs
    update_tasks = max(1.0, updates / UPDATES_PER_TASK)
    stages = {k: _fit(c1, cp, f"{k}_cpu_s_per_mrow") for k in ("keyed", "route", "updates")}
    g = c["groups"]
    held = sum(
        v for k, v in c.items() if k.startswith("key_") or k in ("members_bytes_per_row", "routed_bytes_per_row")
    )
    held += c["update_bytes_per_row"]
    lines = [
        f"Assumptions: nodes of {CORES} cores, each core as fast as one of this machine's; CPU seconds per task "
        f"as measured (batch checks {c['share_cpu_s_per_mtok']:.3f} s per million tokens; reading the update records "
        f"and cutting their batch members {c['update_read_cpu_s_per_mmember']:.2f} s per million members; per stage a "
        "cost per task and per row, fitted from 1 and "
        f"{cp['parts']} partitions: "
        + ", ".join(f"{k} {f * 1e3:.1f} ms + {r * 1e6:.2f} µs/row" for k, (f, r) in stages.items())
        + f"); {tok_per_traj:.0f} tokens and {c['members'] / c['rows']:.2f} batch members per trajectory as in the "
        f"benchmark log; the update records in files of at most {UPDATES_PER_TASK} records (a task reads "
        f"{UPDATES_PER_TASK} records' worth of whole files: one larger file is one task); shares of 65536 rows, or fewer so that there are 4 per core (or 1); partitions: one per core, at most "
        f"{MAX_PARTS} (the default); one store per node. Each share task pushes its pieces to every store (one call "
        "each, counted in the batch phase), and each store takes every share task's, update reader's and routing task's "
        f"call one after another: {push_s * 1e3:.2f} ms per call as measured (calls submitted back to back from a task); "
        "counted after the batch phase (an upper bound: the calls arrive while shares finish). The driver pays"
        f" the measured {overhead_s * 1e3:.1f} ms per task (submit, schedule, "
        f"get) and {c['driver_merge_cpu_s_per_part'] * 1e3:.1f} ms per partition to merge the outcomes, and holds "
        f"{task_bytes / 1e3:.1f} KB per task whose references it keeps (measured: tasks of two returns held) above a "
        f"{base_mb:.0f} MB base. A store's memory is every piece pushed to it (an upper bound of its peak: a store "
        "forgets a piece once its task has taken it, but the pieces by trajectory id). Every phase is counted one "
        "after the other.",
        "",
        "| nodes | cores | shares per core | shares | partitions | batch phase | stores take the pieces | log checks by key "
        "| update stage (read, route, checks) | driver | total | driver share | driver memory (base + tasks) "
        "| store memory per node |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for per_core, nodes in ((4, 8), (4, 64), (4, 256), (1, 8), (1, 64), (1, 256)):
        cores = nodes * CORES
        parts = min(cores, MAX_PARTS)
        rows_per_share = min(65536, max(1, trajs / (per_core * cores)))
        shares = trajs / rows_per_share
        batch = (tokens / 1e6 * c["share_cpu_s_per_mtok"] + shares * nodes * push_s) / cores
        stores = (shares + update_tasks + parts) * push_s
        kf, kr = stages["keyed"]
        keyed = (g * parts * kf + trajs * kr) / min(cores, g * parts) if g else 0.0
        rf, rr = stages["route"]
        uf, ur = stages["updates"]
        read = members / 1e6 * c["update_read_cpu_s_per_mmember"] / min(cores, update_tasks)
        upd = read + (parts * rf + trajs * rr) / min(cores, parts) + (parts * uf + trajs * ur) / min(cores, parts)
        tasks = tasks_held(shares, update_tasks, g, parts)
        driver = tasks * overhead_s + parts * c["driver_merge_cpu_s_per_part"]
        total = batch + stores + keyed + upd + driver
        task_mb = tasks * task_bytes / 1e6
        lines.append(
            f"| {nodes} | {cores} | {per_core} | {shares:.0f} | {parts} | {batch:.1f} s | {stores:.1f} s | {keyed:.2f} s "
            f"| {upd:.2f} s | {driver:.1f} s | {total:.1f} s | {driver / total:.0%} "
            f"| {base_mb + task_mb:.0f} MB ({base_mb:.0f} + {task_mb:.0f}) | {held * trajs / nodes / 1e6:.0f} MB |"
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
    ap.add_argument(
        "--driver-sizes", help="only the driver's peak and share on a local cluster, at each size (e.g. 12M,50M)"
    )
    a = ap.parse_args(argv)
    if a.driver_sizes:
        print(driver_table(a))
        return
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


def _run_child(path: str, a, mode: str, n: int, parts: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.scale", "--path", path, "--repeat", str(a.repeat)]
    cmd += ["--rows-per-share", str(a.rows_per_share), "--child", mode, str(n), str(parts)]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=HERE.parent)
    return json.loads(r.stdout.strip().splitlines()[-1])


def driver_table(a) -> str:
    """The Ray driver at several log sizes: its peak RSS, its CPU over the audit (its share of
    the wall time), the references it held at its fullest; findings equal to a local audit."""
    lines = [
        "| log | trajectories | tokens | shares | local 1 (s) | ray 2 wall (s) | driver CPU (s) | driver share "
        "| driver peak RSS (MB) | largest worker (MB) | references held at the fullest | findings | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    children = []
    for size in a.driver_sizes.split(","):
        path = str(dataset(size, a.fault_share))
        local = _run_child(path, a, "local", 1, 0)
        ray_ = _run_child(path, a, "ray", 2, 0)
        children.append((path, ray_))
        if ray_["findings"] != local["findings"]:
            raise AssertionError(f"{size}: Ray findings differ from the local audit")
        shares = -(-ray_["rows"] // a.rows_per_share)
        lines.append(
            f"| {Path(path).name} | {ray_['rows']} | {ray_['tokens']} | {shares} | {local['median_s']} "
            f"| {ray_['median_s']} | {ray_['cpu_s']} | {ray_['cpu_s'] / ray_['median_s']:.0%} | {ray_['rss_mb']} "
            f"| {ray_['worker_rss_mb']} | {ray_['peak_refs']} | {len(ray_['findings'])}, identical "
            f"| {os.getloadavg()[0]:.1f} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    # the model from the smallest log's per-task CPU costs and Ray's costs measured by its children
    path, smallest = min(children, key=lambda c: c[1]["rows"])
    cs = []
    for parts in (1, a.parts):
        cmd = [sys.executable, "-m", "benchmarks.scale", "--path", path, "--costs", str(parts)]
        cmd += ["--rows-per-share", str(a.rows_per_share)]
        cs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=HERE.parent).stdout))
    ray_costs = {k: max(r[k] for _, r in children) for k in ("task_s", "push_s", "task_bytes")}
    lines += ["", "Ray's costs measured here: " + json.dumps({k: round(v, 6) for k, v in ray_costs.items()}), ""]
    lines.append(model(cs[0], cs[-1], ray_costs, max(r["rss_mb"] for _, r in children)))
    return "\n".join(lines)


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
    two, many = rows[3], rows[4]
    ray_costs = {k: max(r.get(k, 0) for r in rows) for k in ("task_s", "push_s", "task_bytes")}
    lines += [
        "",
        f"Driver: {two['rss_mb']} MB at its peak with 2 partitions, {many['rss_mb']} MB with 64; object references "
        f"it held at its fullest (Ray's reference table): {two['peak_refs']} with 2 partitions, {many['peak_refs']} "
        f"with 64. Measured with Ray: {ray_costs['task_s'] * 1e3:.2f} ms per task round trip, "
        f"{ray_costs['push_s'] * 1e3:.2f} ms per call a store takes, {ray_costs['task_bytes']:.0f} B of "
        "driver memory per task held.",
        "",
    ]
    for cc in cs:
        lines.append(
            f"Measured CPU costs, {cc['parts']} partitions: " + json.dumps({k: round(v, 4) for k, v in cc.items()})
        )
    lines.append("")
    lines.append(model(cs[0], cs[-1], ray_costs, two["rss_mb"]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
