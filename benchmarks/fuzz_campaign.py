"""The long fuzz campaign (outside CI): mutated logs, trainer dumps or configuration files, each
audited through the CLI's `main` as a user's `rollout-audit check` runs it.

    nice -n 19 python benchmarks/fuzz_campaign.py --kind dumps --cases 5000 --out dumps.jsonl
    nice -n 19 python benchmarks/fuzz_campaign.py --kind configs --cases 1000 --out configs.jsonl
    nice -n 19 python benchmarks/fuzz_campaign.py --kind logs --cases 1000 --out logs.jsonl
    nice -n 19 python benchmarks/fuzz_campaign.py --kind workflow --cases 2400 --out workflow.jsonl
    nice -n 19 python benchmarks/fuzz_campaign.py --kind evidence --cases 480 --out evidence.jsonl
    nice -n 19 python benchmarks/fuzz_campaign.py --kind round5 --cases 10200 --out round5.jsonl
    nice -n 19 python benchmarks/fuzz_campaign.py --kind round6 --cases 3000 --out round6.jsonl
    nice -n 19 python benchmarks/fuzz_campaign.py --kind round7 --cases 10800 --out round7.jsonl
    python benchmarks/fuzz_campaign.py --table round7.jsonl                     # outcomes per surface
    python benchmarks/fuzz_campaign.py --kind dumps --isolate --seeds 341,887   # confirm a finding
    python benchmarks/fuzz_campaign.py --kind dumps --write 341 /tmp/case       # the case's files and command

`--kind dumps` converts a mutated trainer dump (`check --from`; the six adapters in turn, from
their fixtures, as JSON Lines or Parquet); `--kind configs` audits a small log under a mutated
configuration (inside the log, or `--config`); `--kind logs` audits a log with Arrow-level
mutations; `--kind workflow` runs the workflow commands in turn (a baseline file mutated,
`diff` of two mutated logs, `filter` then `check OUT`, `watch` with a writer process,
`convert` of a mutated dump then `check OUT`, a configuration at every depth of a log with the
log named at every depth), where an exit 0 that the follow-up contradicts is a silent pass;
`--kind evidence` mutates the contract 1.3 evidence of the framework fixtures that carry it (expert
routes, loss weights, overlong penalties: `fuzzlib.EVIDENCE`, in turn, with the context their page
documents, sometimes made hostile) and runs `check --from`, or `convert` then `check OUT`;
`--kind round5` runs `fuzzlib.prepare_round5` (replay of mutated logs by a numpy replayer under a
random replay_max_bytes and compare_logprobs, token ids against a declared vocabulary, a killed
writer's hidden leftovers, `convert` to a symlink, a dump path like a replacement template, and
the evidence cases); `--kind round6` runs `fuzzround6.prepare_round6` (the recorder's HTTP input and
its records, the capture-layer readers' formats, the verl V1 trainer record, files under audit that
try to weaken it); `--kind round7` runs `fuzzround6.prepare_round7` (those surfaces again with more SQLite
and msgpack shapes, the `--calls` join, every integration's dump). A case is a seed: the same seed is the
same files (a recording's ports and times aside). `--table FILE` prints a campaign's outcomes per surface
(`OUTCOMES`: traceback, internal error, abort, hang, silent pass, input written, memory over the bound).

By default a long-lived worker process runs the cases one after another in-process (the imports
are paid once), each with file descriptors 1 and 2 sent to files, its peak resident memory measured
on its own (`/proc/self/clear_refs`), its address space capped (`--memory-mb` above what the warm
worker already maps) and an alarm at `--timeout` seconds whose default action ends the worker; a fatal signal, or a case still
running a second before its alarm, leaves every thread's stack in the case's `stderr.txt` in the
worker's scratch directory (`/tmp/fuzz-worker-*/case-SEED/`).
The parent restarts a worker that dies or stops answering and records that case as a failure.
`--isolate` runs each case in a fresh process forked from a preloaded server instead (the mode of
the tests), to confirm a finding.

A case fails on: a traceback, an "internal error", an exit outside {0, 1, 2}, a hang, a peak over
2 GB, an input whose bytes changed, a temporary file left behind, JSON output that does not parse,
or an exit 2 whose message is not one line naming the input (the dump file; the configuration
file or the log). One JSON line per case goes to `--out`; the summary to stdout.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import multiprocessing as mp
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PEAK_LIMIT_MB = 2048
WORKFLOW_KINDS = ("workflow", "evidence", "round5", "round6", "round7")  # cases judged with their follow-ups


def _vm_size() -> int:
    """This process's mapped address space, bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class _Cases:
    """Writes the case of a seed under a directory (what a case needs is built once per worker)."""

    def __init__(self, kind: str, scratch: Path) -> None:
        self.kind = kind
        self.records = self.log = None
        if kind in ("logs", "configs", "workflow", "round5"):
            from rollout_audit.synth import make_log

            if kind in ("logs", "workflow", "round5"):
                self.records = make_log(n_tasks=2, group_size=2, n_versions=2, seed=5)
            else:
                from rollout_audit.faults import write_records

                self.log = scratch / "base-log"
                write_records(self.log, *make_log(n_tasks=2, group_size=2, n_versions=1, seed=3))

    def write(self, seed: int, work: Path):
        from fuzzlib import prepare_config, prepare_dump, prepare_log, prepare_workflow

        if self.kind == "workflow":
            return prepare_workflow(seed, work, self.records)
        if self.kind == "round5":
            from fuzzlib import prepare_round5

            return prepare_round5(seed, work, self.records)
        if self.kind == "round6":
            from fuzzround6 import prepare_round6

            return prepare_round6(seed, work)
        if self.kind == "round7":
            from fuzzround6 import prepare_round7

            return prepare_round7(seed, work)
        if self.kind == "evidence":
            from fuzzlib import prepare_evidence

            return prepare_evidence(seed, work)
        if self.kind == "dumps":
            return prepare_dump(seed, work)
        if self.kind == "configs":
            return prepare_config(seed, work, self.log)
        return prepare_log(seed, work, self.records)


