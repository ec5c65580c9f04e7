"""Adapters: a trainer's own per-sample records (its field names, tensors as plain lists) to
contract tables. An adapter is an `Adapter`: a name, `to_contract(records, **context)` and,
when the trainer records its updates, `updates(records, **context)`. Adapters are registered by
name, as the executors are (`register_adapter`); the built-in ones are the modules
`rollout_audit.adapters.<name>`, each exposing those two functions, and `read_dump(paths)` when its
framework writes files that are not JSON Lines or Parquet (prime-rl's msgpack batches,
rllm-model-gateway's SQLite store).

Adapters record, never invent: only values the framework recorded reach the log; placeholders
become nulls and what the framework does not say stays absent (or "unknown")."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from .base import AdapterError

Records = Iterable[Mapping[str, Any]]
Dumped = tuple[list[Path], list[Path], list[Mapping[str, Any]]]


@dataclass(frozen=True)
class Adapter:
    """One framework's conversion: its trajectory records, and its update records when it has them."""

    name: str
    to_contract: Callable[..., pa.Table]
    updates: Callable[..., pa.Table | None] | None = None
    # (dump files read, other files found, records) of the paths, for a framework whose files are
    # not JSON Lines or Parquet; None: `base.dump_files` and `base.read_records`
    read_dump: Callable[[Sequence[str | os.PathLike]], Dumped] | None = None


def _module(name: str) -> Callable[[], Adapter]:
    def build() -> Adapter:
        m = importlib.import_module(f"{__name__}.{name}")
        return Adapter(name, m.to_contract, getattr(m, "updates", None), getattr(m, "read_dump", None))

    return build


_REGISTRY: dict[str, Callable[[], Adapter]] = {
    n: _module(n) for n in ("verl", "skyrl", "slime", "rllm", "verifiers", "openai", "trl")
}
_REGISTRY["nemo_gym"] = _module("nemo_gym")
_REGISTRY["prime_rl"] = _module("prime_rl")
_REGISTRY["rllm_gateway"] = _module("rllm_gateway")
_REGISTRY["agent_lightning"] = _module("agent_lightning")
_REGISTRY["art"] = _module("art")
NAMES = tuple(_REGISTRY)


def register_adapter(name: str, factory: Callable[[], Adapter]) -> None:
    """Make `--from NAME` (and `audit(framework=NAME)`) convert with the adapter `factory` builds."""
    global NAMES
    _REGISTRY[name] = factory
    NAMES = tuple(_REGISTRY)


def load(name: str) -> Adapter:
    """The adapter of a framework name; AdapterError for an unknown name."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise AdapterError(f"unknown framework {name!r}; choose one of {', '.join(_REGISTRY)}")
    return factory()


__all__ = ["NAMES", "Adapter", "AdapterError", "load", "register_adapter"]
