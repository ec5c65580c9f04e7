"""The audit engine: stream row-group batches through the batch checks, keep one small
per-trajectory summary for the log checks, and gather findings into a Report."""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from . import schema as S
from .batch import Batch
from .config import Config
from .io import Discovery, LogFile, discover, iter_batches
from .registry import NotRun, Rule, all_rules, selected
from .report import FINDING_SCHEMA, Report, build_report

_PREFETCH = not os.environ.get("ROLLOUT_AUDIT_NO_THREADS")  # read ahead on a background thread
_DEBUG = bool(os.environ.get("ROLLOUT_AUDIT_DEBUG"))  # re-raise check crashes (tests set this)


@dataclass
class LogView:
    """What log-level checks see: per-trajectory summaries of the whole log, and updates."""

    traj: pl.DataFrame
    updates: pl.DataFrame | None
    broken: list[tuple[str, str]]
    update_files: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)  # statistics a check wants in the JSON summary
    cache: dict = field(default_factory=dict)  # frames several log checks share (built once per audit)

    def has(self, req: str) -> bool:
        if req == "updates":
            return self.updates is not None
        if req.startswith("updates."):
            return self.updates is not None and req[8:] in self.updates.columns
        if req.startswith("turns."):  # turn fields reach the summary only as aggregates
            return _TURN_AGGREGATES.get(req, "") in self.traj.columns
        return req in self.traj.columns


_TURN_AGGREGATES = {"turns.policy_version": "pv_min"}

# Columns of the per-trajectory summary that log checks read beyond their `requires` (optional
# inputs, ids, flags and the counts of the update checks). The summary keeps only these and
# the selected log rules' requirements, so that it stays small (it grows with the log).
_LOG_READS = frozenset(
    {
        "trajectory_id",
        "file",
        "ok",
        "n_turns",
        "task_id",
        "group_id",
        "reward",
        "truncated",
        "infra_error",
        "stop_reason",
        "verifier_success",
        "n_trainable",
        "n_tokens",
        "n_policy",
        "n_turns_trainable",
        "pv_min",
        "pv_max",
        "n_versions",
        "environment_id",
        "environment_version",
        "verifier_version",
        "reset_seed",
        "initial_state_id",
        "initial_state_checksum",
    }
)
# Turn fields read by batch checks beyond their `requires` (optional inputs)
_TURN_READS = frozenset({"turn_id", "finish_reason", "shaping", "policy_version"})


# ---------------------------------------------------------------- schema handling


def _cast_column(name: str, found: pa.DataType, table: str) -> tuple[pa.DataType | None, str | None]:
    """(target type, problem): the contract type to cast to, or why the column is unusable."""
    spec = {c.name: c for c in S.columns(table)}
    if name not in spec:
        return None, None  # unknown columns are ignored
    if name == "turns":
        if not (pa.types.is_list(found) or pa.types.is_large_list(found)) or not pa.types.is_struct(found.value_type):
            return None, f"expected list<struct>, found {found}"
        tspec = {c.name: c for c in S.columns("turn")}
        fields = []
        for f in found.value_type:
            if f.name in tspec and S.compatible(f.type, tspec[f.name].arrow_type):
                fields.append(pa.field(f.name, tspec[f.name].arrow_type))
        return pa.list_(pa.struct(fields)), None
    exp = spec[name].arrow_type
    if not S.compatible(found, exp):
        return None, f"expected {spec[name].type}, found {found}"
    return exp, None


def schema_plan(f: LogFile, table: str = "trajectories") -> tuple[dict[str, pa.DataType], list[tuple[str, str]]]:
    """Columns to read with their target types, and the schema problems (S001) of the file."""
    targets: dict[str, pa.DataType] = {}
    problems: list[tuple[str, str]] = []
    names = set(f.schema.names)
    for c in S.columns(table):
        if c.requirement == "R" and c.name not in names:
            problems.append((c.name, "required column missing"))
    for fld in f.schema:
        tgt, prob = _cast_column(fld.name, fld.type, table)
        if prob:
            problems.append((fld.name, prob))
        elif tgt is not None:
            targets[fld.name] = tgt
    if table == "trajectories" and "turns" in targets:
        have = {x.name for x in targets["turns"].value_type}
        found = {x.name: x.type for x in f.schema.field("turns").type.value_type}
        for tc in S.columns("turn"):
            if tc.name in found and tc.name not in have:
                problems.append((f"turns.{tc.name}", f"expected {tc.type}, found {found[tc.name]}"))
            elif tc.requirement == "R" and tc.name not in found:
                problems.append((f"turns.{tc.name}", "required turn field missing"))
    return targets, problems


