"""The audit on a Ray cluster (the `distributed` extra).

Batch checks run as Ray tasks, one per share of a file (a run of consecutive row groups): each
task opens its file itself (on a shared filesystem or object storage) and reads only its own row
groups, so row data never passes through the driver; findings and bookkeeping travel back. The
per-trajectory summary the log checks need is partitioned by key inside each task: a log check
whose findings depend only on rows that share a key (the rules' `partition`: duplicate ids by
trajectory_id, reset keys by environment, version and seed) runs as one task per partition, so
no process holds the whole-log summary for it. The other log checks (groups, updates, versions,
rewards: they need the update records or write whole-log statistics) get the columns they declare
gathered on the driver. Findings, coverage and the report are those of the local audit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from ..contract.config import Config
from ..contract.errors import UsageError
from ..contract.registry import NotRun, Rule
from ..frames.views import LogCheckView, LogView
from ..reading.batches import Share, batches, shares
from .executors import Done, Work, register_executor
from .runner import MAX_CRASHES_KEPT, Plan, Runner

_KEEP = ("trajectory_id", "file", "_row")  # columns every summary piece carries


# ---------------------------------------------------------------- what a task returns


def _state(runner: Runner) -> dict[str, Any]:
    """A runner's results as plain data (a Runner holds a lock and cannot travel)."""
    return {
        "findings": runner.findings,
        "coverage": runner.coverage,
        "reasons": runner.reasons,
        "crashes": runner.crashes,
        "crash_counts": runner.crash_counts,
        "file_inputs": runner.file_inputs,
    }


def _merge(runner: Runner, state: dict[str, Any]) -> None:
    """Add a task's results to the driver's runner, as if its batches had run here."""
    runner.findings += state["findings"]
    for code, cov in state["coverage"].items():
        mine = runner.coverage[code]
        mine.ran += cov.ran
        mine.calls += cov.calls
        for why, n in cov.lacking.items():
            mine.lack(why, n)
    for code, why in state["reasons"].items():
        runner.reasons[code] |= why
    for crash in state["crashes"]:
        if sum(c.code == crash.code for c in runner.crashes) < MAX_CRASHES_KEPT:
            runner.crashes.append(crash)
    for code, n in state["crash_counts"].items():
        runner.crash_counts[code] = runner.crash_counts.get(code, 0) + n
    for path, (have, n) in state["file_inputs"].items():  # the last batch's inputs, all rows (as note_batch)
        old = runner.file_inputs.get(path)
        runner.file_inputs[path] = (have, (old[1] if old else 0) + n)


def _partition(frame: pl.DataFrame, key: tuple[str, ...], n: int) -> list[pl.DataFrame]:
    """`frame` cut into `n` pieces by a hash of the key columns (absent ones count as null);
    polars' hash is stable within one polars version, so every node must run the same one."""
    cols = [pl.col(c).cast(pl.String) if c in frame.columns else pl.lit(None, pl.String) for c in key]
    part = pl.concat_str([c.fill_null("\x00") for c in cols], separator="\x1f").hash(seed=0) % n
    tagged = frame.with_columns(part.alias("_part"))
    return [tagged.filter(pl.col("_part") == i).drop("_part") for i in range(n)]


def _columns(frame: pl.DataFrame, reads: frozenset[str]) -> pl.DataFrame:
    """The summary columns a set of log checks declared, with the row's identity."""
    return frame.select([c for c in frame.columns if c in reads or c in _KEEP])


@dataclass(frozen=True)
class Job:
    """What every task of one audit shares (sent to the cluster once)."""

    cfg: Config
    select: tuple[str, ...] | None
    ignore: tuple[str, ...] | None
    rules: dict[str, Rule] | None
    declared: dict[str, str]
    plan: Plan
    batch_rows: int
    gather: frozenset[str] | None  # summary columns the driver's log checks read (None: no such check)
    partitioned: tuple[str, ...]  # codes of the log checks run per key partition
    n_parts: int

    def runner(self) -> Runner:
        r = Runner(self.cfg, self.select, self.ignore, rules=self.rules)
        r.declared = dict(self.declared)
        return r


def check_share(job: Job, share: Share) -> tuple[Any, ...]:
    """Ray task: read one share's row groups, run the batch checks, and hand on (bookkeeping,
    the gathered summary columns, then `n_parts` summary pieces per partitioned log check)."""
    runner = job.runner()
    broken: list[tuple[str, str]] = []
    rows = tokens = 0
    summaries: list[pl.DataFrame] = []
    for part in batches([share.opened()], job.plan.columns, job.batch_rows, broken, job.cfg):
        done = runner.check_batch(part, job.plan)
        rows += done.rows
        tokens += done.tokens
        if done.summary is not None:
            summaries.append(done.summary)
    summary = pl.concat(summaries, how="diagonal_relaxed") if summaries else pl.DataFrame()
    head = {"state": _state(runner), "rows": rows, "tokens": tokens, "broken": broken, "schema": dict(summary.schema)}
    out: list[Any] = [head, _columns(summary, job.gather) if job.gather is not None else None]
    for code in job.partitioned:
        if not summary.height:
            out += [pl.DataFrame()] * job.n_parts
            continue
        out += _partition(
            _columns(summary, frozenset(runner.rules[code].reads)), runner.rules[code].partition, job.n_parts
        )
    return tuple(out)


