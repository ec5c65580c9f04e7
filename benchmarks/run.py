"""Speed and memory benchmark of the full default audit against the Parquet read floor.

    python -m benchmarks.run --sizes 12M,50M [--naive-subset 2000] [--check-identical] [--profile] [--rule-times]

For each size, in one run (logs generated under benchmarks/data/ when absent):

- floor: `pyarrow.parquet.read_table(files, columns=<columns the audit reads>)` over the same
  trajectory files, files warm in the page cache (one untimed read first), median of N;
- audit: the audit `rollout-audit check PATH` runs (`cli_audit` below: default configuration,
  allocator tuning on, as in the CLI), and the same audit on one thread (`check --one-thread`),
  N times each. Floor and audits run interleaved in one fresh subprocess (imports, including
  pandera, and one warm-up audit done before the clock starts), so load from other processes
  hits them alike; wall and CPU (process_time, every thread) seconds and the load average are
  recorded per run. The table gives medians of the per-round ratios to the floor (wall and
  CPU), of the cores each used (CPU / wall: the floor decodes on Arrow's pool), and the range of
  the load average: on a machine shared with other jobs wall times stretch, so read the ratios;
- cold: `rollout-audit check PATH` in a fresh process (`benchmarks.coldstart`), imports and all,
  wall and CPU seconds (the child's user + system), median of N;
- peak RSS: a second fresh subprocess runs one audit only and reports VmHWM from
  /proc/self/status (ru_maxrss as fallback), so the floor's table does not count;
- ratio audit/floor (the bar is 1.5; also as CPU-time ratio), tokens/s and
  trajectories/s of the audit;
- naive: a per-trajectory Python loop (`to_pylist` rows; trainable counts, mask provenance,
  log-prob validity, per-turn log-prob sums and counts, shaping and its telescoping, stop
  flags, group degeneracy) timed on a subset and extrapolated: floor + per-trajectory time x N.
  It does fewer checks than the audit, so the speedup flatters the naive loop.

`--check-identical` audits a faulted log three ways — streaming by row group (default),
streaming with batches not aligned to row groups (batch_rows=1000), and in memory in one
batch (`run_audit(..., batch_rows=10**9, tables=...)`) — and asserts the findings are equal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .coldstart import fresh
from .generate import parse_size

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


# ---------------------------------------------------------------- data


def dataset(label: str, fault_share: float = 0.0, data_dir: Path = DATA) -> Path:
    """The directory of a generated log of `label` tokens (`50M`, or `50M:long` for another
    episode shape of `benchmarks.generate.SHAPES`), generated (in a subprocess, so this process
    stays small) when absent."""
    size, _, shape = label.partition(":")
    name = size + (f"-{shape}" if shape else "") + (f"-f{fault_share:g}" if fault_share else "")
    out = data_dir / name
    if not (out / "_generated.json").exists():
        print(f"generating {out} ...", file=sys.stderr, flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.generate",
                "--tokens",
                size,
                "--shape",
                shape or "default",
                "--out",
                str(out),
                "--fault-share",
                str(fault_share),
            ],
            check=True,
            cwd=HERE.parent,
        )
    return out


def _tokens(label: str) -> int:
    return parse_size(label.partition(":")[0])


def trajectory_files(path: Path) -> list[str]:
    from rollout_audit.reading.io import discover

    return [f.path for f in discover([path]).of_kind("trajectories")]


def audited_columns(files: list[str] | None = None) -> list[str]:
    """The trajectory columns the default audit reads (of those the files have, when given)."""
    from rollout_audit.contract.config import Config
    from rollout_audit.running.runner import Runner, plan

    cols = list(plan(Runner(Config())).columns)
    return [c for c in cols if c in pq.read_schema(files[0]).names] if files else cols


# ---------------------------------------------------------------- audit in a fresh process


def _vmhwm_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _imports(pandera: bool = True) -> float:
    """Import the library (and pandera, which S001 loads only for a suspect frame, when `pandera`:
    before any clock starts); the peak RSS so far."""
    import rollout_audit  # noqa: F401
    from rollout_audit import cli  # noqa: F401  (what `rollout-audit check` imports)
    from rollout_audit.checks import all_rules

    if pandera:
        from rollout_audit.contract import models  # noqa: F401
    all_rules()
    return _vmhwm_mb()


def cli_audit(path: str, pipeline: bool = True):
    """The audit exactly as `rollout-audit check PATH` runs it (`pipeline=False`: as
    `check --one-thread` runs it)."""
    from rollout_audit.reading.io import discover
    from rollout_audit.running.engine import run_audit

    return run_audit(discover([path]), tune=True, pipeline=pipeline)


def _child_rss(path: str) -> None:
    """Subprocess: one audit and nothing else, for its peak RSS: imports as the CLI's (pandera
    comes in, 43 MB, only when a frame's values need it)."""
    rss_import = _imports(pandera=False)
    rep = cli_audit(path)
    print(
        json.dumps(
            {
                "peak_rss_mb": _vmhwm_mb(),
                "rss_after_import_mb": rss_import,
                "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "by_severity": rep.summary["by_severity"],
                "counts": rep.summary["counts"],
                "rows": rep.summary["rows_read"],
                "tokens": rep.summary["tokens_read"],
                "not_run": sorted(rep.not_run),
            }
        )
    )


