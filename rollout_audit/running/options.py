"""How to run one audit: what the CLI (or a caller) decides, in one frozen, keyword-only object
that goes to the engine unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..contract.errors import ConfigError
from ..contract.registry import Rule


@dataclass(frozen=True, kw_only=True)
class Options:
    """`select` / `ignore`: codes or prefixes, on top of the configuration's. `batch_rows`: rows
    per batch at most. `executor`: where the checks run (a registered name such as `threads` or
    `ray`, or an executor object); `workers`: batches checked at once by `threads`, or CPUs of a
    Ray cluster started here. `ray`: shorthand for the `ray` executor, True or a cluster's
    address. `tune`: change glibc's process-wide allocator settings for speed (the CLI sets it).
    `pipeline`: decode the next batch on Arrow's thread pool, on a reader thread, while the
    checks of the current batch run (on a machine of one CPU, or with False, or with the
    environment's ROLLOUT_AUDIT_NO_THREADS=1, everything runs on the calling thread; the
    findings are the same). `rules`: replaces the catalogue."""

    select: Sequence[str] = ()  # kept as a tuple
    ignore: Sequence[str] = ()  # kept as a tuple
    batch_rows: int = 2048
    workers: int = 1
    executor: Any = "threads"
    ray: str | bool | None = None
    tune: bool = False
    pipeline: bool = True
    rules: dict[str, Rule] | None = None

    def __post_init__(self) -> None:
        for name in ("select", "ignore"):  # lists and None from callers, kept as tuples
            value: Sequence[str] | None = getattr(self, name)
            if isinstance(value, str):  # tuple("R409") would be four one-letter prefixes
                raise ConfigError(f"{name}: a list of codes, not the string {value!r} (write [{value!r}])")
            object.__setattr__(self, name, tuple(value or ()))

    @property
    def executor_name(self) -> Any:
        """The executor to use: `ray` when the shorthand is set, else `executor`."""
        return "ray" if self.ray else self.executor

    @property
    def executor_options(self) -> dict[str, Any]:
        """What the chosen executor is built with (each takes what it knows)."""
        address = None if self.ray in (None, True, False) else str(self.ray)
        return {"workers": self.workers, "address": address, "num_cpus": self.workers if self.workers > 1 else None}
