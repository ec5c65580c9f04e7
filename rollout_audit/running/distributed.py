"""The audit on a Ray cluster (the `distributed` extra).

Batch checks run as Ray tasks, one per share of a file (a run of consecutive row groups): each
task opens its file itself (on a shared filesystem or object storage) and reads only its own row
groups, so row data never passes through the driver; findings and bookkeeping travel back.

The per-trajectory summary the log checks need never comes to the driver either. Each share
task cuts its summary rows into `n_parts` pieces by a hash of a key, once per key the selected
log checks partition by (the rules' `partition`: trajectory id for duplicates, task for groups,
file, reset key), and pushes them to the partitions' stores: Ray actors (`Store`, one per node
by default) that hold the pieces of their partitions. A second stage runs those checks one
task per partition, each taking its partition's pieces from its store. The update records are
read by tasks too, a run of update files each, which push each record to the partition of its
update (a number from its file and row, mod `n_parts`) and its batch members to the partitions
of the trajectories they name. Checks partitioned by update (`BY_UPDATE`: the update checks and
policy lag) take one more stage: a routing task per trajectory partition joins its rows with
its batch members and pushes each named row to the partition of every update naming it, and a
task per update partition runs the checks on its update records and the rows they name. So the
driver holds a reference per task and a handle per store, never one per piece, and no summary
row or update record. It merges what the partitions found and their small statistics
(`Rule.merge`); only the few log checks that are not partitioned get their declared summary
columns gathered on the driver. Findings, coverage and the report are those of the local audit.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from ..contract.config import Config
from ..contract.errors import UsageError
from ..contract.registry import BY_UPDATE, NotRun, Rule
from ..frames.views import LogCheckView, LogView
from ..reading.batches import Share, batches, shares
from ..reading.io import LogFile
from ..reading.read import read_update_file, read_updates
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


class Store:
    """The pieces of some partitions (a Ray actor on a cluster; a plain object in one process),
    as tasks push them, for the audits under way. A piece is filed under its audit, partition,
    kind (a key's summary rows, batch members, update records, routed rows, split episodes'
    last segments) and source (the share, run of update files or partition that cut it), so a
    task takes its partition's pieces in the log's order whichever task pushed first."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int, str], dict[int, pl.DataFrame]] = {}

    def put(self, audit: str, items: list[tuple[int, str, int, pl.DataFrame]]) -> int:
        for part, kind, source, frame in items:
            self.held.setdefault((audit, part, kind), {})[source] = frame
        return len(items)

    def take(
        self, audit: str, part: int, kinds: tuple[str, ...], keep: tuple[str, ...] = ()
    ) -> list[list[pl.DataFrame]]:
        """The pieces of one partition, per kind, in their sources' order; forgotten here but
        those of the kinds in `keep` (another task reads them too)."""
        out = []
        for kind in kinds:
            got = self.held.get((audit, part, kind), {}) if kind in keep else self.held.pop((audit, part, kind), {})
            out.append([got[s] for s in sorted(got)])
        return out

    def drop(self, audit: str) -> None:
        """Forget an audit's pieces."""
        self.held = {k: v for k, v in self.held.items() if k[0] != audit}


@dataclass(frozen=True)
class Stores:
    """Where one audit's partitions are held: partition `i` in `actors[i % len(actors)]`
    (`Store` actors, or `Store` objects of this process), under the audit's name."""

    audit: str
    actors: tuple[Any, ...]

    def push(self, items: list[tuple[int, str, int, pl.DataFrame]]) -> None:
        """Hand the non-empty pieces (partition, kind, source, frame) to the stores of their
        partitions, one call per store, and wait until they hold them: a task that pushed is
        done only once its pieces are stored."""
        by: dict[int, list[tuple[int, str, int, pl.DataFrame]]] = {}
        for item in items:
            if item[3].height:
                by.setdefault(item[0] % len(self.actors), []).append(item)
        if isinstance(self.actors[0], Store):
            for a, its in by.items():
                self.actors[a].put(self.audit, its)
            return
        import ray

        ray.get([self.actors[a].put.remote(self.audit, its) for a, its in by.items()])

    def take(self, part: int, kinds: tuple[str, ...], keep: tuple[str, ...] = ()) -> Any:
        """The pieces of one partition, per kind: on a cluster, the reference of the store's
        answer, for the driver to pass to the partition's task (Ray starts the task once the
        pieces are there, so it does not wait on the store). The store forgets them, but the
        kinds in `keep`."""
        store = self.actors[part % len(self.actors)]
        if isinstance(store, Store):
            return store.take(self.audit, part, kinds, keep)
        return store.take.remote(self.audit, part, kinds, keep)


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