def _cast(table: pa.Table, targets: dict[str, pa.DataType]) -> tuple[pa.Table, list[tuple[str, str]]]:
    """Cast each column to its contract type; a column whose values do not fit is dropped."""
    cols, names, problems = [], [], []
    for name in table.column_names:
        tgt = targets[name]
        col = table.column(name)
        if col.type != tgt:
            try:
                col = col.cast(tgt)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                problems.append((name, f"values do not fit {tgt}: {str(e).splitlines()[0]}"))
                continue
        cols.append(col)
        names.append(name)
    return pa.Table.from_arrays(cols, names=names), problems


# ---------------------------------------------------------------- running


def _normalise(df: pl.DataFrame | None, rule: Rule, file: str | None) -> pl.DataFrame | None:
    if df is None or df.height == 0:
        return None
    exprs = []
    for name, dtype in FINDING_SCHEMA.items():
        if name == "code":
            exprs.append(pl.lit(rule.code).alias(name))
        elif name == "severity":
            exprs.append(pl.lit(rule.severity).alias(name))
        elif name == "file" and "file" not in df.columns:
            exprs.append(pl.lit(file, dtype=pl.String).alias(name))
        elif name in df.columns:
            exprs.append(pl.col(name).cast(dtype))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return df.select(exprs)


