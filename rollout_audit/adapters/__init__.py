"""Adapters: a trainer's own per-sample records (its field names, tensors as plain lists) to
contract tables. Each module `rollout_audit.adapters.<name>` exposes

    to_contract(records: Iterable[dict], **context) -> pyarrow.Table
    updates(records: Iterable[dict], **context) -> pyarrow.Table | None   (optional)

Adapters record, never invent: only values the framework recorded reach the log; placeholders
become nulls and what the framework does not say stays absent (or "unknown")."""

from __future__ import annotations

import importlib
from types import ModuleType

from .base import AdapterError

NAMES = ("verl", "skyrl", "slime", "rllm", "verifiers", "openai")


def load(name: str) -> ModuleType:
    """The adapter module for a framework name; AdapterError for an unknown name."""
    if name not in NAMES:
        raise AdapterError(f"unknown framework {name!r}; choose one of {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


__all__ = ["NAMES", "AdapterError", "load"]
