"""A Ray connection for one command: started (or joined) without Ray's own log lines, so that only
the audit's output is printed; the executor runs on this connection, which ends with the command."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .options import Options

__all__ = ["quiet_ray"]


@contextlib.contextmanager
def quiet_ray(opts: Options) -> Iterator[None]:
    """`--ray` (with or without `-q`): Ray started (or joined) here without its own log lines (the token notice,
    "Started a local Ray instance", its workers' output), so that only the findings are printed;
    the executor runs on this connection, which ends with the command. Without Ray installed, the
    executor says so as usual."""
    if not opts.ray:
        yield
        return
    try:
        import ray
    except ImportError:
        yield
        return
    if ray.is_initialized():
        yield
        return
    import logging

    where = opts.executor_options
    own = logging.getLogger("ray")
    level = own.level
    if where["address"]:
        ray.init(address=where["address"], log_to_driver=False, logging_level=logging.ERROR)
    else:
        ray.init(num_cpus=where["num_cpus"], include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        yield
    finally:
        ray.shutdown()
        own.setLevel(level)  # the process's logging as it was (the command may run inside a test)