def label(kind: str, seed: int) -> str:
    """The case's adapter, configuration place or output format, without writing it."""
    from fuzzlib import FRAMEWORKS, config_case, random_case

    if kind == "dumps":
        return FRAMEWORKS[seed % len(FRAMEWORKS)]
    if kind == "workflow":
        from fuzzlib import WORKFLOW

        return WORKFLOW[seed % len(WORKFLOW)]
    if kind == "round5":
        from fuzzlib import ROUND5

        return ROUND5[seed % len(ROUND5)]
    if kind == "round6":
        from fuzzround6 import ROUND6

        return ROUND6[seed % len(ROUND6)]
    if kind == "round7":
        from fuzzround6 import ROUND7

        return ROUND7[seed % len(ROUND7)]
    if kind == "evidence":
        from fuzzlib import EVIDENCE

        return ":".join(EVIDENCE[seed % len(EVIDENCE)][:2])
    return config_case(seed)[0] if kind == "configs" else random_case(seed)[3]


def _row(case, out, problems: list[str], seconds: float) -> dict:
    first = out.stderr.strip().splitlines()
    return {
        "seed": case.seed,
        "kind": case.kind,
        "label": case.label,
        "exit": out.exit,
        "problems": problems,
        "seconds": round(seconds, 3),
        "peak_mb": round(out.peak_mb, 1),
        "message": first[-1][:300] if out.exit == 2 and first else "",
        "stderr": out.stderr[-2000:] if problems else "",
    }


