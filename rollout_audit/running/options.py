"""How to run one audit: what the CLI (or a caller) decides, in one frozen, keyword-only object
that goes to the engine unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..contract.registry import Rule


@dataclass(frozen=True, kw_only=True)
class Options:
    """`select` / `ignore`: codes or prefixes, on top of the configuration's. `batch_rows`: rows
    per batch at most. `executor`: where the checks run (a registered name such as `threads` or
    `ray`, or an executor object); `workers`: batches checked at once by `threads`, or CPUs of a
    Ray cluster started here. `ray`: shorthand for the `ray` executor, True or a cluster's
    address. `tune`: change glibc's process-wide allocator settings for speed (the CLI sets it).
    `rules`: replaces the catalogue."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    batch_rows: int = 2048
    workers: int = 1
    executor: Any = "threads"
    ray: str | bool | None = None
    tune: bool = False
    rules: dict[str, Rule] | None = None

    def __post_init__(self) -> None:
        for name in ("select", "ignore"):  # lists and None from callers, kept as tuples
            value: Sequence[str] | None = getattr(self, name)
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