class _Run:
    """State of one audit: selected rules, findings, where each rule could not run."""

    def __init__(self, cfg: Config, select: Sequence[str] | None, ignore: Sequence[str] | None) -> None:
        self.cfg = cfg
        sel = list(select or []) or list(cfg.select)
        ign = list(ignore or []) + list(cfg.ignore)
        self.rules = {c: r for c, r in all_rules().items() if selected(c, sel, ign)}
        self.findings: list[pl.DataFrame] = []
        self.skipped: dict[str, dict[str, int]] = {}  # code -> reason -> count
        self.ran: dict[str, int] = {}
        self.rows = 0
        self.tokens = 0
        self.stats: dict = {}
        self._lock = threading.Lock()

    def needed_columns(self) -> list[str]:
        cols = {"trajectory_id", *S.required("trajectories")}
        for r in self.rules.values():
            for q in r.requires:
                if not q.startswith("updates"):
                    cols.add(q.split(".")[0])
        # scalar columns are cheap and checks read some as optional inputs (gamma, final_value)
        cols.update(
            c.name for c in S.columns("trajectories") if not c.type.startswith("list") and not c.type.startswith("map")
        )
        return [c.name for c in S.columns("trajectories") if c.name in cols]

    def turn_frame_fields(self) -> frozenset[str]:
        """Turn fields converted into `Batch.turns`: the ones selected rules need (S001 checks
        the domains of the `TurnFrame` fields); strings and lists nobody reads stay in Arrow."""
        need = set(_TURN_READS)
        for r in self.rules.values():
            need.update(q[6:] for q in r.requires if q.startswith("turns."))
        if "S001" in self.rules:
            need.update(_TURN_DOMAIN_FIELDS)
        return frozenset(need)

    def summary_columns(self) -> frozenset[str]:
        cols = set(_LOG_READS)
        for r in self.rules.values():
            if r.scope == "log":
                cols.update(q for q in r.requires if not q.startswith(("updates", "turns.")))
                cols.update(_TURN_AGGREGATES[q] for q in r.requires if q in _TURN_AGGREGATES)
        return frozenset(cols)

    def _skip(self, code: str, why: str) -> None:
        with self._lock:
            reasons = self.skipped.setdefault(code, {})
            reasons[why] = reasons.get(why, 0) + 1

    def apply(self, rule: Rule, target, file: str | None) -> None:
        """Run one rule on a batch or the log view; record findings, or why it did not run.
        Safe to call from several threads at once."""
        missing = [q for q in rule.requires if not target.has(q)]
        if "updates" in missing:
            self._skip(rule.code, "the log has no update records")
            return
        if missing:
            self._skip(rule.code, f"{'column' if len(missing) == 1 else 'columns'} {', '.join(missing)} absent")
            return
        try:
            out = rule.func(target, self.cfg)
        except NotRun as e:  # the check itself says why it cannot run (e.g. needs configuration)
            self._skip(rule.code, str(e))
            return
        except Exception as e:  # a check must never turn bad data into a traceback
            if _DEBUG:
                raise
            self._skip(
                rule.code, f"check failed on this input: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            )
            return
        norm = _normalise(out, rule, file)
        with self._lock:
            self.ran[rule.code] = self.ran.get(rule.code, 0) + 1
            if norm is not None:
                self.findings.append(norm)

    def not_run(self) -> dict[str, str]:
        out = {}
        for code in self.rules:
            reasons = self.skipped.get(code)
            if not reasons:
                if code not in self.ran:
                    out[code] = "no input reached this check (no readable trajectory rows)"
                continue
            why = "; ".join(reasons)
            if code in self.ran:
                out[code] = (
                    f"partly not run ({sum(reasons.values())} of {sum(reasons.values()) + self.ran[code]} batches): {why}"
                )
            else:
                out[code] = why
        return out


_TURN_DOMAIN_FIELDS = (
    "turn_id",
    "policy_version",
    "temperature",
    "top_p",
    "num_policy_tokens",
    "context_length",
    "logprob",
    "reward",
    "shaping",
    "value",
    "td_residual",
    "potential_before",
    "potential_after",
)


def _batches(files: list[LogFile], run: _Run, batch_rows: int) -> Iterable[Batch]:
    want = run.needed_columns()
    tff = run.turn_frame_fields()
    for f in files:
        targets, problems = schema_plan(f)
        cols = [c for c in want if c in targets]
        first = True
        offset = 0
        try:
            parts = iter_batches(f, cols, batch_rows)
            for part in parts:
                part, cast_problems = _cast(part.select([c for c in cols if c in part.column_names]), targets)
                fields = (
                    tuple(x.name for x in part.schema.field("turns").type.value_type)
                    if "turns" in part.column_names
                    else ()
                )
                yield Batch(part, f.path, offset, fields, (problems if first else []) + cast_problems, tff)
                first = False
                offset += part.num_rows
        except (OSError, pa.ArrowException) as e:
            run.broken.append((f.path, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
            continue
        if first:  # an empty file: still report its schema problems
            empty = pa.table({c: pa.array([], targets[c]) for c in cols})
            yield Batch(empty, f.path, 0, (), problems, tff)


def _read_updates(files: list[LogFile], broken: list) -> tuple[pl.DataFrame | None, list[str]]:
    frames = []
    for f in files:
        targets, problems = schema_plan(f, "updates")
        if problems:
            broken.append((f.path, "update records: " + "; ".join(f"{c}: {p}" for c, p in problems)))
            continue
        try:
            t = pa.concat_tables(
                list(iter_batches(f, list(targets), 1 << 30))
                or [pa.table({c: pa.array([], targets[c]) for c in targets})]
            )
            t, cp = _cast(t, targets)
        except (OSError, pa.ArrowException) as e:
            broken.append((f.path, f"{type(e).__name__}: {str(e).splitlines()[0]}"))
            continue
        frames.append(pl.from_arrow(t).with_columns(pl.lit(f.path).alias("file")))
    if not frames:
        return None, []
    return pl.concat(frames, how="diagonal_relaxed"), [f.path for f in files]


def run_audit(
    disc: Discovery,
    cfg: Config | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    batch_rows: int = 2048,
    tables: tuple[pa.Table | None, pa.Table | None] | None = None,
    tune_allocator: bool = False,
    workers: int = 1,
) -> Report:
    """Audit discovered files (or in-memory `tables` = (trajectories, updates)).

    `tune_allocator` (the CLI sets it) changes glibc's process-wide allocator settings for
    speed; a library caller's process is left alone by default. `workers` batches are checked
    at once on threads (polars, Arrow and most numpy kernels release the GIL): 2 is about 15%
    faster and holds one more batch in memory. Reading always runs one batch ahead.
    """
    cfg = cfg or Config()
    if tune_allocator:
        _tune_allocator()
    run = _Run(cfg, select, ignore)
    run.broken = list(disc.broken)
    batch_rules = [r for r in run.rules.values() if r.scope == "batch"]
    log_rules = [r for r in run.rules.values() if r.scope == "log"]
    summaries: list[pl.DataFrame] = []
    if tables is None:
        files = disc.of_kind("trajectories")
        batches = _batches(files, run, batch_rows)
        if _PREFETCH:
            batches = _prefetch(batches)
        updates, update_files = _read_updates(disc.of_kind("updates"), run.broken)
    else:
        files = []
        batches = _memory_batches(tables[0], run, batch_rows)
        updates = None if tables[1] is None else _memory_updates(tables[1], run)
        update_files = []
    sum_cols = run.summary_columns()
    progress = _progress(files)

    def check(b: Batch) -> tuple[int, int, pl.DataFrame | None]:
        """Every batch rule on one batch; returns rows, tokens and the batch's summary."""
        n, tokens = b.n, (int(b.tokens.row.size) if b.ok.any() else 0)
        for r in batch_rules:
            run.apply(r, b, b.file)
        summary = b.summary(sum_cols) if log_rules else None
        b.release()
        return n, tokens, summary

    try:
        for n, tokens, summary in _map_ordered(check, batches, workers):
            run.rows += n
            run.tokens += tokens
            if summary is not None:
                summaries.append(summary)
            if progress is not None:
                progress.advance(n)
    finally:
        if progress is not None:
            progress.stop()
    del batches
    if tune_allocator:
        _release_memory()  # the batches' buffers go back to the OS before the log checks allocate
    traj = pl.concat(summaries, how="diagonal_relaxed", rechunk=False) if summaries else pl.DataFrame()
    del summaries
    view = LogView(traj, updates, run.broken, update_files, run.stats)
    for r in log_rules:
        if r.code == "S005" or traj.height or r.requires and all(q.startswith("updates") for q in r.requires):
            run.apply(r, view, None)
    findings = pl.concat(run.findings) if run.findings else pl.DataFrame(schema=FINDING_SCHEMA)
    return build_report(
        findings, run.not_run(), rows=run.rows, tokens=run.tokens, stats=run.stats, cfg=cfg, rules=run.rules
    )


_TUNED = False


def _tune_allocator() -> None:
    """Keep freed numpy buffers in the process instead of returning them to the kernel.

    Each batch allocates and frees the same few arrays of tens of MB; with glibc's defaults
    every one is a fresh mmap whose pages fault in again (expensive under virtualisation: up
    to a third of the audit was system time). A fixed mmap threshold and no heap trimming make
    the next batch reuse the same memory; the peak is unchanged (bounded by the batch).
    Set ROLLOUT_AUDIT_NO_MALLOPT=1 to leave the allocator alone."""
    global _TUNED
    if _TUNED:
        return
    _TUNED = True
    if os.environ.get("ROLLOUT_AUDIT_NO_MALLOPT") or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 512 * 2**20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1024 * 2**20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: keep the platform's defaults
        return


def _release_memory() -> None:
    """Return memory the allocators keep for reuse (glibc heap, Arrow's pool) to the OS."""
    pa.default_memory_pool().release_unused()
    if sys.platform.startswith("linux") and not os.environ.get("ROLLOUT_AUDIT_NO_MALLOPT"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: nothing to trim
            return


def _map_ordered(func, items: Iterable, workers: int) -> Iterator:
    """`map(func, items)` with up to `workers` calls in flight on threads, results in order."""
    if workers <= 1:
        yield from map(func, items)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="rollout-audit-check") as ex:
        pending: deque = deque()
        for x in items:
            pending.append(ex.submit(func, x))
            while len(pending) >= workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


_DONE = object()


def _prefetch(items: Iterator[Batch], depth: int = 1) -> Iterator[Batch]:
    """Yield from `items`, produced (read and decoded) on a background thread up to
    `depth` batches ahead, so that reading row group i+1 overlaps the checks of batch i."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(x) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for b in items:
                if not put(b):
                    return
            put(_DONE)
        except BaseException as e:  # noqa: BLE001 - re-raised on the consumer side
            put(e)

    t = threading.Thread(target=produce, name="rollout-audit-reader", daemon=True)
    t.start()
    try:
        while True:
            x = q.get()
            if x is _DONE:
                break
            if isinstance(x, BaseException):
                raise x
            yield x
            del x
    finally:
        stop.set()
        t.join(timeout=5)


def _progress(files: list[LogFile]):
    """A rich progress bar on stderr for audits expected to take more than a couple of seconds
    (more than ~5M tokens: ~8,000 trajectories of ~600 tokens by the footers' row counts, or
    ~25 MB of Parquet), only when stderr is a terminal."""
    if not files or not sys.stderr.isatty() or os.environ.get("ROLLOUT_AUDIT_NO_PROGRESS"):
        return None
    rows = sum(f.num_rows for f in files)
    try:
        size = sum(os.path.getsize(f.path) for f in files)
    except OSError:
        size = 0
    if rows <= 8_000 and size <= 25 * 2**20:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    p = Progress(
        TextColumn("auditing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("trajectories"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = p.add_task("audit", total=rows)
    p.start()

    class _P:
        def advance(self, n: int) -> None:
            p.advance(task, n)

        def stop(self) -> None:
            p.stop()

    return _P()


def _memory_batches(table: pa.Table | None, run: _Run, batch_rows: int) -> Iterable[Batch]:
    if table is None:
        return
    f = LogFile("<memory>", "trajectories", table.schema, table.num_rows, 1)
    targets, problems = schema_plan(f)
    cols = [c for c in run.needed_columns() if c in targets]
    first = True
    for off in range(0, max(table.num_rows, 1), batch_rows):
        part, cp = _cast(table.select(cols).slice(off, batch_rows), targets)
        fields = (
            tuple(x.name for x in part.schema.field("turns").type.value_type) if "turns" in part.column_names else ()
        )
        yield Batch(part, "<memory>", off, fields, (problems if first else []) + cp, run.turn_frame_fields())
        first = False


def _memory_updates(table: pa.Table, run: _Run) -> pl.DataFrame | None:
    f = LogFile("<memory>", "updates", table.schema, table.num_rows, 1)
    targets, problems = schema_plan(f, "updates")
    if problems:
        run.broken.append(("<memory updates>", "; ".join(f"{c}: {p}" for c, p in problems)))
        return None
    t, _ = _cast(table.select(list(targets)), targets)
    return pl.from_arrow(t).with_columns(pl.lit("<memory>").alias("file"))


def _to_arrow(x, kind: str = "trajectories") -> pa.Table | None:
    if x is None or isinstance(x, pa.Table):
        return x
    if isinstance(x, pa.RecordBatch):
        return pa.Table.from_batches([x])
    if isinstance(x, pl.DataFrame):
        return x.to_arrow()
    if isinstance(x, pl.LazyFrame):
        return x.collect().to_arrow()
    if isinstance(x, list):
        from .io import records_to_table

        return records_to_table(x, kind)
    raise TypeError(f"cannot audit an object of type {type(x).__name__}")


def audit_tables(
    trajectories=None,
    updates=None,
    *,
    config: Config | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> Report:
    """Audit in-memory tables (pyarrow Tables, polars DataFrames, or lists of dicts)."""
    return run_audit(
        Discovery(), config, select, ignore, tables=(_to_arrow(trajectories), _to_arrow(updates, "updates"))
    )


def audit(
    source,
    updates=None,
    *,
    config: Config | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> Report:
    """Audit a path (file or directory), a list of paths, a scanned `Log`, or in-memory tables.

    A training loop can call `audit(batch_table, update_table)` before the optimizer step.
    """
    from .log import Log

    if isinstance(source, Log):
        return run_audit(source.discovery, config, select, ignore)
    if isinstance(source, (str, os.PathLike)) or (
        isinstance(source, (list, tuple)) and source and all(isinstance(s, (str, os.PathLike)) for s in source)
    ):
        paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        return run_audit(discover(paths), config, select, ignore)
    return audit_tables(source, updates, config=config, select=select, ignore=ignore)