def _worker(conn, kind: str, memory_mb: int, timeout: int) -> None:
    """Run the seeds the parent sends, one at a time, in this process; answer one row per seed."""
    os.environ.pop("ROLLOUT_AUDIT_DEBUG", None)
    os.environ["ROLLOUT_AUDIT_NO_PROGRESS"] = "1"
    from fuzzlib import digests, judge, peak_mb, peak_reset, run_in_process

    scratch = Path(tempfile.mkdtemp(prefix="fuzz-worker-"))
    os.chdir(scratch)  # no project configuration of the caller's directory applies
    cases = _Cases(kind, scratch)
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:  # the lazy imports, before the limit
        run_in_process(cases.write(0, Path(tmp)).args, Path(tmp))
    limit = _vm_size() + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # a fatal signal, or a case still running a second before its alarm, writes every thread's stack to
    # file descriptor 2: the case's stderr.txt, left in the worker's scratch directory when it dies
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # an alarm ends this process: the parent records a hang
    conn.send({"ready": True})
    while True:
        seed = conn.recv()
        work = scratch / f"case-{seed}"
        work.mkdir()
        temp = work / "tmp"  # the audit's temporary files, which must be gone when it returns
        temp.mkdir()
        try:
            case = cases.write(seed, work)
        except Exception as e:  # noqa: BLE001 - a harness bug, counted apart from the auditor's
            conn.send({"seed": seed, "kind": kind, "exit": None, "problems": ["generator error"], "stderr": repr(e)})
            continue
        before = digests(case.inputs)
        tempfile.tempdir = str(temp)
        t, cpu = time.perf_counter(), time.process_time()
        peak_reset()
        faulthandler.dump_traceback_later(max(1, timeout - 1), exit=False, file=sys.__stderr__)
        signal.alarm(timeout)
        if kind in WORKFLOW_KINDS:  # with its writer process and follow-up commands
            from fuzzlib import run_workflow_case

            out, problems = run_workflow_case(case, work, lambda args, work=work: run_in_process(args, work))
        else:
            out = run_in_process(case.args, work)
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        out.peak_mb = peak_mb()
        seconds = time.perf_counter() - t
        cpu = time.process_time() - cpu
        tempfile.tempdir = None
        if kind not in WORKFLOW_KINDS:
            problems = judge(case, out, before)
        if any(temp.iterdir()):
            problems.append("temporary files left")
        shutil.rmtree(work, ignore_errors=True)
        conn.send({**_row(case, out, problems, seconds), "cpu_seconds": round(cpu, 3)})


class Worker:
    def __init__(self, ctx, kind: str, memory_mb: int, timeout: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, kind, memory_mb, timeout), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(300):
            raise SystemExit("the fuzz worker did not start within 300 s")
        self.conn.recv()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join()


def _in_process(kind: str, seeds: list[int], a, emit) -> None:
    """The cases in one long-lived worker, replaced when it dies or stops answering."""
    ctx = mp.get_context("spawn")
    worker = Worker(ctx, kind, a.memory_mb, a.timeout)
    for seed in seeds:
        worker.conn.send(seed)
        t = time.perf_counter()
        failure = None
        if worker.conn.poll(a.timeout + 30):
            try:
                emit(worker.conn.recv())
                continue
            except EOFError:
                pass
        else:
            failure = "hang"
        worker.proc.join(5)
        if failure is None:
            code = worker.proc.exitcode
            failure = "hang" if code == -signal.SIGALRM else f"worker died ({code})"
        worker.stop()
        emit(
            {
                "seed": seed,
                "kind": kind,
                "label": label(kind, seed),
                "exit": None,
                "problems": [failure],
                "seconds": round(time.perf_counter() - t, 3),
            }
        )
        worker = Worker(ctx, kind, a.memory_mb, a.timeout)
    worker.stop()


def _isolated(kind: str, seeds: list[int], a, emit) -> None:
    """Each case in its own process forked from the preloaded server (the tests' mode)."""
    from fuzzlib import run_case

    scratch = Path(tempfile.mkdtemp(prefix="fuzz-isolated-"))
    os.chdir(scratch)
    cases = _Cases(kind, scratch)
    for seed in seeds:
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            case = cases.write(seed, Path(tmp))
            t = time.perf_counter()
            if kind in WORKFLOW_KINDS:
                from fuzzlib import run_cli, run_workflow_case

                out, problems = run_workflow_case(case, Path(tmp), lambda args: run_cli(args, Path(tmp), a.timeout))
            else:
                out, problems = run_case(case, Path(tmp), a.timeout)
            emit(_row(case, out, problems, time.perf_counter() - t))


def _write(kind: str, seed: int, where: str) -> None:
    """The files of one case under `where`, and the command that audits them."""
    import shlex

    path = Path(where).resolve()
    path.mkdir(parents=True, exist_ok=True)
    case = _Cases(kind, path).write(seed, path)
    print(shlex.join(["rollout-audit", *case.args]))


