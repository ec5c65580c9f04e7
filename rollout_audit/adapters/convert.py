"""A trainer's dump as contract tables: its records converted by the framework's adapter, with the
dump record each trajectory came from (`dump.jsonl:17`) and the trainer settings the adapter derived.
The audit of a conversion (its tables in memory, findings relabelled to the dump) is the
session's (rollout_audit.session)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..contract.errors import AdapterError
from . import load
from .base import META_INCOMPLETE, META_ORIGINS, META_TRAINER_SETTINGS, dump_files, read_records
from .exchanges import with_calls
from .openai import recorded_calls


@dataclass(frozen=True)
class Converted:
    """Contract tables converted from dump files, and the dump record of each trajectory row."""

    trajectories: pa.Table
    updates: pa.Table | None
    origins: list[str | None]  # per trajectory row: "FILE:LINE" of the record it was built from
    sources: tuple[str, ...]  # the dump paths, as given
    settings_said: str | None = (
        None  # the trainer settings the adapter assumed, in one sentence (from the trainer's configuration)
    )
    settings: Mapping[str, Any] = field(default_factory=dict)  # the audit settings those trainer settings imply
    files: tuple[str, ...] = ()  # every dump file read
    skipped: tuple[str, ...] = ()  # the files of a dump directory that are not dump files (named, not read)
    incomplete: str | None = None  # the recorded sessions left out, their capture incomplete (one line)

    def tables(self) -> tuple[pa.Table, pa.Table | None]:
        """The tables without the origins (what a contract log file holds)."""
        return _plain(self.trajectories), None if self.updates is None else _plain(self.updates)


def _plain(table: pa.Table) -> pa.Table:
    meta = {
        k: v
        for k, v in (table.schema.metadata or {}).items()
        if k not in (META_ORIGINS, META_TRAINER_SETTINGS, META_INCOMPLETE)
    }
    return table.replace_schema_metadata(meta)


def convert(
    framework: str,
    paths: Sequence[str | os.PathLike],
    context: Mapping[str, Any],
    calls: Sequence[str | os.PathLike] = (),
) -> Converted:
    """The dump files at `paths` as contract tables, through the adapter of `framework`; with `calls`,
    the recordings of `rollout-audit capture` (or OpenAI request/response lines) whose engine calls are
    joined to the trainer's rows by their token prefix (`exchanges.with_calls`)."""
    adapter = load(framework)
    if adapter.read_dump is not None:
        files, other, records = adapter.read_dump(paths)
        listed = [(files, other)]
    else:
        listed = [dump_files(p) for p in paths]
        files = [f for found, _ in listed for f in found]
        records = [r for f in files for r in read_records(f)]
    try:
        trajectories = adapter.to_contract(records, **context)
        updates = adapter.updates(records, **context) if adapter.updates else None
    except AdapterError as e:  # a message that names no dump file names the one(s) converted
        if any(str(p) in str(e) for p in paths):
            raise
        raise AdapterError(f"{', '.join(str(p) for p in paths)}: {e}") from None
    raw = (trajectories.schema.metadata or {}).get(META_ORIGINS)
    origins = json.loads(raw) if raw else [None] * trajectories.num_rows
    if calls:
        captured = [f for p in calls for f in dump_files(p)[0]]
        recorded = recorded_calls(r for f in captured for r in read_records(f))
        trajectories = with_calls(trajectories, recorded, origins)
        files = [*files, *captured]
    declared = json.loads((trajectories.schema.metadata or {}).get(META_TRAINER_SETTINGS) or b"{}")
    sources = tuple(str(p) for p in paths)
    skipped = tuple(str(f) for _, other in listed for f in other)
    return Converted(
        trajectories,
        updates,
        origins,
        sources,
        declared.get("said"),
        declared.get("settings", {}),
        tuple(map(str, files)),
        skipped,
        incomplete.decode() if (incomplete := (trajectories.schema.metadata or {}).get(META_INCOMPLETE)) else None,
    )


__all__ = ["Converted", "convert"]
