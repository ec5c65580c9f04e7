"""rllm-model-gateway: its `TraceRecord`s (one captured engine call each) to contract trajectories.

Read from the gateway's SQLite store (`store_worker="sqlite"`: table `traces(trace_id, data JSON,
created_at)`, opened read-only) or from JSON Lines of `TraceRecord.model_dump()` (what
`GatewayClient.get_session_traces` returns). One session is one episode, one trace one turn: the
trace's `prompt_token_ids` is the engine's context, `completion_token_ids` the sampled ids. The
log-probs come from the raw response body when the gateway kept it (one entry per sampled id,
nulls in place), else from the trace's `logprobs`, which the gateway builds by dropping null
entries: a list of another length than the ids is refused, never shifted. A streamed response
keeps no raw body, and with it the engine's `token_id:N` log-prob entries M111 reads: the table
says so. `raw_request` gives temperature and top_p; `weight_version` (the in-repo gateway) the
policy version. The gateway records no outcome: a line `{"session_id", "end": {...}}` (as the
`openai` adapter's end record) or the context gives it."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from .base import (
    MAX_LINE_BYTES,
    AdapterError,
    Record,
    _regular,
    at_record,
    context_values,
    dump_form,
    located,
    mapping,
    need,
    read_records,
    short,
    whole,
    wholes,
)
from .exchanges import Session, aligned_logprobs, entry_logprobs, lacks, table
from .openai import CONTEXT, logprob_ids
from .steps import Call, engine_context, finish_reason, guarded, option

FRAMEWORK = "rllm-model-gateway"
LACKS = lacks(
    FRAMEWORK,
    'add an end line {"session_id": ..., "end": {...}} per session (docs/frameworks/rllm_gateway.md) '
    "or pass --context stop_reason=... / reward=... / policy_version=...",
)
END_FIELDS = ("reward", "policy_version", "stop_reason", "task_id", "group_id")
# data_process.py:54 and :89 (0.1.0) keep only entries whose logprob is not null
DROPS = (
    ": the gateway keeps only non-null log-prob entries (rllm_model_gateway/data_process.py:54) "
    "and kept no raw body to place them by"
)
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
SQLITE_MAGIC = b"SQLite format 3\x00"
_STEPS_PER_BYTE = 400  # SQLite VM steps a store may take per byte of file before the read is stopped


def read_dump(paths: Sequence[str | os.PathLike]) -> tuple[list[Path], list[Path], list[Mapping[str, Any]]]:
    """(files read, other files found, trace records) of the paths: SQLite stores (by their header,
    or a `.db`/`.sqlite` name in a directory) and JSON Lines or Parquet dumps. Hidden files are left
    out, symlinked directories not followed; AdapterError when no store or dump is found."""
    files: list[Path] = []
    other: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            for d, dirs, names in os.walk(p):
                dirs[:] = sorted(x for x in dirs if not x.startswith("."))
                for n in sorted(names):
                    f = Path(d) / n
                    if n.startswith("."):
                        continue
                    known = n.lower().endswith(SQLITE_SUFFIXES) or dump_form(n) is not None
                    (files if known else other).append(f)
        else:
            files.append(p)
    if not files:
        raise AdapterError(f"{', '.join(map(str, paths))}: no SQLite store (*.db) or *.jsonl trace dump")
    records: list[Mapping[str, Any]] = []
    for f in files:
        records += list(_store(f) if _is_sqlite(f) else read_records(f))
    return files, other, records


def _is_sqlite(p: Path) -> bool:
    """Whether `p` starts with SQLite's header (a FIFO or a device is refused unopened: it could block)."""
    _regular(p)
    try:
        with p.open("rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError as e:
        raise AdapterError(f"{p}: cannot read: {e.strerror or e}") from None


def _read_only(p: Path) -> str:
    """The URI parameters that open `p` without writing anything: `mode=ro&immutable=1`, under which
    SQLite takes no lock and opens no file beside the store. A `-wal` or `-journal` file beside it is
    refused: read-only, SQLite would open the `-wal` and create a `-shm` beside the store, or find a
    hot journal it must roll back into the store ("attempt to write a readonly database"); immutable,
    it would read the store without the pages they hold (a store whose writer is still running, or
    crashed mid-transaction)."""
    with p.open("rb") as fh:
        kind = "a WAL-mode store" if fh.read(20)[18:20] == b"\x02\x02" else "a store"
    for side, why in (
        ("-wal", "reading would write beside the store or miss its unmerged pages; stop its writer or checkpoint "
         "it (PRAGMA wal_checkpoint) first"),
        ("-journal", "a transaction its writer left unfinished: reading would roll it back into the store or miss "
         "it; stop its writer, or let sqlite3 finish it, first"),
    ):  # fmt: skip
        if Path(f"{p}{side}").exists():
            raise AdapterError(f"{p}: {kind} with a {p.name}{side} beside it: {why}")
    return "mode=ro&immutable=1"


def _connect(p: Path, spend: Callable[[], int]) -> sqlite3.Connection:
    """The one way a store from an audited directory is opened: read-only and immutable (`_read_only`),
    no extension loaded (neither by the connection nor by the file's schema, whose SQL functions are
    untrusted), no value longer than a dump's line built by SQLite, no database attached, and `spend`
    called every thousand VM steps (it stops a query that asks for more work than the file's size)."""
    try:
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?{_read_only(p)}", uri=True)
    except sqlite3.Error as e:
        raise AdapterError(f"{p}: cannot open the SQLite store read-only: {e}") from None
    try:
        conn.set_progress_handler(spend, 1000)
        conn.text_factory = bytes  # a TEXT value is not decoded by sqlite3 (which fails on bytes not UTF-8)
        if hasattr(conn, "enable_load_extension"):
            conn.enable_load_extension(False)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_LINE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute("PRAGMA query_only = ON")
    except (sqlite3.Error, UnicodeDecodeError) as e:
        conn.close()
        raise AdapterError(f"{p}: cannot read the SQLite store: {short(str(e))}") from None
    return conn


def _store(p: Path) -> Iterator[Record]:
    """The traces of a gateway store in the order the gateway wrote them (created_at, then insertion),
    through `_connect`: `traces` must be a plain table, whose values are the file's bytes (a generated
    column computes its value on read: `zeroblob(10**9)` is a gigabyte from a few bytes)."""
    budget = [max(10**7, _STEPS_PER_BYTE * _regular(p)) // 1000]

    def spend() -> int:
        budget[0] -= 1
        return 1 if budget[0] < 0 else 0

    conn = _connect(p, spend)
    try:
        kind = conn.execute("SELECT type, sql FROM sqlite_master WHERE name = 'traces'").fetchone()
        if kind is None or kind[0] != b"table":
            raise AdapterError(f"{p}: no table 'traces' (not an rllm-model-gateway store)")
        if bytes(kind[1] or b"").lstrip().upper().startswith(b"CREATE VIRTUAL"):
            raise AdapterError(f"{p}: traces: a virtual table (not an rllm-model-gateway store)")
        computed = [_text(r[1]) for r in conn.execute("PRAGMA table_xinfo(traces)") if r[6]]
        if computed:
            raise AdapterError(
                f"{p}: traces: {short(computed[0])}: a column SQLite computes on read (not an rllm-model-gateway store)"
            )
        big = conn.execute(
            "SELECT trace_id FROM traces WHERE length(CAST(data AS BLOB)) > ? LIMIT 1", (MAX_LINE_BYTES,)
        ).fetchone()
        if big is not None:
            raise AdapterError(f"{p}: trace {short(_text(big[0]))}: data: longer than {MAX_LINE_BYTES} bytes")
        rows = conn.execute("SELECT trace_id, data FROM traces ORDER BY created_at, rowid")
        for tid, data in rows:
            where = f"{p}:trace {short(_text(tid))}"
            if isinstance(data, bytes):
                try:
                    data = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise AdapterError(f"{where}: data: not UTF-8 text") from None
            if not isinstance(data, str):
                raise AdapterError(f"{where}: data: expected JSON text, got {type(data).__name__}")
            try:
                rec = json.loads(data)
            except json.JSONDecodeError as e:
                raise AdapterError(f"{where}: data: not JSON ({e.msg}, column {e.colno})") from None
            except (RecursionError, ValueError):
                raise AdapterError(f"{where}: data: JSON nested too deeply or a number too long") from None
            if not isinstance(rec, dict):
                raise AdapterError(f"{where}: data: a trace must be a JSON object, not {type(rec).__name__}")
            yield located(rec, where)
    except UnicodeDecodeError:  # SQLite's message names a part of the schema whose bytes are not UTF-8
        raise AdapterError(f"{p}: cannot read the SQLite store: its schema is damaged (not UTF-8)") from None
    except sqlite3.Error as e:
        why = "too much work for its size (a crafted query plan?)" if budget[0] < 0 else str(e)
        raise AdapterError(f"{p}: cannot read the SQLite store: {why}") from None
    finally:
        conn.close()


def _text(value: Any) -> Any:
    """A TEXT value of the store as text to name it by (bytes not UTF-8 replaced); other values as they are."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _call(rec: Mapping[str, Any], where: str, version: int | None) -> tuple[Call, bool]:
    """One trace as an engine call, and whether its response was kept without its raw body."""
    prompt = wholes(need(rec, "prompt_token_ids", where), "prompt_token_ids", where)
    if not prompt:
        raise AdapterError(
            f"{where}: prompt_token_ids: empty: the engine returned no prompt ids "
            "(vLLM with return_token_ids; the gateway's add_return_token_ids)"
        )
    completion = wholes(need(rec, "completion_token_ids", where), "completion_token_ids", where)
    request = mapping(rec.get("raw_request"), "raw_request", where)
    raw = mapping(rec.get("raw_response"), "raw_response", where)
    named = None
    if raw:
        choices = raw.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], Mapping):
            raise AdapterError(f"{where}: raw_response.choices: expected exactly one choice (n=1)")
        lps = entry_logprobs(choices[0], len(completion), f"{where}: raw_response.choices[0]")
        named = logprob_ids(choices[0])
        if lps is None:
            lps = aligned_logprobs(rec.get("logprobs"), len(completion), "logprobs", where, DROPS)
    else:
        lps = aligned_logprobs(rec.get("logprobs"), len(completion), "logprobs", where, DROPS)
    weight = rec.get("weight_version")
    turn_version = whole(weight, "weight_version", where) if weight is not None else version
    message = mapping(rec.get("response_message"), "response_message", where)
    turn = {
        "finish_reason": finish_reason(rec.get("finish_reason")),
        "sampled_token_ids": completion,
        "action_text": message.get("content") if isinstance(message.get("content"), str) else None,
        **engine_context(prompt),
        **{
            k: option(request, k, f"{where}.raw_request")
            for k in ("temperature", "top_p")
            if request.get(k) is not None
        },
        **({"policy_version": turn_version} if turn_version is not None else {}),
    }
    return Call(prompt, completion, lps, turn, logprob_ids=named), not raw


@guarded(FRAMEWORK)
def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """Contract trajectories from gateway traces (and end lines), one per session."""
    context = context_values(context, CONTEXT)
    version = option(context, "policy_version")
    sessions: dict[str, Session] = {}
    streamed, calls, first = 0, 0, ""
    for n, rec in enumerate(records):
        where = getattr(rec, "origin", None) or f"record {n}"
        sid = str(need(rec, "session_id", where))
        s = sessions.setdefault(sid, Session([], getattr(rec, "origin", None), {}))
        if "end" in rec:
            end = mapping(rec["end"], "end", where)
            s.outcome = {**(s.outcome or {}), **{k: option(end, k, f"{where}: end") for k in END_FIELDS}}
            continue
        call, lost = at_record(rec, _call, rec, where, version)
        s.calls.append(call)
        calls += 1
        if lost:
            streamed += 1
            first = first or f"{where} (session {sid})"
    empty = [sid for sid, s in sessions.items() if not s.calls]
    if empty:
        raise AdapterError(f"session {short(empty[0])}: an end line but no trace")
    return table(sessions, LACKS, FRAMEWORK, context, (streamed, calls, first) if streamed else None)
