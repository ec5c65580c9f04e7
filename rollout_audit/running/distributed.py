"""The audit on a Ray cluster (the `distributed` extra).

Batch checks run as Ray tasks, one per share of a file (a run of consecutive row groups): each
task opens its file itself (on a shared filesystem or object storage) and reads only its own row
groups, so row data never passes through the driver; findings and bookkeeping travel back.

The per-trajectory summary the log checks need never comes to the driver either. Each share
task cuts its summary rows into `n_parts` pieces by a hash of a key, once per key the selected
log checks partition by (the rules' `partition`: trajectory id for duplicates, task for groups,
file, reset key), and a second stage runs those checks one task per partition, on every share's
piece of it. Checks partitioned by update (`BY_UPDATE`: the update checks and policy lag) take
one more stage: the update records' batch members are cut by trajectory id like the rows, a
routing task per trajectory partition joins them and sends each named row to the partition of
the update naming it (update index mod `n_parts`), and a task per update partition runs the
checks on its update records and the rows they name. The driver merges what the partitions
found and their small statistics (`Rule.merge`); only the few log checks that are not
partitioned get their declared summary columns gathered on the driver. Findings, coverage and
the report are those of the local audit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from ..contract.config import Config
from ..contract.errors import UsageError
from ..contract.registry import BY_UPDATE, NotRun, Rule
from ..frames.views import LogCheckView, LogView
from ..reading.batches import Share, batches, shares
from .executors import Done, Work, register_executor
from .runner import MAX_CRASHES_KEPT, Plan, Runner

_KEEP = ("trajectory_id", "file", "_row", "_ord")  # columns every summary piece carries
_ID = ("trajectory_id",)
_NAMED = ("trajectory_ids", "window_trajectory_ids", "stat_trajectory_ids")  # update lists that name trajectories
_SPLIT = ("split_from", "split_continues")  # a split episode's segments read its reward on the last one


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
    if not frame.height:
        return [frame] * n
    cols = [pl.col(c).cast(pl.String) if c in frame.columns else pl.lit(None, pl.String) for c in key]
    part = pl.concat_str([c.fill_null("\x00") for c in cols], separator="\x1f").hash(seed=0) % n
    tagged = frame.with_columns(part.alias("_part"))
    return [tagged.filter(pl.col("_part") == i).drop("_part") for i in range(n)]


def _put(frames: list[pl.DataFrame]) -> list[Any]:
    """In a Ray task: the pieces a task hands on, put in the object store of its node, so that
    what the task returns (and the driver, which owns the returns, holds) is their references,
    never their rows (Ray keeps small returns in the owner's memory). Outside Ray: the pieces."""
    import ray

    return [ray.put(f) for f in frames] if ray.is_initialized() else frames


def _got(pieces: Any) -> list[pl.DataFrame]:
    """The pieces a task was handed: those passed as references (see `_put`) fetched."""
    refs = [i for i, x in enumerate(pieces) if not isinstance(x, pl.DataFrame)]
    if not refs:
        return list(pieces)
    import ray

    out = list(pieces)
    for i, x in zip(refs, ray.get([pieces[i] for i in refs])):
        out[i] = x
    return out


def _columns(frame: pl.DataFrame, reads: frozenset[str]) -> pl.DataFrame:
    """The summary columns a set of log checks declared, with the row's identity."""
    return frame.select([c for c in frame.columns if c in reads or c in _KEEP])


def _concat(frames: Any) -> pl.DataFrame:
    """The non-empty `frames` as one (in one chunk: polars string kernels panic on some
    multi-chunk inputs)."""
    frames = [x for x in frames if x is not None and x.height]
    return pl.concat(frames, how="diagonal_relaxed", rechunk=True) if frames else pl.DataFrame()


@dataclass(frozen=True)
class Keyed:
    """Log checks partitioned by one key, and the summary columns they read together."""

    key: tuple[str, ...]
    codes: tuple[str, ...]
    reads: frozenset[str]


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
    keyed: tuple[Keyed, ...]  # log checks run per key partition (BY_UPDATE ones: by trajectory id, then routed)
    by_update: tuple[str, ...]  # codes of the log checks run per partition of the update records
    n_parts: int
    routed: tuple[str, ...] = ()  # checks by trajectory id that read the update records: run where members are routed

    def runner(self) -> Runner:
        r = Runner(self.cfg, self.select, self.ignore, rules=self.rules)
        r.declared = dict(self.declared)
        return r

    @property
    def route(self) -> int:
        """Index in `keyed` of the pieces by trajectory id that the update stage routes."""
        return next(i for i, k in enumerate(self.keyed) if k.key == _ID)


def _keyed(runner: Runner) -> tuple[tuple[Keyed, ...], tuple[str, ...]]:
    """The partitioned log checks grouped by key; the update-partitioned ones read their rows
    from the pieces by trajectory id (with what the rows of a split episode need). A check by
    trajectory id that reads the update records sees, in its partition, the records' batch
    members that are the partition's trajectories (`updates.trajectory_ids` and
    `updates.update_step` only)."""
    groups: dict[tuple[str, ...], tuple[list[str], set[str]]] = {}
    by_update = []
    for r in runner.log_rules:
        if not r.partition:
            continue
        key = _ID if r.partition == BY_UPDATE else r.partition
        codes, reads = groups.setdefault(key, ([], set()))
        reads.update(q for q in r.reads if not q.startswith("updates"))
        if r.partition == BY_UPDATE:
            by_update.append(r.code)
            reads.update(_SPLIT)
        else:
            codes.append(r.code)
    keyed = tuple(Keyed(k, tuple(c), frozenset(q)) for k, (c, q) in groups.items())
    return keyed, tuple(by_update)


def check_share(job: Job, share: Share, index: int) -> tuple[Any, ...]:
    """Ray task: read one share's row groups, run the batch checks, and hand on (bookkeeping,
    the gathered summary columns, `n_parts` summary pieces per key, and the last segments of
    the split episodes it holds). `index` orders the share's rows in the log (`_ord`)."""
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
    if summary.height:
        summary = summary.with_columns((pl.int_range(pl.len(), dtype=pl.Int64) + (index << 32)).alias("_ord"))
    head = {"state": _state(runner), "rows": rows, "tokens": tokens, "broken": broken, "schema": dict(summary.schema)}
    out: list[Any] = [head, _columns(summary, job.gather) if job.gather is not None else None]
    for k in job.keyed:
        out += _put(_partition(_columns(summary, k.reads), k.key, job.n_parts))
    last = pl.DataFrame()
    if job.by_update and "split_from" in summary.columns:
        ends = pl.col("split_from").is_not_null() & ~pl.col("split_continues").fill_null(False)
        last = _columns(summary, job.keyed[job.route].reads).filter(ends)
    out += _put([last])
    return tuple(out)


def _outcome(runner: Runner, rule: Rule, view: LogView) -> dict[str, Any]:
    """One log check on one partition: what it found, why it did not run, how it crashed, and
    the statistics it wrote."""
    found = len(runner.findings)
    _, why = runner._call(rule, LogCheckView(view, rule), None, None)
    crash = next((c.error for c in runner.crashes if c.code == rule.code), None)
    return {"findings": runner.findings[found:], "why": why, "crash": crash, "stats": view.stats.get(rule.code)}


def check_partition(
    job: Job, keyed: Keyed, schema: dict[str, pl.DataType], *pieces: pl.DataFrame
) -> dict[str, dict[str, Any]] | None:
    """Ray task: the log checks of one key on the rows of one partition (every share's piece
    of it); their outcomes by code, None when the partition holds no row."""
    traj = _concat(_got(pieces))
    if not traj.height:
        return None
    runner = job.runner()
    view = LogView(_align(traj, schema), None, [], part=True)
    return {code: _outcome(runner, runner.rules[code], view) for code in keyed.codes}


def split_members(updates: pl.DataFrame, offset: int, n: int) -> Any:
    """Ray task: the trajectories a run of update records names (`_u`: the record's index in
    the log's update records, from `offset`), cut into `n` pieces by trajectory id as the rows are."""
    u = updates.with_row_index("_u", offset).with_columns(pl.col("_u").cast(pl.Int64))
    named = [
        u.select("_u", pl.col(c).cast(pl.List(pl.String)).alias("trajectory_id"), pl.lit(c).alias("_named")).explode(
            "trajectory_id"
        )
        for c in _NAMED
        if c in u.columns
    ]
    m = _concat(named)
    if m.height:
        m = m.drop_nulls("trajectory_id").unique(maintain_order=True)
    return _returns(_put(_partition(m, _ID, n)))


def _returns(frames: list[pl.DataFrame]) -> Any:
    """A task's `n` returns (Ray hands one return back as the object itself, not a list)."""
    return frames[0] if len(frames) == 1 else frames


def route(job: Job, schema: dict[str, pl.DataType], steps: pl.DataFrame, n_rows: int, *pieces: pl.DataFrame) -> Any:
    """Ray task: the rows of one trajectory partition (`n_rows` pieces, then the batch members
    of the same partition), each sent to the partition of every update that names it; last,
    the outcomes of the checks by trajectory id that read the update records (`job.routed`:
    they see the records' `trajectory_ids` cut to this partition, `steps` gives each record's
    update_step)."""
    pieces = tuple(_got(pieces))
    rows, members = _concat(pieces[:n_rows]), _concat(pieces[n_rows:])
    n = job.n_parts
    out = [pl.DataFrame()] * n
    if rows.height:
        rows = rows.with_columns(pl.col("trajectory_id").cast(pl.String))
    if rows.height and members.height and job.by_update:
        pairs = members.select("_u", "trajectory_id").unique()
        named = pairs.join(rows, on="trajectory_id", how="inner").with_columns((pl.col("_u") % n).alias("_part"))
        out = [named.filter(pl.col("_part") == j).drop("_u", "_part").unique("_ord") for j in range(n)]
    outcomes = None
    if job.routed and rows.height:
        listed = members.filter(pl.col("_named") == "trajectory_ids") if members.height else members
        if "trajectory_ids" in steps.columns:  # the column as the records have it, cut to this partition
            per = listed.group_by("_u").agg(pl.col("trajectory_id").alias("trajectory_ids"))
            steps = steps.drop("trajectory_ids").join(per, on="_u", how="inner")
        runner = job.runner()
        view = LogView(_align(rows, schema), steps.sort("_u").drop("_u"), [], part=True)
        outcomes = {code: _outcome(runner, runner.rules[code], view) for code in job.routed}
    return [*_put(out), outcomes]


def check_updates(
    job: Job, j: int, schema: dict[str, pl.DataType], env: dict[str, Any], n_last: int, *pieces: pl.DataFrame
) -> dict[str, dict[str, Any]] | None:
    """Ray task: the update-partitioned log checks on one partition of the update records
    (`env["updates"]`) and the rows they name (the pieces after the `n_last` pieces of split
    episodes' last segments); their outcomes by code, None when the partition is empty."""
    updates: pl.DataFrame = env["updates"]
    if not updates.height and j:
        return None
    pieces = tuple(_got(pieces))
    traj = _concat(pieces[n_last:])
    if traj.height and "split_continues" in traj.columns and traj["split_continues"].fill_null(False).any():
        wanted = traj.filter(pl.col("split_continues").fill_null(False))["split_from"].drop_nulls().unique()
        last = _concat(pieces[:n_last])
        if last.height:  # the first last segment of each episode, as the whole log's summary has it
            traj = _concat([traj, last.filter(pl.col("split_from").is_in(wanted.implode()))])
    if traj.height:
        traj = traj.unique("_ord", keep="first").sort("_ord")
    runner = job.runner()
    view = LogView(_align(traj, schema), updates, env["broken"], env["update_files"], part=True)
    return {code: _outcome(runner, runner.rules[code], view) for code in job.by_update}


def _align(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """`frame` with the columns (and types) of the whole-log summary it is a part of, as the
    local audit's one concatenated summary has them: absent columns are null."""
    if not frame.height:
        return pl.DataFrame(schema=schema)
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
    """Batch checks as Ray tasks, one per share of a file; log checks partitioned by key or by
    update where their findings allow it, the rest on the driver (see the module's docstring).
    `address`: a running cluster (None or "local": start one here, of `num_cpus` CPUs, and shut
    it down)."""

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

# partitions by default: one per CPU, at most this many (the driver holds shares × keys ×
# partitions references, and the update stage partitions² of them)
MAX_PARTS = 256
UPDATES_PER_TASK = 4096  # update records whose batch members one task cuts by trajectory id


def _run(ray: Any, work: Work, rows_per_share: int, partitions: int | None) -> Done:
    runner, disc = work.runner, work.disc
    keyed, by_update = _keyed(runner)
    routed: tuple[str, ...] = ()
    if work.updates is None:
        by_update = ()  # the update checks lack their input: the runner says so
    else:
        routed = tuple(c for k in keyed if k.key == _ID for c in k.codes if _reads_updates(runner.rules[c]))
    kept = [r for r in runner.log_rules if not r.partition]
    n_parts = partitions or min(MAX_PARTS, max(1, int(ray.cluster_resources().get("CPU", 1))))
    job = Job(
        runner.cfg,  # with what the files declare (e.g. reward components paid once)
        work.select,
        work.ignore,
        work.rules,
        dict(runner.declared),
        work.plan,
        work.batch_rows,
        frozenset(q for r in kept for q in r.reads) if kept else None,
        keyed,
        by_update,
        n_parts,
        routed,
    )
    job_ref = ray.put(job)
    per_share = 3 + len(keyed) * n_parts
    task = ray.remote(check_share).options(num_returns=per_share)
    units = shares(disc.of_kind("trajectories"), rows_per_share)
    refs = [task.remote(job_ref, s, i) for i, s in enumerate(units)]
    rows = tokens = 0
    schema: dict[str, pl.DataType] = {}
    for head in ray.get([r[0] for r in refs]):
        _merge(runner, head["state"])
        rows += head["rows"]
        tokens += head["tokens"]
        work.broken += head["broken"]
        for name, dtype in head["schema"].items():
            schema.setdefault(name, dtype)
    cols = {c: t for c, t in schema.items() if job.gather is not None and (c in job.gather or c in _KEEP)}
    base = work.log_view(pl.DataFrame())
    view = _Gathered(base, lambda: _align(_concat(ray.get([r[1] for r in refs])), cols), rows) if kept else base
    outcomes = _keyed_stage(ray, job_ref, job, refs, schema)
    if by_update or routed:
        outcomes.update(_update_stage(ray, job_ref, job, refs, schema, work))
    swap = {code: (_replayed(runner.rules[code], o), _sized(base, rows)) for code, o in outcomes.items()}
    runner.check_log(view, unusable=not rows, swap=swap)
    return Done(rows, tokens, view.stats)


def _reads_updates(rule: Rule) -> bool:
    return any(q.startswith("updates") for q in rule.reads)


def _sub(schema: dict[str, pl.DataType], reads: frozenset[str]) -> dict[str, pl.DataType]:
    return {c: t for c, t in schema.items() if c in reads or c in _KEEP}


def _keyed_stage(ray: Any, job_ref: Any, job: Job, refs: list[Any], schema: dict) -> dict[str, list[Any]]:
    """Run the checks of each key one task per partition; the outcomes of each code, by partition."""
    task = ray.remote(check_partition)
    pending = []
    for g, k in enumerate(job.keyed):
        k = replace(k, codes=tuple(c for c in k.codes if c not in job.routed))
        if not k.codes:
            continue
        base = 2 + g * job.n_parts
        sub = _sub(schema, k.reads)
        pending.append((k, [task.remote(job_ref, k, sub, *[r[base + i] for r in refs]) for i in range(job.n_parts)]))
    out: dict[str, list[Any]] = {}
    for k, p in pending:
        got = ray.get(p)
        for code in k.codes:
            out[code] = [o[code] for o in got if o is not None]
    return out


def _update_stage(ray: Any, job_ref: Any, job: Job, refs: list[Any], schema: dict, work: Work) -> dict[str, list[Any]]:
    """Cut the batch members by trajectory id, route every named row to the partitions of the
    updates that name it, and run the update-partitioned checks one task per update partition."""
    n = job.n_parts
    updates = work.updates
    assert updates is not None
    split = ray.remote(split_members).options(num_returns=n)
    members = []
    for lo in range(0, max(updates.height, 1), UPDATES_PER_TASK):
        got = split.remote(updates.slice(lo, UPDATES_PER_TASK), lo, n)
        members.append(got if n > 1 else [got])
    base = 2 + job.route * n
    router = ray.remote(route).options(num_returns=n + 1)
    sub = _sub(schema, job.keyed[job.route].reads)
    idx = pl.int_range(pl.len(), dtype=pl.Int64)
    cols = [idx.alias("_u"), (pl.col("update_step") if "update_step" in updates.columns else idx).alias("update_step")]
    if "trajectory_ids" in updates.columns:
        cols.append(pl.lit(None, pl.List(pl.String)).alias("trajectory_ids"))
    steps = updates.select(cols)
    routed = [
        router.remote(job_ref, sub, steps, len(refs), *[r[base + i] for r in refs], *[m[i] for m in members])
        for i in range(n)
    ]
    last = [r[2 + len(job.keyed) * n] for r in refs]
    env = {"broken": list(work.broken), "update_files": [f.path for f in work.disc.of_kind("updates")]}
    task = ray.remote(check_updates)
    pending = (
        []
        if not job.by_update
        else [
            task.remote(
                job_ref,
                j,
                sub,
                {**env, "updates": updates.filter(idx % n == j)},
                len(last),
                *last,
                *[routed[i][j] for i in range(n)],
            )
            for j in range(n)
        ]
    )
    got = ray.get(pending) if job.by_update else []
    out = {code: [o[code] for o in got if o is not None] for code in job.by_update}
    near = ray.get([r[n] for r in routed])
    out.update({code: [o[code] for o in near if o is not None] for code in job.routed})
    return out


def _replayed(rule: Rule, outcomes: list[dict[str, Any]]) -> Rule:
    """`rule` with a function that gives back what its partitions found (or why it did not run,
    or how it crashed), merged as the rule says, so that the driver's runner accounts for it as
    for a local run."""

    def func(view: Any, cfg: Any) -> pl.DataFrame | None:
        for o in outcomes:
            if o.get("crash"):
                name, _, msg = o["crash"].partition(": ")
                raise type(name, (Exception,), {})(msg)  # reported as the task's exception was
        frames = [x for o in outcomes for x in o["findings"]]
        found = pl.concat(frames, how="diagonal_relaxed") if frames else None
        whys = [o["why"] for o in outcomes]
        if rule.merge is not None:
            stats, why, found = rule.merge([o["stats"] for o in outcomes], whys, found)
            if stats is not None:
                view.stats[rule.code] = stats
        else:
            why = whys[0] if whys and all(whys) else None
        if why:
            raise NotRun(why)
        return found

    return replace(rule, func=func)


class _Gathered(LogView):
    """The driver's view of the log: the summary columns of the log checks that are not
    partitioned are fetched from the share tasks when a check first reads them (a check that
    does not run, e.g. replay when it is off, costs the driver nothing)."""

    def __init__(self, base: LogView, fetch: Any, rows: int) -> None:
        self.__dict__.update({k: v for k, v in base.__dict__.items() if k != "traj"})
        self._fetch, self._rows = fetch, rows
        self._traj: pl.DataFrame | None = None

    @property
    def traj(self) -> pl.DataFrame:  # type: ignore[override]
        if self._traj is None:
            self._traj = self._fetch()
        return self._traj

    @property
    def height(self) -> int:
        return self._rows


def _sized(view: LogView, rows: int) -> LogView:
    """`view` with a column-less stand-in of the log's `rows` rows (a Null column holds no data)."""
    return replace(view, traj=pl.repeat(None, rows, dtype=pl.Null, eager=True).to_frame("_rows"))