def read_task(job: Job, index: int, unit: Share | list[tuple[int, LogFile]], stores: Stores) -> tuple[Any, Any]:
    """Ray task of the first stage: a share of a trajectory file (`check_share`), or a run of
    update files (`read_updates_task`; no second return). One function for both: Ray leases
    workers per scheduling class, which names the function, so both kinds share the workers."""
    if isinstance(unit, Share):
        return check_share(job, unit, index, stores)
    return read_updates_task(job, index, unit, stores), None


def check_share(job: Job, share: Share, index: int, stores: Stores) -> tuple[dict[str, Any], Any]:
    """Ray task: read one share's row groups, run the batch checks, push `n_parts` summary
    pieces per key (and the last segments of the split episodes it holds, to every partition)
    to the stores, and return the bookkeeping and the gathered summary columns. `index` orders
    the share's rows in the log (`_ord`)."""
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
    items = []
    for g, k in enumerate(job.keyed):
        pieces = _partition(_columns(summary, k.reads), k.key, job.n_parts)
        items += [(i, f"key{g}", index, piece) for i, piece in enumerate(pieces)]
    if job.by_update and "split_from" in summary.columns:
        ends = pl.col("split_from").is_not_null() & ~pl.col("split_continues").fill_null(False)
        last = _columns(summary, job.keyed[job.route].reads).filter(ends)
        items += [(i, "last", index, last) for i in range(job.n_parts)]
    stores.push(items)
    return head, _columns(summary, job.gather) if job.gather is not None else None


def _outcome(runner: Runner, rule: Rule, view: LogView) -> dict[str, Any]:
    """One log check on one partition: what it found, why it did not run, how it crashed, and
    the statistics it wrote."""
    found = len(runner.findings)
    _, why = runner._call(rule, LogCheckView(view, rule), None, None)
    crash = next((c.error for c in runner.crashes if c.code == rule.code), None)
    return {"findings": runner.findings[found:], "why": why, "crash": crash, "stats": view.stats.get(rule.code)}


def check_partition(
    job: Job, codes: tuple[str, ...], schema: dict[str, pl.DataType], taken: list[list[pl.DataFrame]]
) -> dict[str, dict[str, Any]] | None:
    """Ray task: log checks `codes` of one key on the rows of one partition (`taken` from its
    store: every share's piece of it); their outcomes by code, None when it holds no row."""
    (pieces,) = taken
    traj = _concat(pieces)
    if not traj.height:
        return None
    runner = job.runner()
    view = LogView(_align(traj, schema), None, [], part=True)
    return {code: _outcome(runner, runner.rules[code], view) for code in codes}


def read_updates_task(job: Job, chunk: int, files: list[tuple[int, LogFile]], stores: Stores) -> dict[str, Any]:
    """Ray task: the update records of a run of update files, read as the local audit reads
    them (`read_update_file`). Each record gets a number `_u`, its file's index in the log's
    update files times 2³² plus its row (in the log's order, whichever files are left out), and
    goes to the update partition `_u` mod `n_parts`; the trajectories its batch lists name
    (`_members`) go to the trajectory partitions of those ids. Returns what the driver needs:
    the problems met, and each read file's column types and records."""
    broken: list[tuple[str, str]] = []
    frames, schemas, counts = [], [], []
    for i, f in files:
        df = read_update_file(f, broken, job.cfg.max_row_group_bytes, job.cfg.waived())
        if df is None:
            continue
        schemas.append((i, dict(df.schema)))
        counts.append((i, df.height))
        frames.append(df.with_columns((pl.int_range(pl.len(), dtype=pl.Int64) + (i << 32)).alias("_u")))
    u = _concat(frames)
    if u.height and (job.by_update or job.routed):
        n = job.n_parts
        items = [(i, "members", chunk, m) for i, m in enumerate(_partition(_members(u), _ID, n))]
        if job.by_update:
            items += [(j, "updates", chunk, u.filter(pl.col("_u") % n == j).drop("_u")) for j in range(n)]
        stores.push(items)
    return {"broken": broken, "schemas": schemas, "counts": counts}


