"""Overlapping reading with checking: a read-ahead thread, and ordered mapping over threads."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
_DONE = object()


def map_ordered(func: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """`map(func, items)` with up to `workers` calls in flight on threads, results in order."""
    if workers <= 1:
        yield from map(func, items)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="rollout-audit-check") as ex:
        pending: deque[Future[R]] = deque()
        for x in items:
            pending.append(ex.submit(func, x))
            while len(pending) >= workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def prefetch(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Yield from `items`, produced on a background thread up to `depth` items ahead, so that
    reading row group i+1 overlaps the checks of batch i. Errors re-raise on the consumer."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(x: Any) -> bool:
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