RUNS = ("floor", "audit", "one thread")  # what `_child_time` times, interleaved, in this order


def _child_time(path: str, repeat: int) -> None:
    """Subprocess: the floor read, the audit and the one-thread audit interleaved `repeat` times
    (so that load from other processes on the machine hits all alike); wall and CPU seconds of
    each, and the 1-minute load average when each started."""
    _imports()
    files = trajectory_files(Path(path))
    cols = audited_columns(files)
    pq.read_table(files, columns=cols)  # warm the page cache
    cli_audit(path)  # warm lazy imports and caches
    runs = {
        "floor": lambda: pq.read_table(files, columns=cols),
        "audit": lambda: cli_audit(path),
        "one thread": lambda: cli_audit(path, pipeline=False),
    }
    out: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeat):
        for key in RUNS:
            out[key + " load"].append(os.getloadavg()[0])
            c0, t0 = time.process_time(), time.perf_counter()
            res = runs[key]()
            out[key].append(time.perf_counter() - t0)
            out[key + " cpu"].append(time.process_time() - c0)
            del res
    print(json.dumps(out))


def timing_row(tm: dict[str, list[float]]) -> dict[str, Any]:
    """The table's timing columns from `_child_time`'s runs: medians of the per-run wall and CPU
    ratios to the floor of the same round (each audit is paired with the floor read just before
    it), and of each run's cores used (CPU seconds over wall seconds)."""
    med = statistics.median
    row: dict[str, Any] = {"floor s": med(tm["floor"]), "audit s": med(tm["audit"])}
    for key, name in (("audit", "audit"), ("one thread", "one-thread")):
        row[f"{name}/floor"] = med(a / f for a, f in zip(tm[key], tm["floor"]))
        row[f"CPU {name}/floor"] = med(a / f for a, f in zip(tm[key + " cpu"], tm["floor cpu"]))
    for key, name in (("floor", "floor"), ("audit", "audit"), ("one thread", "one-thread")):
        row[f"cores {name}"] = med(c / w for c, w in zip(tm[key + " cpu"], tm[key]))
    loads = [x for key in RUNS for x in tm[key + " load"]]
    row["load"] = f"{min(loads):.1f}–{max(loads):.1f}"
    return row