def _members(u: pl.DataFrame) -> pl.DataFrame:
    """The trajectories update records name: one row per record (`_u`, its `update_step`) and
    id, with the list that names it (`_named`)."""
    step = ["update_step"] if "update_step" in u.columns else []
    named = [
        u.select(
            "_u", *step, pl.col(c).cast(pl.List(pl.String)).alias("trajectory_id"), pl.lit(c).alias("_named")
        ).explode("trajectory_id")
        for c in _NAMED
        if c in u.columns
    ]
    m = _concat(named)
    return m.drop_nulls("trajectory_id").unique(maintain_order=True) if m.height else m


def route(
    job: Job, schema: dict[str, pl.DataType], steps: dict[str, Any], part: int, stores: Stores, taken: list[Any]
) -> Any:
    """Ray task: the rows of one trajectory partition, each pushed to the partition of every
    update that names it (by the batch members of the partition); returns the outcomes of the
    checks by trajectory id that read the update records (`job.routed`: they see the records
    that name the partition's trajectories, `trajectory_ids` cut to them). `steps` says how
    the records' update_step reads (see `_steps`). `taken`: the partition's rows and batch
    members, from its store."""
    pieces, listed = taken
    rows, members = _concat(pieces), _concat(listed)
    n = job.n_parts
    if rows.height:
        rows = rows.with_columns(pl.col("trajectory_id").cast(pl.String))
    if rows.height and members.height and job.by_update:
        pairs = members.select("_u", "trajectory_id").unique()
        named = pairs.join(rows, on="trajectory_id", how="inner").with_columns((pl.col("_u") % n).alias("_part"))
        stores.push(
            [
                (j, "routed", part, named.filter(pl.col("_part") == j).drop("_u", "_part").unique("_ord"))
                for j in range(n)
            ],
        )
    if not (job.routed and rows.height):
        return None
    runner = job.runner()
    view = LogView(_align(rows, schema), _steps(members, steps), [], part=True)
    return {code: _outcome(runner, runner.rules[code], view) for code in job.routed}


