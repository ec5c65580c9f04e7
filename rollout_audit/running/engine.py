"""The audit engine: derive a reading plan from what the selected checks declare, stream
batches through the batch checks, keep one small per-trajectory summary for the log checks,
and gather everything into a Report. The engine holds no knowledge of any particular check."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ..contract.config import Config, find_config
from ..contract.registry import Rule
from ..frames.batch import TOKEN_LISTS, Batch
from ..frames.views import LogView
from ..reading import storage
from ..reading.io import Discovery, discover
from ..reading.read import Part, memory_file, parts, read_updates
from ..reporting.report import Report, build_report
from .concurrency import map_ordered, prefetch
from .memory import release_memory, tune_allocator
from .progress import progress_for
from .runner import Plan, Runner, plan

_PREFETCH = not os.environ.get("ROLLOUT_AUDIT_NO_THREADS")  # read ahead on a background thread


BATCH_TOKENS = 1 << 21  # tokens per batch at most (one trajectory may exceed it alone)


def _batches(
    files: Sequence[Any], p: Plan, batch_rows: int, broken: list[tuple[str, str]], cfg: Config
) -> Iterator[Batch]:
    """Batches of the files' rows, at most `batch_rows` rows and `BATCH_TOKENS` tokens each:
    memory follows tokens, and episodes of 20k tokens in row groups sized for 600 would make
    batches thirty times larger. Consecutive small parts of different files share a batch: each
    batch costs some hundred polars calls whatever its size, so a log of many small files would
    otherwise pay that per file."""
    pending: list[Part] = []
    rows = tokens = 0
    read = parts(files, p.columns, batch_rows, broken, cfg.max_row_group_bytes, cfg.max_tokens_per_trajectory)
    for part, k in (piece for whole in read for piece in _by_tokens(whole)):
        n = part.table.num_rows
        small = not part.problems and 0 < n <= batch_rows // 2 and k <= BATCH_TOKENS // 2
        if pending and (not small or rows + n > batch_rows or tokens + k > BATCH_TOKENS or not _same(pending[0], part)):
            yield from _merged(pending, p)
            pending, rows, tokens = [], 0, 0
        if small:
            pending.append(part)
            rows, tokens = rows + n, tokens + k
        else:
            yield Batch(part.table, part.file, part.first_row, part.problems, p.turn_fields)
    yield from _merged(pending, p)


def _token_lengths(table: pa.Table) -> np.ndarray | None:
    """Tokens of each row, from the first token list the table has (None when it has none)."""
    name = next((c for c in TOKEN_LISTS if c in table.column_names), None)
    if name is None:
        return None
    return pc.list_value_length(table.column(name)).fill_null(0).to_numpy().astype(np.int64)


def _by_tokens(part: Part) -> Iterator[tuple[Part, int]]:
    """`part` in consecutive slices of at most `BATCH_TOKENS` tokens (a longer row stays whole),
    each with its token count; the file's problems go with the first slice."""
    lengths = _token_lengths(part.table)
    total = 0 if lengths is None else int(lengths.sum())
    if lengths is None or total <= BATCH_TOKENS:
        yield part, total
        return
    ends = np.cumsum(lengths)
    start, problems = 0, part.problems
    while start < len(lengths):
        base = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, base + BATCH_TOKENS, side="right")), start + 1)
        piece = Part(part.table.slice(start, stop - start), part.file, part.first_row + start, problems)
        yield piece, int(ends[stop - 1]) - base
        start, problems = stop, []


def _same(a: Part, b: Part) -> bool:
    return a.table.schema.equals(b.table.schema)


def _merged(pending: list[Part], p: Plan) -> Iterator[Batch]:
    """One batch of several files' parts, or each part alone when trajectory ids collide
    between them (findings are attributed to files by id)."""
    if not pending:
        return
    if len(pending) == 1:
        part = pending[0]
        yield Batch(part.table, part.file, part.first_row, part.problems, p.turn_fields)
        return
    table = pa.concat_tables([q.table for q in pending]).combine_chunks()
    ids = table.column("trajectory_id") if "trajectory_id" in table.column_names else None
    if ids is None or ids.null_count or pc.count_distinct(ids).as_py() < table.num_rows:
        for q in pending:
            yield Batch(q.table, q.file, q.first_row, q.problems, p.turn_fields)
        return
    sources = [(q.file, q.first_row, q.table.num_rows) for q in pending]
    yield Batch(table, pending[0].file, 0, [], p.turn_fields, sources)