def check_partition(job: Job, code: str, schema: dict[str, pl.DataType], *pieces: pl.DataFrame) -> dict[str, Any]:
    """Ray task: one log check on the rows of one key partition (every task's piece of it)."""
    frames = [x for x in pieces if x.height]
    traj = _align(pl.concat(frames, how="diagonal_relaxed", rechunk=True) if frames else pl.DataFrame(), schema)
    if not traj.height:
        return {"height": 0}
    runner = job.runner()
    rule = runner.rules[code]
    done, why = runner._call(rule, LogCheckView(LogView(traj, None, []), rule), None, None)
    crash = runner.crashes[0].error if runner.crashes else None
    return {"height": traj.height, "findings": runner.findings, "why": why, "crash": crash}


def _align(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """`frame` with the columns (and types) of the whole-log summary it is a part of, as the
    local audit's one concatenated summary has them: absent columns are null."""
    have = set(frame.columns)
    return frame.select([pl.col(c).cast(t) if c in have else pl.lit(None, t).alias(c) for c, t in schema.items()])


# ---------------------------------------------------------------- the driver


def _connect(address: str | None, num_cpus: int | None) -> tuple[Any, bool]:
    """The `ray` module, connected (to `address`, or to a local cluster of `num_cpus` started
    here); True when this call started it (and must shut it down)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'rollout-audit[distributed]'") from None
    if ray.is_initialized():
        return ray, False
    if address in (None, "", "local"):
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    return ray, True


class RayExecutor:
    """Batch checks as Ray tasks, one per share of a file; log checks partitioned by key where
    their findings allow it, the rest on the driver (see the module's docstring). `address`: a
    running cluster (None or "local": start one here, of `num_cpus` CPUs, and shut it down)."""

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        rows_per_share: int = 65536,
        partitions: int | None = None,
        **_: Any,
    ) -> None:
        self.address, self.num_cpus = address, num_cpus
        self.rows_per_share, self.partitions = rows_per_share, partitions

    def run(self, work: Work) -> Done:
        ray, started = _connect(self.address, self.num_cpus)
        try:
            return _run(ray, work, self.rows_per_share, self.partitions)
        finally:
            if started:
                ray.shutdown()


register_executor("ray", RayExecutor)


def _run(ray: Any, work: Work, rows_per_share: int, partitions: int | None) -> Done:
    runner, cfg, disc = work.runner, work.cfg, work.disc
    part = tuple(r.code for r in runner.log_rules if r.partition)
    kept = [r for r in runner.log_rules if not r.partition]
    n_parts = partitions or max(1, int(ray.cluster_resources().get("CPU", 1)))
    job = Job(
        runner.cfg,  # with what the files declare (e.g. reward components paid once)
        work.select,
        work.ignore,
        work.rules,
        dict(runner.declared),
        work.plan,
        work.batch_rows,
        frozenset(q for r in kept for q in r.reads) if kept else None,
        part,
        n_parts,
    )
    job_ref = ray.put(job)
    task = ray.remote(check_share).options(num_returns=2 + len(part) * n_parts)
    refs = [
        task.remote(job_ref, s) for s in shares(disc.of_kind("trajectories"), rows_per_share, cfg.max_row_group_bytes)
    ]
    rows = tokens = 0
    schema: dict[str, pl.DataType] = {}
    for head in ray.get([r[0] for r in refs]):
        _merge(runner, head["state"])
        rows += head["rows"]
        tokens += head["tokens"]
        work.broken += head["broken"]
        for name, dtype in head["schema"].items():
            schema.setdefault(name, dtype)
    gathered = [g for g in ray.get([r[1] for r in refs]) if g is not None and g.height] if kept else []
    traj = pl.concat(gathered, how="diagonal_relaxed", rechunk=True) if gathered else pl.DataFrame()
    del gathered
    cols = {c: t for c, t in schema.items() if job.gather is not None and (c in job.gather or c in _KEEP)}
    view = work.log_view(_align(traj, cols))
    outcomes = _partitioned(ray, job_ref, runner, part, n_parts, refs, schema)
    swap = {code: (_replayed(runner.rules[code], o), _sized(view, rows)) for code, o in outcomes.items()}
    runner.check_log(view, unusable=not rows, swap=swap)
    return Done(rows, tokens, view.stats)


def _partitioned(
    ray: Any, job_ref: Any, runner: Runner, codes: tuple[str, ...], n_parts: int, refs: list[Any], schema: dict
) -> dict[str, list[dict[str, Any]]]:
    """Run each partitioned log check as one task per key partition; their outcomes by code."""
    task = ray.remote(check_partition)
    pending = {}
    for k, code in enumerate(codes):
        reads = frozenset(runner.rules[code].reads)
        sub = {c: t for c, t in schema.items() if c in reads or c in _KEEP}
        base = 2 + k * n_parts
        pending[code] = [task.remote(job_ref, code, sub, *[r[base + i] for r in refs]) for i in range(n_parts)]
    return {code: ray.get(p) for code, p in pending.items()}


def _replayed(rule: Rule, outcomes: list[dict[str, Any]]) -> Rule:
    """`rule` with a function that gives back what its partitions found (or why it did not run,
    or how it crashed), so that the driver's runner accounts for it as for a local run."""

    def func(view: Any, cfg: Any) -> pl.DataFrame | None:
        for o in outcomes:
            if o.get("why"):
                raise NotRun(o["why"])
        for o in outcomes:
            if o.get("crash"):
                name, _, msg = o["crash"].partition(": ")
                raise type(name, (Exception,), {})(msg)  # reported as the task's exception was
        frames = [x for o in outcomes for x in o.get("findings", [])]
        return pl.concat(frames, how="diagonal_relaxed") if frames else None

    return replace(rule, func=func)


def _sized(view: LogView, rows: int) -> LogView:
    """`view` with a column-less stand-in of the log's `rows` rows (a Null column holds no data)."""
    return replace(view, traj=pl.repeat(None, rows, dtype=pl.Null, eager=True).to_frame("_rows"))
