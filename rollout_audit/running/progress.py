"""A progress bar on stderr for long audits, only when stderr is a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from ..reading.io import LogFile


class Progress:
    """Counts trajectories audited; `advance` and `stop` are all the engine calls."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self._p: Any = RichProgress(
            TextColumn("auditing"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("trajectories"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._p.add_task("audit", total=total)
        self._p.start()

    def advance(self, n: int) -> None:
        self._p.advance(self._task, n)

    def stop(self) -> None:
        self._p.stop()


def progress_for(files: Sequence[LogFile]) -> Progress | None:
    """A bar for audits expected to take more than a couple of seconds (more than ~8,000
    trajectories by the footers' row counts, or ~25 MB of Parquet), else None."""
    if not files or not sys.stderr.isatty() or os.environ.get("ROLLOUT_AUDIT_NO_PROGRESS"):
        return None
    rows = sum(f.num_rows for f in files)
    try:
        size = sum(os.path.getsize(f.path) for f in files if f.table is None)
    except OSError:
        size = 0
    if rows <= 8_000 and size <= 25 * 2**20:
        return None
    return Progress(rows)
