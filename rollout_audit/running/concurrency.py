"""Overlapping reading with checking: a read-ahead thread, ordered mapping over threads, and the
tasks of one step spread over the calling thread and a pool."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
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


def spread(tasks: Sequence[Callable[[], R]], pool: Executor | None, helpers: int = 1) -> list[R]:
    """Every task's result, in the order of `tasks`: run on the calling thread and on `helpers`
    of the pool's threads at once, each thread taking the next task not yet taken (so put the longest
    first). Without a pool, one after the other here. The first task's error (in that order) is
    re-raised once every task is done."""
    if pool is None or len(tasks) < 2:
        return [t() for t in tasks]
    results: list[Any] = [_DONE] * len(tasks)
    errors: list[BaseException | None] = [None] * len(tasks)
    order = iter(range(len(tasks)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                return
            try:
                results[i] = tasks[i]()
            except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
                errors[i] = e

    running = [pool.submit(work) for _ in range(max(1, helpers))]
    work()
    for h in running:
        h.result()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


def prefetch(items: Iterator[T], held: int = 2) -> Iterator[T]:
    """Yield from `items`, produced on a background thread, so that reading batch i+1 overlaps
    the checks of batch i. At most `held` items exist at once, counting the one being produced
    and the one the consumer holds until it asks for the next: with the default two, the reader
    decodes one batch ahead and then waits (a double buffer: two batches in memory, not three).
    Errors re-raise on the consumer."""
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    slots = threading.Semaphore(max(1, held))  # items produced and not yet done with
    stop = threading.Event()

    def acquire() -> bool:
        while not stop.is_set():
            if slots.acquire(timeout=0.1):
                return True
        return False

    def produce() -> None:
        try:
            while acquire():
                b = next(items, _DONE)
                q.put(b)
                if b is _DONE:
                    return
                del b
        except BaseException as e:  # noqa: BLE001 - re-raised on the consumer side
            q.put(e)

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
            slots.release()  # the consumer is done with its item: the producer may start the one after next
    finally:
        stop.set()
        t.join(timeout=5)