def _run_child(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-m", "benchmarks.run", *args], capture_output=True, text=True, cwd=HERE.parent)
    if r.returncode:
        raise RuntimeError(f"benchmark subprocess failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- naive baseline


def naive_audit(rows: list[dict], atol: float = 1e-4, lp_atol: float = 1e-3) -> Counter:
    """The straightforward per-trajectory Python loop (a subset of the audit's checks)."""
    from rollout_audit.contract.schema import stop_reasons

    reasons = stop_reasons()
    found: Counter = Counter()
    groups: dict = defaultdict(list)
    for r in rows:
        src, mask, lps, tt = r["token_source"], r["loss_mask"], r["behavior_logprobs"], r["token_turn"]
        n = len(src)
        if not (len(mask) == len(lps) == len(tt) == len(r["token_ids"]) == n):
            found["S003"] += 1
            continue
        trainable = bad_mask = bad_lp = lp_nonpol = 0
        turn_lp: dict = defaultdict(float)
        turn_np: dict = defaultdict(int)
        for k in range(n):
            s, m, lp = src[k], mask[k], lps[k]
            if m:
                trainable += 1
                if s != 2:
                    bad_mask += 1
                if lp is None or not math.isfinite(lp) or lp > 0:
                    bad_lp += 1
            if s == 2:
                turn_np[tt[k]] += 1
                if lp is not None and math.isfinite(lp):
                    turn_lp[tt[k]] += lp
            elif lp is not None:
                lp_nonpol += 1
        found["M101"] += bad_mask > 0
        found["L201"] += bad_lp > 0
        found["L203"] += lp_nonpol > 0
        found["M103"] += r["num_trainable_tokens"] is not None and r["num_trainable_tokens"] != trainable
        g = r["gamma"] if r["gamma"] is not None else 1.0
        turns = r["turns"] or []
        tel = 0.0
        for t, tr in enumerate(turns):
            found["S004"] += tr["turn_id"] != t
            found["L202"] += tr["logprob"] is not None and abs(tr["logprob"] - turn_lp[t]) > lp_atol
            found["M104"] += tr["num_policy_tokens"] is not None and tr["num_policy_tokens"] != turn_np[t]
            pb, pa_, sh = tr["potential_before"], tr["potential_after"], tr["shaping"]
            if None not in (pb, pa_, sh):
                found["R402"] += abs(g * pa_ - pb - sh) > atol
                tel += g**t * sh
            if t + 1 < len(turns) and turns[t + 1]["potential_before"] != pa_:
                found["R403"] += 1
        if turns and turns[0]["potential_before"] is not None and turns[-1]["potential_after"] is not None:
            want = -turns[0]["potential_before"] + g ** len(turns) * turns[-1]["potential_after"]
            found["R404"] += abs(tel - want) > atol
        flags = [k for k in ("terminated", "truncated", "infra_error") if r[k]]
        found["T301"] += len(flags) != 1
        found["T302"] += len(flags) == 1 and reasons.get(r["stop_reason"]) != flags[0]
        if r["reward"] is not None and r["group_id"] is not None:
            groups[r["group_id"]].append(r["reward"])
    found["G701_degenerate_groups"] = sum(1 for v in groups.values() if len(v) > 1 and len(set(v)) == 1)
    return Counter({k: int(v) for k, v in found.items() if v})


def naive_time(files: list[str], cols: list[str], subset: int) -> tuple[float, int, Counter]:
    """Seconds per trajectory of to_pylist + the naive loop, measured on `subset` rows."""
    pf = pq.ParquetFile(files[0])
    parts, n = [], 0
    for rg in range(pf.num_row_groups):
        parts.append(pf.read_row_group(rg, columns=cols))
        n += parts[-1].num_rows
        if n >= subset:
            break
    tbl = pa.concat_tables(parts).slice(0, subset)
    t0 = time.perf_counter()
    rows = tbl.to_pylist()
    found = naive_audit(rows)
    dt = time.perf_counter() - t0
    return dt / tbl.num_rows, tbl.num_rows, found


# ---------------------------------------------------------------- identical results


def check_identical(path: Path) -> str:
    from rollout_audit.reading.io import discover
    from rollout_audit.running.engine import memory_discovery, run_audit

    disc = discover([path])
    reports = {
        "streaming (row groups)": run_audit(disc),
        "streaming (batch_rows=1000)": run_audit(disc, batch_rows=1000),
    }
    traj = pa.concat_tables([pq.read_table(f.path) for f in disc.of_kind("trajectories")])
    upd = pa.concat_tables([pq.read_table(f.path) for f in disc.of_kind("updates")])
    reports["in memory (one batch)"] = run_audit(memory_discovery(traj, upd), batch_rows=10**9)

    def norm(rep):
        f = rep.findings.drop("file")
        return f.sort(f.columns, nulls_last=True)

    ref_name, ref = next(iter(reports.items()))
    for name, rep in reports.items():
        a, b = norm(ref), norm(rep)
        if not a.equals(b):
            only_a = a.join(b, on=a.columns, how="anti", nulls_equal=True)
            only_b = b.join(a, on=a.columns, how="anti", nulls_equal=True)
            raise AssertionError(
                f"findings differ between {ref_name} ({a.height}) and {name} ({b.height}):\n"
                f"only in {ref_name}:\n{only_a.head(10)}\nonly in {name}:\n{only_b.head(10)}"
            )
        if rep.summary["counts"] != ref.summary["counts"]:
            raise AssertionError(f"summary counts differ: {ref.summary['counts']} vs {rep.summary['counts']}")
    counts = ref.summary["counts"]
    return (
        f"identical findings on {path.name} across {', '.join(reports)}: {ref.findings.height} findings "
        f"{dict(sorted(counts.items()))}"
    )


# ---------------------------------------------------------------- profile


def profile_audit(path: Path, top: int = 25) -> str:
    import cProfile
    import io
    import pstats

    import rollout_audit
    from rollout_audit.contract import models  # noqa: F401

    rollout_audit.audit(path)
    pr = cProfile.Profile()
    pr.enable()
    rollout_audit.audit(path)
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return s.getvalue()


def rule_times(path: Path, repeat: int = 2) -> str:
    """Where the audit's time goes, per check: the main thread's CPU (`time.thread_time`) and the
    wall time (`time.perf_counter`) around each call of the runner's `apply_batch` and
    `apply_log`, summed over `repeat` audits as the CLI runs them, after a warm-up. The wall time
    also counts the work polars and Arrow do on their own threads while the check waits, and
    time the main thread lost to the reading thread's decoding. A value several checks share (the
    flattened token arrays, per-turn sums, prefix digests) is charged to the first check that
    builds it, as in a real run."""
    from rollout_audit.checks import all_rules
    from rollout_audit.running.runner import Runner

    cpu: Counter = Counter()
    wall: Counter = Counter()

    def timed(name: str, key: Any) -> Any:
        orig = getattr(Runner, name)

        def call(self: Any, *args: Any, **kw: Any) -> Any:
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                return orig(self, *args, **kw)
            finally:
                cpu[key(args)] += time.thread_time() - c0
                wall[key(args)] += time.perf_counter() - t0

        return orig, call

    patched = {
        "apply_batch": timed("apply_batch", lambda a: a[0].code),
        "apply_log": timed("apply_log", lambda a: a[0].code),
        "check_batch": timed("check_batch", lambda a: "batch"),
        "check_log": timed("check_log", lambda a: "log"),
    }
    try:
        for name, (_, call) in patched.items():
            setattr(Runner, name, call)
        cli_audit(str(path))
        cpu.clear()
        wall.clear()
        c0, m0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
        for _ in range(repeat):
            cli_audit(str(path))
        proc, main, total = time.process_time() - c0, time.thread_time() - m0, time.perf_counter() - t0
    finally:
        for name, (orig, _) in patched.items():
            setattr(Runner, name, orig)
    scope = {code: r.scope for code, r in all_rules().items()}
    batch_codes = [k for k in cpu if k in scope and scope[k] != "log"]

    def both(c: float, w: float) -> str:
        return f"{1000 * w / repeat:.0f} | {100 * w / total:.1f}% | {1000 * c / repeat:.0f}"

    bc, bw = sum(cpu[k] for k in batch_codes), sum(wall[k] for k in batch_codes)
    rows = [
        ("the audit", proc, total),
        ("batch checks", bc, bw),
        ("batch step besides the checks (batch, summary)", cpu["batch"] - bc, wall["batch"] - bw),
        ("log checks", cpu["log"], wall["log"]),
        (
            "the rest: waiting for the reader, discovery, update records, report",
            main - cpu["batch"] - cpu["log"],
            total - wall["batch"] - wall["log"],
        ),
    ]
    out = [
        f"per audit of {path.name}, mean of {repeat}; the audit's CPU counts every thread",
        "",
        "| what | wall ms | share of wall | main-thread CPU ms |",
        "|---|---:|---:|---:|",
    ]
    out += [f"| {k} | {both(c, w)} |" for k, c, w in rows]
    out += ["", "| check | wall ms | share of wall | main-thread CPU ms |", "|---|---:|---:|---:|"]
    codes = [k for k, _ in wall.most_common() if k in scope and wall[k] / total >= 0.002]
    out += [f"| {k} | {both(cpu[k], wall[k])} |" for k in codes]
    return "\n".join(out)


def check_cpu(path: Path, code: str, n_batches: int = 4, repeat: int = 7) -> str:
    """One check's own main-thread CPU per batch (`time.thread_time`), best and median of
    `repeat` passes over the first `n_batches` batches of `path`: the shared token arrays (and, for
    M110, its token lists) are built before the clock, so what is timed is the check's own passes."""
    from rollout_audit.checks import all_rules
    from rollout_audit.checks.common import token_list
    from rollout_audit.contract.config import Config
    from rollout_audit.frames import native
    from rollout_audit.frames.batch import Batch
    from rollout_audit.frames.views import BatchView, ConfigView
    from rollout_audit.reading.batches import batches
    from rollout_audit.reading.io import discover
    from rollout_audit.running.runner import Runner, plan

    cfg = Config()
    p, rule = plan(Runner(cfg)), all_rules()[code]
    parts = list(batches(discover([path]).of_kind("trajectories"), p.columns, 2048, [], cfg))[:n_batches]
    bs = [Batch(q.table, q.file, q.first_row, q.problems, p.turn_fields, q.sources) for q in parts]
    for b in bs:
        view = BatchView(b, rule)
        b.tokens(view.lists)
        for name in ("loss_stream", "loss_weight") if code == "M110" else ():
            token_list(view, name)
    runs = []
    for _ in range(repeat):
        c0 = time.thread_time()
        for b in bs:
            rule.func(BatchView(b, rule), ConfigView(cfg, rule))
        runs.append((time.thread_time() - c0) * 1000 / len(bs))
    core = "native core" if native.ACTIVE is not None else "numpy path"
    return f"{code} on {path.name}, {core}: {min(runs):.2f} ms per batch (best of {repeat}), median {statistics.median(runs):.2f}"


# ---------------------------------------------------------------- main


def _mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*.parquet")) / 2**20


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="rollout-audit benchmark: audit vs Parquet read floor")
    ap.add_argument("--sizes", default="12M,50M", help="token counts; SIZE:SHAPE for another shape, e.g. 50M:long")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--naive-subset", type=int, default=2000, help="0 to skip the naive baseline")
    ap.add_argument("--fault-share", type=float, default=0.0, help="benchmark faulted logs instead of clean ones")
    ap.add_argument("--check-identical", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile one audit of the largest size")
    ap.add_argument(
        "--rule-times", action="store_true", help="wall and main-thread CPU per check, audit of the largest size"
    )
    ap.add_argument("--check-cpu", metavar="CODE", help="one check's own CPU per batch of the smallest size, and exit")
    ap.add_argument("--data-dir", default=str(DATA))
    ap.add_argument("--child-time", help=argparse.SUPPRESS)
    ap.add_argument("--child-rss", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child_time:
        _child_time(a.child_time, a.repeat)
        return
    if a.child_rss:
        _child_rss(a.child_rss)
        return

    import numpy as np
    import polars as pl

    if a.check_cpu:
        smallest = min((s.strip() for s in a.sizes.split(",") if s.strip()), key=_tokens)
        print(check_cpu(dataset(smallest, a.fault_share, Path(a.data_dir)), a.check_cpu.upper()))
        return
    cols = audited_columns()
    data_dir = Path(a.data_dir)
    labels = [s.strip() for s in a.sizes.split(",") if s.strip()]
    print(
        f"# rollout-audit benchmark — {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"pyarrow {pa.__version__}, polars {pl.__version__}, numpy {np.__version__}"
    )
    print(f"audited columns ({len(cols)}): {', '.join(cols)}\n")
    rows = []
    for label in labels:
        path = dataset(label, a.fault_share, data_dir)
        info = json.loads((path / "_generated.json").read_text())
        files = trajectory_files(path)
        tm = _run_child(["--child-time", str(path), "--repeat", str(a.repeat)])
        au = _run_child(["--child-rss", str(path)])
        cold = fresh(["check", str(path.resolve())], a.repeat, {"this": None})["this"]
        fl = tm["floor"]
        timing = timing_row(tm)
        aud = timing["audit s"]
        ratios = [x / y for x, y in zip(tm["audit"], tm["floor"])]
        n_traj, n_tok = info["trajectories"], info["tokens"]
        naive = speed = None
        found = Counter()
        if a.naive_subset and ":" not in label:  # the naive loop reads the default shape's columns
            per, _, found = naive_time(files, cols, a.naive_subset)
            naive = timing["floor s"] + per * n_traj
            speed = naive / aud
        sev = au["by_severity"]
        rows.append(
            {
                "size": label,
                "trajectories": n_traj,
                "tokens": n_tok,
                "files": len(files),
                "disk MB": _mb(path),
                **timing,
                "cold s": cold["wall s"],
                "cold CPU s": cold["CPU s"],
                "Mtok/s": n_tok / aud / 1e6,
                "ktraj/s": n_traj / aud / 1e3,
                "peak RSS MB": au["peak_rss_mb"],
                "naive s (extrap.)": naive,
                "speedup": speed,
                "E/W/I": f"{sev.get('error', 0)}/{sev.get('warning', 0)}/{sev.get('info', 0)}",
            }
        )
        print(
            f"{label}: floor {[round(x, 3) for x in fl]} s; audit {[round(x, 3) for x in tm['audit']]} s; "
            f"one thread {[round(x, 3) for x in tm['one thread']]} s; "
            f"cold {[round(x, 2) for x in cold['walls']]} s, CPU {[round(x, 2) for x in cold['cpus']]} s; "
            f"paired ratios {[round(x, 2) for x in ratios]}; CPU floor {[round(x, 2) for x in tm['floor cpu']]} "
            f"audit {[round(x, 2) for x in tm['audit cpu']]} one thread {[round(x, 2) for x in tm['one thread cpu']]}; "
            f"load {tm['floor load'] + tm['audit load'] + tm['one thread load']}; "
            f"RSS after imports {au['rss_after_import_mb']:.0f} MB, peak {au['peak_rss_mb']:.0f} MB; "
            f"findings {au['counts']}; not run {au['not_run']}; naive loop found {dict(found)}",
            file=sys.stderr,
            flush=True,
        )

    def fmt(v):
        if v is None:
            return "—"
        if isinstance(v, float):
            return f"{v:.2f}" if v < 100 else f"{v:.0f}"
        return str(v)

    head = list(rows[0])
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        print("| " + " | ".join(fmt(r[h]) for h in head) + " |")
    if len(rows) > 1:
        rss = [r["peak RSS MB"] for r in rows]
        print(
            f"\npeak RSS spread {min(rss):.0f}–{max(rss):.0f} MB "
            f"({(max(rss) / min(rss) - 1) * 100:+.0f}% largest vs smallest; bar: ≤ 800 MB, 200M within 25% of 12M)"
        )
    if a.check_identical:
        share = a.fault_share or 0.01
        smallest = min(labels, key=_tokens)
        print("\n" + check_identical(dataset(smallest, share, data_dir)))
    if a.rule_times:
        largest = max(labels, key=_tokens)
        print(f"\n## Time per check, {largest}\n")
        print(rule_times(dataset(largest, a.fault_share, data_dir)))
    if a.profile:
        largest = max(labels, key=_tokens)
        print(f"\n## cProfile of one audit of {largest}\n")
        print(profile_audit(dataset(largest, a.fault_share, data_dir)))


if __name__ == "__main__":
    main()