def _steps(members: pl.DataFrame, steps: dict[str, Any]) -> pl.DataFrame:
    """The update records a trajectory partition's checks see: those whose `trajectory_ids`
    name one of its trajectories, in the log's order, with that list cut to them and their
    update_step (`steps["dtype"]`; without the column in any file, the record's index in the
    log's update records, from the read files' first indices `steps["first"]`)."""
    dtype = steps["dtype"] or pl.Int64
    empty = pl.DataFrame(schema={"update_step": dtype, "trajectory_ids": pl.List(pl.String)})
    if not steps["listed"] or not members.height:
        return empty if steps["listed"] else empty.drop("trajectory_ids")
    listed = members.filter(pl.col("_named") == "trajectory_ids")
    if steps["dtype"] is None:
        first = pl.DataFrame({"_f": list(steps["first"]), "_first": list(steps["first"].values())})
        idx = pl.col("_first") + pl.col("_u") % (1 << 32)
        listed = listed.with_columns((pl.col("_u") // (1 << 32)).alias("_f")).join(first, on="_f", how="left")
        listed = listed.with_columns(idx.alias("update_step"))
    elif "update_step" not in listed.columns:
        listed = listed.with_columns(pl.lit(None, dtype).alias("update_step"))
    per = listed.group_by("_u", maintain_order=True).agg(
        pl.col("update_step").first().cast(dtype), pl.col("trajectory_id").alias("trajectory_ids")
    )
    return per.sort("_u").select("update_step", "trajectory_ids")


def check_updates(
    job: Job, j: int, schema: dict[str, pl.DataType], env: dict[str, Any], taken: list[list[pl.DataFrame]]
) -> dict[str, dict[str, Any]] | None:
    """Ray task: the update-partitioned log checks on one partition of the update records and
    the rows they name (with split episodes' last segments), `taken` from its store; their
    outcomes by code, None when the partition holds no record. `env`: the update records'
    column types, the problems met and the update files."""
    last_pieces, routed, records = taken
    updates = _align(_concat(records), env["columns"])
    if not updates.height and j:
        return None
    traj = _concat(routed)
    if traj.height and "split_continues" in traj.columns and traj["split_continues"].fill_null(False).any():
        wanted = traj.filter(pl.col("split_continues").fill_null(False))["split_from"].drop_nulls().unique()
        last = _concat(last_pieces)
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
    it down). `partitions`: of the log checks (default one per CPU, at most `MAX_PARTS`);
    `stores`: actors holding them (default one per node). After a run, `peak_refs` is the most
    object references the driver held at once (Ray's reference table of this process, read
    after each stage is submitted; None where Ray does not say)."""

    reads_updates = True  # in the tasks: the driver never holds the update records

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        rows_per_share: int = 65536,
        partitions: int | None = None,
        stores: int | None = None,
        **_: Any,
    ) -> None:
        self.address, self.num_cpus = address, num_cpus
        self.rows_per_share, self.partitions, self.stores = rows_per_share, partitions, stores
        self.peak_refs: int | None = None

    def run(self, work: Work) -> Done:
        ray, started = _connect(self.address, self.num_cpus)
        try:
            return _run(ray, work, self)
        finally:
            if started:
                ray.shutdown()


register_executor("ray", RayExecutor)

MAX_PARTS = 256  # partitions by default: one per CPU, at most this many
UPDATES_PER_TASK = 1024  # update records (by the files' footers) one task reads, at least one file


def _owned(ray: Any) -> int | None:
    """Object references this process holds (Ray's private reference table: None if it moved)."""
    try:
        return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())
    except Exception:  # noqa: BLE001 - a measurement only; the audit does not depend on it
        return None


def _note(ray: Any, ex: RayExecutor) -> None:
    n = _owned(ray)
    if n is not None:
        ex.peak_refs = max(ex.peak_refs or 0, n)


def _chunks(files: list[LogFile]) -> list[list[tuple[int, LogFile]]]:
    """The update files in runs of about `UPDATES_PER_TASK` records, each file with its index."""
    out: list[list[tuple[int, LogFile]]] = []
    rows = UPDATES_PER_TASK
    for i, f in enumerate(files):
        if rows >= UPDATES_PER_TASK:
            out.append([])
            rows = 0
        out[-1].append((i, f))
        rows += f.num_rows
    return out


def _run(ray: Any, work: Work, ex: RayExecutor) -> Done:
    runner = work.runner
    ex.peak_refs = None
    keyed, by_update = _keyed(runner)
    routed = tuple(c for k in keyed if k.key == _ID for c in k.codes if _reads_updates(runner.rules[c]))
    kept = [r for r in runner.log_rules if not r.partition]
    n_parts = ex.partitions or min(MAX_PARTS, max(1, int(ray.cluster_resources().get("CPU", 1))))
    n_stores = max(1, min(n_parts, ex.stores or sum(1 for n in ray.nodes() if n.get("Alive"))))
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
    stores = Stores(uuid.uuid4().hex, tuple(_store(ray, i) for i in range(n_stores)))
    try:
        return _stages(ray, work, ex, job, stores, kept)
    finally:
        ray.get([s.drop.remote(stores.audit) for s in stores.actors])


def _store(ray: Any, i: int) -> Any:
    """Store actor `i` of this process's Ray session: started by the first audit that needs it
    (spread over the nodes, no CPU reserved: it only holds and hands pieces), kept for the next
    ones (a process start per audit would cost more than most of its partitions' checks)."""
    session = (ray.get_runtime_context().get_node_id(), ray.get_runtime_context().get_job_id())
    for old in [k for k in _KEPT if k[0] != session]:  # handles of an earlier session
        del _KEPT[old]
    if (session, i) not in _KEPT:  # Ray ends an actor when no handle to it is left: one is kept here
        _KEPT[session, i] = ray.remote(Store).options(num_cpus=0, scheduling_strategy="SPREAD").remote()
    return _KEPT[session, i]


_KEPT: dict[tuple[tuple[str, str], int], Any] = {}  # the store actors of this process's Ray session


def _stages(ray: Any, work: Work, ex: RayExecutor, job: Job, stores: Stores, kept: list[Rule]) -> Done:
    runner, disc = work.runner, work.disc
    job_ref = ray.put(job)
    update_files = disc.of_kind("updates")
    task = ray.remote(read_task).options(num_returns=2)
    reads = [task.remote(job_ref, c, files, stores)[0] for c, files in enumerate(_chunks(update_files))]
    units = shares(disc.of_kind("trajectories"), ex.rows_per_share)
    refs = [task.remote(job_ref, i, s, stores) for i, s in enumerate(units)]
    _note(ray, ex)
    columns: list[pl.DataFrame] = []
    first: dict[int, int] = {}
    for got in ray.get(reads):  # the update files' problems come before the trajectory files', as read locally
        work.broken += got["broken"]
        columns += [pl.DataFrame(schema=s) for _, s in got["schemas"]]
        first.update((i, n) for i, n in got["counts"])
    updates = pl.concat(columns, how="diagonal_relaxed") if columns else None  # the records' columns, no row
    if updates is None:
        job = replace(job, by_update=(), routed=())  # the update checks lack their input: the runner says so
    if any(_reads_updates(r) for r in kept):  # a check on the driver reads update records: it gets them
        updates = read_updates(update_files, [], work.cfg.max_row_group_bytes, work.cfg.waived())
    total = 0
    for i in sorted(first):  # each read file's first record in the log's update records
        first[i], total = total, total + first[i]
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
    base = LogView(pl.DataFrame(), updates, work.broken, [f.path for f in update_files], {})
    view = _Gathered(base, lambda: _align(_concat(ray.get([r[1] for r in refs])), cols), rows) if kept else base
    job_ref = ray.put(job)
    pending = _keyed_stage(ray, job_ref, job, schema, stores)
    if job.by_update or job.routed:
        env = {"columns": dict(updates.schema) if updates is not None else {}, "broken": list(work.broken)}
        env["update_files"] = [f.path for f in update_files]
        steps = {
            "listed": updates is not None and "trajectory_ids" in updates.columns,
            "dtype": updates.schema.get("update_step") if updates is not None else None,
            "first": first,
        }
        pending.update(_update_stage(ray, job_ref, job, schema, stores, env, steps, ex))
    _note(ray, ex)
    outcomes = {code: [o[code] for o in ray.get(p) if o is not None] for code, p in pending.items()}
    swap = {code: (_replayed(runner.rules[code], o), _sized(base, rows)) for code, o in outcomes.items()}
    runner.check_log(view, unusable=not rows, swap=swap)
    return Done(rows, tokens, view.stats)


def _reads_updates(rule: Rule) -> bool:
    return any(q.startswith("updates") for q in rule.reads)


def _sub(schema: dict[str, pl.DataType], reads: frozenset[str]) -> dict[str, pl.DataType]:
    return {c: t for c, t in schema.items() if c in reads or c in _KEEP}


def _keyed_stage(ray: Any, job_ref: Any, job: Job, schema: dict, stores: Stores) -> dict[str, list[Any]]:
    """Submit the checks of each key, one task per partition: each code's tasks."""
    task = ray.remote(check_partition)
    out: dict[str, list[Any]] = {}
    for g, k in enumerate(job.keyed):
        codes = tuple(c for c in k.codes if c not in job.routed)
        if codes:
            sub = _sub(schema, k.reads)
            kinds = (f"key{g}",)
            keep = kinds if k.key == _ID else ()  # the routing tasks read them too
            tasks = [task.remote(job_ref, codes, sub, stores.take(i, kinds, keep)) for i in range(job.n_parts)]
            out.update((code, tasks) for code in codes)
    return out


def _update_stage(
    ray: Any, job_ref: Any, job: Job, schema: dict, stores: Stores, env: dict, steps: dict, ex: RayExecutor
) -> dict[str, list[Any]]:
    """Route every named row to the partitions of the updates that name it (one task per
    trajectory partition, which also runs `job.routed`), then submit the update-partitioned
    checks, one task per update partition: each code's tasks."""
    n = job.n_parts
    sub = _sub(schema, job.keyed[job.route].reads)
    kinds, keep = (f"key{job.route}", "members"), (f"key{job.route}",)  # S002 and P504 read the rows too
    routed = [ray.remote(route).remote(job_ref, sub, steps, i, stores, stores.take(i, kinds, keep)) for i in range(n)]
    out = {code: routed for code in job.routed}
    if job.by_update:
        ray.wait(routed, num_returns=n, fetch_local=False)  # every routed row is stored
        _note(ray, ex)
        task = ray.remote(check_updates)
        held = ("last", "routed", "updates")
        tasks = [task.remote(job_ref, j, sub, env, stores.take(j, held)) for j in range(n)]
        out.update((code, tasks) for code in job.by_update)
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
