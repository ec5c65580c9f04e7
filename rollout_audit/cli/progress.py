"""A progress line on stderr while logs are audited: on a terminal only, shown once the work has
taken a couple of seconds, and gone when it ends, so that what stays on screen is the report alone.

Machine formats (json, github, junit, sarif) and redirected output never get one: `enabled` is the
caller's statement that stderr is a terminal and the report is text meant for a person."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console

DELAY = 2.0  # seconds of work before the line appears: a quick audit never flickers one
DELAY_VARIABLE = "ROLLOUT_AUDIT_PROGRESS_DELAY"  # overrides DELAY, in seconds (0: draw at once)


class Steps(Protocol):
    def __call__(self, label: str) -> None: ...


@contextmanager
def progress(
    total: int, *, enabled: bool, delay: float | None = None, console: Console | None = None
) -> Iterator[Steps]:
    """A context whose value is `step(label)`: call it before each of `total` logs is audited; the
    line names the log being audited and, for several, how many are done. `console`: the rich
    console to draw on (default: stderr); `delay`: seconds before the line appears (default:
    $ROLLOUT_AUDIT_PROGRESS_DELAY, else DELAY)."""
    if not enabled:
        yield lambda label: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if delay is None:
        delay = delay_from_environment()
    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total > 1:
        columns += [BarColumn(), MofNCompleteColumn()]
    bar = Progress(*columns, TimeElapsedColumn(), console=console or Console(stderr=True), transient=True)
    task = bar.add_task("auditing", total=total)
    started = [False]

    def step(label: str) -> None:
        if started[0]:
            bar.advance(task)
        started[0] = True
        bar.update(task, description=f"auditing {label}")

    timer = threading.Timer(delay, bar.start)
    timer.daemon = True
    if delay > 0:
        timer.start()
    else:
        bar.start()
    try:
        yield step
    finally:
        timer.cancel()
        if timer.is_alive():
            timer.join()  # the line is never started after the work ended
        bar.stop()


def delay_from_environment() -> float:
    """$ROLLOUT_AUDIT_PROGRESS_DELAY when it is a number of seconds >= 0, else DELAY."""
    import math
    import os

    try:
        value = float(os.environ.get(DELAY_VARIABLE, DELAY))
    except ValueError:
        return DELAY
    return value if math.isfinite(value) and value >= 0 else DELAY