def run_audit(
    disc: Discovery,
    cfg: Config | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    batch_rows: int = 2048,
    *,
    tune: bool = False,
    workers: int = 1,
    rules: dict[str, Rule] | None = None,
    ray: str | bool | None = None,
) -> Report:
    """Audit the files of `disc` (Parquet files, or in-memory tables held by `LogFile`s).

    `tune` (the CLI sets it) changes glibc's process-wide allocator settings for speed.
    `workers` batches are checked at once on threads (polars, Arrow and most numpy kernels
    release the GIL). Reading runs one batch ahead. `rules` replaces the registered catalogue.
    `ray`: run on a Ray cluster (True, or its address; `workers` CPUs when one is started here).
    """
    cfg = cfg or Config().with_source("defaults")
    if ray:
        from .distributed import run_audit_ray

        address, cpus = None if ray is True else str(ray), workers if workers > 1 else None
        return run_audit_ray(disc, cfg, select, ignore, batch_rows, address=address, num_cpus=cpus, rules=rules)
    if tune:
        tune_allocator()
    runner = Runner(cfg, select, ignore, rules=rules)
    p = plan(runner)
    broken = list(disc.broken)
    files = disc.of_kind("trajectories")
    for f in disc.files:
        runner.declare(f.schema.metadata)
    batches: Iterator[Batch] = _batches(files, p, batch_rows, broken, cfg)
    if _PREFETCH and not all(f.table is not None for f in files):
        batches = prefetch(batches)
    updates = read_updates(disc.of_kind("updates"), broken, cfg.max_row_group_bytes)
    want_summary = bool(runner.log_rules)
    rows = tokens = 0
    summaries: list[pl.DataFrame] = []
    bar = progress_for(files)

    def check(b: Batch) -> tuple[int, int, pl.DataFrame | None]:
        runner.note_batch(b)
        for r in runner.batch_rules:
            runner.apply_batch(r, b)
        n, k = b.n, int(np.clip(b.lengths["token_source"], 0, None).sum()) if "token_source" in b.columns else 0
        summary = b.summary(p.summary) if want_summary else None
        b.release()
        return n, k, summary

    try:
        for n, k, summary in map_ordered(check, batches, workers):
            rows += n
            tokens += k
            if summary is not None:
                summaries.append(summary)
            if bar is not None:
                bar.advance(n)
    finally:
        if bar is not None:
            bar.stop()
    if tune:
        release_memory()  # the batches' buffers go back to the OS before the log checks allocate
    # one chunk: polars string kernels panic on some multi-chunk inputs (E802 split over partitions)
    traj = pl.concat(summaries, how="diagonal_relaxed", rechunk=True) if summaries else pl.DataFrame()
    del summaries
    view = LogView(traj, updates, broken, [f.path for f in disc.of_kind("updates")], {})
    usable = None if rows else _why_unusable(disc, broken)
    # checks that share cached frames (the same declared inputs) run one after the other, and
    # the frames are dropped after the last of them: the log phase holds one set at a time
    first = {frozenset(r.reads): i for i, r in reversed(list(enumerate(runner.log_rules)))}
    log_rules = sorted(runner.log_rules, key=lambda r: first[frozenset(r.reads)])
    last_reader = {frozenset(r.reads): i for i, r in enumerate(log_rules)}
    for i, r in enumerate(log_rules):
        # nothing read and nothing unreadable (an updates folder alone): only file-level checks,
        # not one U605 per batch member; with unreadable files U605 folds into one line naming them
        if usable is None or broken or not r.requires:
            runner.apply_log(r, view)
        if last_reader[frozenset(r.reads)] == i:  # frames shared by checks with these inputs: done
            view.cache.pop(frozenset(r.reads), None)
            if tune:
                release_memory()
    return build_report(runner, rows=rows, tokens=tokens, stats=view.stats, cfg=cfg, unusable=usable)


def _why_unusable(disc: Discovery, broken: list[tuple[str, str]]) -> str:
    """One line: why no trajectory row could be audited."""
    n_traj = len(disc.of_kind("trajectories"))
    if not n_traj and not broken:
        return "the log holds no trajectory records"
    if broken and not n_traj:
        return f"no readable trajectory file ({len(broken)} file{'s' * (len(broken) != 1)} unusable: see S005)"
    return "the trajectory files hold no rows"


def _to_arrow(x: Any, kind: str = "trajectories") -> pa.Table | None:
    if x is None or isinstance(x, pa.Table):
        return x
    if isinstance(x, pa.RecordBatch):
        return pa.Table.from_batches([x])
    if isinstance(x, pl.DataFrame):
        return x.to_arrow()
    if isinstance(x, pl.LazyFrame):
        return x.collect().to_arrow()
    if isinstance(x, list):
        from ..reading.records import records_to_table

        return records_to_table(x, kind)
    raise TypeError(f"cannot audit an object of type {type(x).__name__}")


def memory_discovery(trajectories: Any = None, updates: Any = None) -> Discovery:
    """In-memory tables (pyarrow, polars, or lists of dicts) as the files of a log."""
    disc = Discovery()
    for x, kind in ((trajectories, "trajectories"), (updates, "updates")):
        t = _to_arrow(x, kind)
        if t is not None:
            disc.files.append(memory_file(t, kind))
    return disc


def audit_tables(
    trajectories: Any = None,
    updates: Any = None,
    *,
    config: Config | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> Report:
    """Audit in-memory tables (pyarrow Tables, polars DataFrames, or lists of dicts)."""
    return run_audit(memory_discovery(trajectories, updates), config, select, ignore)


def audit(
    source: Any,
    updates: Any = None,
    *,
    config: Config | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    ray: str | bool | None = None,
) -> Report:
    """Audit a path (file or directory, local or `s3://`, `gs://`), a list of paths, a scanned
    `Log`, or in-memory tables. `ray=True` (or a cluster address) runs it on Ray.

    The configuration of a path is found as `rollout-audit check` finds it: the nearest
    `pyproject.toml` with a `[tool.rollout-audit]` table at or above the (first) path. `config=`
    replaces it. In-memory tables use `config=` or the defaults.

    A training loop can call `audit(batch_table, update_table)` before the optimizer step.
    """
    from ..reading.log import Log

    if isinstance(source, Log):
        return run_audit(source.discovery, config, select, ignore, ray=ray)
    if isinstance(source, (str, os.PathLike)) or (
        isinstance(source, (list, tuple)) and source and all(isinstance(s, (str, os.PathLike)) for s in source)
    ):
        paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        if config is None:
            config = find_config(None, start=os.fspath(paths[0]))[0]
        storage.set_timeouts(config.storage_connect_timeout, config.storage_request_timeout)
        return run_audit(discover(paths), config, select, ignore, ray=ray)
    if ray:
        return run_audit(memory_discovery(source, updates), config, select, ignore, ray=ray)
    return audit_tables(source, updates, config=config, select=select, ignore=ignore)