def _seeds(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=["logs", "dumps", "configs", *WORKFLOW_KINDS], default="logs")
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--seeds", type=_seeds, help="these seeds instead of --first-seed/--cases (comma-separated)")
    ap.add_argument("--timeout", type=int, default=60, help="seconds a case may take (default 60)")
    ap.add_argument("--memory-mb", type=int, default=PEAK_LIMIT_MB, help="address space a case may add (default 2048)")
    ap.add_argument("--isolate", action="store_true", help="each case in its own process (confirms a finding)")
    ap.add_argument("--write", nargs=2, metavar=("SEED", "DIR"), help="write one case's files and print its command")
    ap.add_argument("--out", default="fuzz.jsonl")
    ap.add_argument("--table", metavar="JSONL", help="print the outcomes per surface of a campaign's output")
    a = ap.parse_args()
    if a.table:
        print(table(a.table))
        return
    if a.write:
        _write(a.kind, int(a.write[0]), a.write[1])
        return
    seeds = a.seeds or list(range(a.first_seed, a.first_seed + a.cases))
    t0 = time.time()
    with open(a.out, "w") as fh:

        def emit(row: dict) -> None:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            if row["problems"]:
                print(f"seed {row['seed']}: {', '.join(row['problems'])}", file=sys.stderr, flush=True)

        (_isolated if a.isolate else _in_process)(a.kind, seeds, a, emit)
    print(json.dumps(summary(a.out, time.time() - t0), indent=1))


# a case's problems sorted into the outcomes a campaign reports per surface (the first that matches)
OUTCOMES = (
    ("traceback", ("traceback",)),
    ("internal error", ("internal error", "generator error")),
    ("abort/segfault", ("worker died", "exit -", "exit 1", "exit 3")),
    ("hang", ("hang",)),
    ("silent pass", ("exit 0", "in silence", "weakened")),
    ("input written", ("input written",)),
    ("memory over bound", ("over 2 GB",)),
)


def outcome(problem: str) -> str:
    """The outcome a problem counts as ("other": a refusal naming no input or field, a file left, ...)."""
    for name, marks in OUTCOMES:
        if any(m in problem for m in marks):
            return name
    return "other"


def table(path: str) -> str:
    """The campaign's outcomes per surface (the label's first part), as a Markdown table: exits, then
    the cases with each kind of failure (a case counts once per kind it shows)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    kinds = [name for name, _ in OUTCOMES] + ["other"]
    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        for key in (r.get("label", "?").split(":")[0], "all"):
            c = per[key]
            c["cases"] += 1
            c[f"exit {r['exit']}"] += 1
            for k in {outcome(p) for p in r["problems"]}:
                c[k] += 1
            c["max s"] = max(c["max s"], r.get("seconds", 0))
            c["max MB"] = max(c["max MB"], r.get("peak_mb", 0))
    cols = ["cases", "exit 0", "exit 1", "exit 2", *kinds, "max s", "max MB"]
    out = ["| surface | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for key in sorted(per, key=lambda k: (k == "all", k)):
        out.append(f"| {key} | " + " | ".join(str(round(per[key][c], 2)) for c in cols) + " |")
    return "\n".join(out)


def summary(path: str, seconds: float = 0.0) -> dict:
    """The campaign's figures from its JSON lines."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cases": len(rows),
        "wall_seconds": round(seconds, 1),
        "cpu_seconds_workers": round(kids.ru_utime + kids.ru_stime, 1),
        "per_label": dict(collections.Counter(r.get("label", "?") for r in rows)),
        "exits": dict(collections.Counter(str(r["exit"]) for r in rows)),
        "problems": dict(collections.Counter(p for r in rows for p in r["problems"])),
        "failing_seeds": [r["seed"] for r in rows if r["problems"]][:50],
        "max_seconds": max((r.get("seconds", 0) for r in rows), default=0),
        "max_cpu_seconds": max((r.get("cpu_seconds", 0) for r in rows), default=0),
        "median_seconds": sorted(r.get("seconds", 0) for r in rows)[len(rows) // 2] if rows else 0,
        "slowest_seed": max(rows, key=lambda r: r.get("seconds", 0))["seed"] if rows else None,
        "max_peak_mb": max((r.get("peak_mb", 0) for r in rows), default=0),
    }


if __name__ == "__main__":
    main()
