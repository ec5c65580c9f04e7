"""Executors: where the checks of one audit run. An executor is given a `Work` (the runner with
the selected rules, the reading plan, the log's files and update records) and runs every batch
rule on the batches of `reading.batches` (each through `Runner.check_batch`) and every log rule
on the summary (through `Runner.check_log`, with the summary's rows in the log's order: messages
list files in the order they are met); it returns the rows and tokens read and the log's
statistics. The runner records findings and coverage, so the report is the same whichever
executor ran the checks.

Executors are registered by name (`register_executor`), and `audit(..., executor=NAME)` picks
one: `threads` (this process; `workers` batches at once) is registered here, `ray` by
`running.distributed`. An executor never imports the engine."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import polars as pl

from ..contract.config import Config
from ..contract.errors import UsageError
from ..contract.registry import Rule
from ..frames.views import LogView
from ..reading.batches import batches
from ..reading.io import Discovery
from ..reading.read import Part, Problem
from .concurrency import map_ordered, prefetch
from .memory import release_memory
from .progress import progress_for
from .runner import Plan, Runner

_ONE_THREAD = bool(os.environ.get("ROLLOUT_AUDIT_NO_THREADS"))  # read, decode and check on one thread


@dataclass
class Work:
    """One audit, as an executor receives it. `broken` grows with files that fail while read."""

    disc: Discovery
    runner: Runner
    plan: Plan
    cfg: Config
    batch_rows: int
    broken: list[Problem]
    updates: pl.DataFrame | None
    tune: bool = False  # return freed memory to the OS between phases
    select: tuple[str, ...] | None = None  # as given, for executors that build runners elsewhere
    ignore: tuple[str, ...] | None = None
    rules: dict[str, Rule] | None = None
    pipeline: bool = False  # decode on Arrow's thread pool, a batch ahead of the checks (`Options.pipeline`)

    def batches(self, threads: bool = False) -> Iterator[Part]:
        """The trajectory files' batches, read by the one reading pipeline (decoded on Arrow's
        thread pool when `threads`)."""
        files = self.disc.of_kind("trajectories")
        return batches(files, self.plan.columns, self.batch_rows, self.broken, self.cfg, threads=threads)

    def log_view(self, traj: pl.DataFrame) -> LogView:
        """The view log rules get: the per-trajectory summary `traj` and the update records."""
        held = [(f.path, f.table) for f in self.disc.of_kind("trajectories") if f.table is not None]
        memory = dict(held) if len({p for p, _ in held}) == len(held) else {}  # one table per name
        return LogView(
            traj, self.updates, self.broken, [f.path for f in self.disc.of_kind("updates")], {}, memory=memory
        )

    def release(self) -> None:
        if self.tune:
            release_memory()


@dataclass(frozen=True)
class Done:
    """What an executor hands back: trajectories and tokens read, and the log's statistics."""

    rows: int
    tokens: int
    stats: dict


class Executor(Protocol):
    """Runs the checks of one audit (see the module's docstring). An executor whose class sets
    `reads_updates = True` reads the update records itself (`Work.updates` is then None, and
    the problems it meets in update files go to `Work.broken` before those of trajectory files)."""

    def run(self, work: Work) -> Done: ...


_EXECUTORS: dict[str, Callable[..., Executor]] = {}


def register_executor(name: str, factory: Callable[..., Executor]) -> None:
    """Make `audit(..., executor=name)` run on `factory(**options)`."""
    _EXECUTORS[name] = factory


def executor(choice: str | Executor, **options: Any) -> Executor:
    """The executor `choice` names (built with the `options` it accepts), or `choice` itself."""
    if not isinstance(choice, str):
        return choice
    if choice not in _EXECUTORS:
        raise UsageError(f"unknown executor {choice!r} (registered: {', '.join(sorted(_EXECUTORS))})")
    return _EXECUTORS[choice](**options)


class Threads:
    """This process. With `Work.pipeline`, a reader thread decodes the next batch on Arrow's
    thread pool while the checks of the current one run on the calling thread and one more
    (numpy, the native core, polars and Arrow release the GIL), so both cores stay busy; at most
    two batches are in memory (the one checked, the one decoded). Without it, everything runs on
    the calling thread. `workers` batches are checked at once on threads."""

    def __init__(self, workers: int = 1, **_: Any) -> None:
        self.workers = max(1, int(workers))

    def run(self, work: Work) -> Done:
        runner, p = work.runner, work.plan
        files = work.disc.of_kind("trajectories")
        pipeline = work.pipeline and not _ONE_THREAD and not all(f.table is not None for f in files)
        parts = work.batches(threads=pipeline)
        if pipeline:
            parts = prefetch(parts)
        rows = tokens = 0
        summaries: list[pl.DataFrame] = []
        bar = progress_for(files)
        # one batch at a time: its checks spread over this thread and one more (batches at once do without)
        crew = (
            ThreadPoolExecutor(1, thread_name_prefix="rollout-audit-check") if pipeline and self.workers == 1 else None
        )
        try:
            for done in map_ordered(lambda part: runner.check_batch(part, p, crew), parts, self.workers):
                rows += done.rows
                tokens += done.tokens
                if done.summary is not None:
                    summaries.append(done.summary)
                if bar is not None:
                    bar.advance(done.rows)
        finally:
            if crew is not None:
                crew.shutdown()
            if bar is not None:
                bar.stop()
        work.release()  # the batches' buffers go back to the OS before the log checks allocate
        # one chunk: polars string kernels panic on some multi-chunk inputs (E802 split over partitions)
        traj = pl.concat(summaries, how="diagonal_relaxed", rechunk=True) if summaries else pl.DataFrame()
        del summaries
        view = work.log_view(traj)
        runner.check_log(view, unusable=not rows, release=work.release)
        return Done(rows, tokens, view.stats)


register_executor("threads", Threads)
