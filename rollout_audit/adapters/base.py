"""What every adapter shares: reading a dump (JSON Lines or Parquet), required-field access that
names what is missing, and turning a framework's placeholders into nulls."""

from __future__ import annotations

import difflib
import gzip
import json
import math
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..contract.capture import KEY as CAPTURE_KEY
from ..contract.errors import AdapterError

_MISSING = object()


def need(record: Mapping[str, Any], field: str, where: str) -> Any:
    """`record[field]`, or AdapterError naming the field and the record (`where`)."""
    value = record.get(field, _MISSING) if isinstance(record, Mapping) else _MISSING
    if value is _MISSING:
        raise AdapterError(f"{where}: missing field {field!r}")
    return value


def nulls_where(values: Sequence[float] | None, keep: Sequence[Any]) -> list[float | None] | None:
    """`values` with None wherever `keep` is falsy: a framework's placeholder (0.0 on tokens the
    policy did not sample) is not a recorded log-prob. None stays None."""
    if values is None:
        return None
    if len(values) != len(keep):
        raise AdapterError(f"{len(values)} values against a mask of {len(keep)}")
    return [float(v) if k else None for v, k in zip(values, keep)]


class Record(dict):
    """One record of a dump, and where it came from: `origin` is "FILE:LINE" (JSON Lines) or
    "FILE:ROW" (Parquet, 1-based), so a finding on its trajectory can name it."""

    origin: str | None = None


def located(record: dict[str, Any], origin: str | None) -> Record:
    """`record` as a Record from `origin`."""
    out = Record(record)
    out.origin = origin
    return out


def origin(record: Mapping[str, Any]) -> dict[str, Any]:
    """The `_origin` entry a contract row carries from the dump record it was built from (none for a plain dict)."""
    where = getattr(record, "origin", None)
    return {ORIGIN: where} if where else {}


ORIGIN = "_origin"  # a row's dump record; `contract_table` moves it to the table's metadata
META_ORIGINS = b"rollout_audit.origins"  # JSON list: the dump record of each trajectory row
# JSON {"said": one sentence, "settings": {configuration key: value}}: the trainer settings a conversion
# derived from the trainer's configuration, and the audit settings that state it
META_TRAINER_SETTINGS = b"rollout_audit.trainer_settings"
# one line: the recorded sessions a conversion left out because their capture is incomplete
# (rollout_audit.contract.capture); the audit of the conversion cannot be "ok" with it
META_INCOMPLETE = b"rollout_audit.incomplete"


def with_trainer_settings(table: pa.Table, said: str, **settings: Any) -> pa.Table:
    """`table` declaring the trainer settings the adapter assumed (`said`) and the audit settings it
    implies (e.g. truncation="penalize"); a configuration that sets the key itself wins."""
    meta = {
        **(table.schema.metadata or {}),
        META_TRAINER_SETTINGS: json.dumps({"said": said, "settings": settings}).encode(),
    }
    return table.replace_schema_metadata(meta)


def step_of(record: Mapping[str, Any], fields: Sequence[str], name: re.Pattern[str], where: str) -> int | None:
    """The training step a dump record belongs to: the first of `fields` it carries (an integer, else
    AdapterError naming it), else the step `name` finds in its dump file's name (group 1); None when
    neither says (a single-step dump). Trainers that draw a prompt again at a later step repeat its
    ids, so a dump of several steps needs the step in the trajectory identity."""
    for key in fields:
        value = record.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise AdapterError(f"{where}: {key} must be an integer")
            return whole(value, key, where)
    file = (getattr(record, "origin", None) or "").rsplit(":", 1)[0]
    found = name.search(Path(file).name) if file else None
    return int(found.group(1)) if found else None


# A dump larger than this is refused unread (a device, or a file that would not fit in memory once parsed)
MAX_DUMP_BYTES = int(os.environ.get("ROLLOUT_AUDIT_MAX_DUMP_BYTES", str(4 << 30)))
MAX_LINE_BYTES = 256 << 20  # one JSON record


def _regular(p: Path) -> int:
    """The size of `p`, a regular file (symlinks followed) of at most MAX_DUMP_BYTES; else AdapterError.
    A FIFO or a device would block or never end."""
    try:
        st = p.stat()
    except OSError as e:
        raise AdapterError(f"{p}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise AdapterError(f"{p}: not a regular file")
    if st.st_size > MAX_DUMP_BYTES:
        raise AdapterError(f"{p}: {st.st_size} bytes, more than {MAX_DUMP_BYTES} (ROLLOUT_AUDIT_MAX_DUMP_BYTES)")
    return st.st_size


def read_records(path: str | os.PathLike) -> Iterator[Record]:
    """Records from a dump file: JSON Lines (`.jsonl`, `.json` with one object per line) or Parquet."""
    p = Path(path)
    _regular(p)
    form = dump_form(p.name)
    if form == "parquet":
        n = 0
        try:
            batches = pq.ParquetFile(p).iter_batches()
            for batch in batches:
                for rec in batch.to_pylist():
                    n += 1
                    # a Parquet file has the union of its records' fields: a null top-level field is
                    # one this record does not have (as when the record was a JSON line)
                    yield located({k: v for k, v in rec.items() if v is not None}, f"{p}:{n}")
        except (pa.ArrowException, OSError) as e:
            raise AdapterError(
                f"{p}:{n + 1}: cannot read the Parquet dump: {str(e).splitlines()[0] if str(e) else e}"
            ) from None
        return
    with p.open("rb") if form != "jsonl.gz" else gzip.open(p, "rb") as fh:
        total = 0  # decompressed bytes: a compressed dump is bounded as a plain one is
        lines = (
            iter(lambda: _gz_line(fh, p), b"")
            if form == "jsonl.gz"
            else iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b"")
        )
        capture: dict[str, Any] | None = None  # the first line of a recorder's session file
        for n, raw in enumerate(lines, 1):
            if capture is not None and not raw.endswith(b"\n") and _torn(raw):
                yield located(torn_line(capture, len(raw)), f"{p}:{n}")
                break
            total += len(raw)
            if total > MAX_DUMP_BYTES:
                raise AdapterError(
                    f"{p}:{n}: decompresses to more than {MAX_DUMP_BYTES} bytes (ROLLOUT_AUDIT_MAX_DUMP_BYTES)"
                )
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise AdapterError(f"{p}:{n}: a line longer than {MAX_LINE_BYTES} bytes")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise AdapterError(f"{p}:{n}: byte {e.start}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise AdapterError(f"{p}:{n}: not a JSON object ({e.msg}, column {e.colno})") from None
            except RecursionError:
                raise AdapterError(f"{p}:{n}: JSON nested too deeply") from None
            except ValueError as e:  # an integer of more digits than Python converts
                raise AdapterError(f"{p}:{n}: {str(e).split(';')[0]}") from None
            if not isinstance(rec, dict):
                raise AdapterError(f"{p}:{n}: a record must be a JSON object, not {type(rec).__name__}")
            if n == 1 and rec.get("kind") == "start" and CAPTURE_KEY in rec:
                capture = rec
            yield located(rec, f"{p}:{n}")


def _torn(raw: bytes) -> bool:
    """A last line without its newline that does not parse: a write the recorder did not finish."""
    try:
        json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return True
    return False


def torn_line(start: Mapping[str, Any], size: int) -> dict[str, Any]:
    """The record standing for a capture file's torn last line: its session is incomplete."""
    return {CAPTURE_KEY: start[CAPTURE_KEY], "kind": "torn", "session": start.get("session"), "bytes": size}


def read_dump(path: str | os.PathLike) -> list[Record]:
    """Every record of a dump file or of the dump files in a directory and its sub-directories
    (`dump_files`), in path order."""
    return [r for f in dump_files(path)[0] for r in read_records(f)]


# what a dump file's name ends with, lower-cased, and how it is read
DUMP_FORMS = {
    ".jsonl.gz": "jsonl.gz",
    ".json.gz": "jsonl.gz",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
}


def dump_form(name: str) -> str | None:
    """How a dump file named `name` is read (JSON Lines, gzip-compressed JSON Lines, Parquet; the
    suffix in any case), or None when its name is not a dump file's."""
    low = name.lower()
    return next((form for end, form in DUMP_FORMS.items() if low.endswith(end)), None)


def dump_files(path: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """The dump files at `path` (a file, or every dump file under a directory, per-rank
    sub-directories included, symlinked directories not followed) in path order, and the other
    files found there (named by the caller: never skipped in silence). AdapterError naming the file
    for a dump in a form that is not read (`step.jsonl.zst`, a rotated `step.jsonl.1`), and when
    there is no dump file at all. Hidden files and folders (a writer's temporary files) are left out."""
    p = Path(path)
    if not p.is_dir():
        return [p], []
    found: list[Path] = []
    other: list[Path] = []
    for d, dirs, names in os.walk(p, onerror=_unlistable):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        for n in sorted(names):
            f = Path(d) / n
            if n.startswith("."):
                continue
            if dump_form(n) is not None:
                found.append(f)
            elif re.search(r"\.(jsonl?|parquet)\b", n.lower()):
                raise AdapterError(
                    f"{f}: a dump file in a form that is not read (JSON Lines, .jsonl.gz or Parquet); "
                    "decompress or rename it, or move it out of the directory"
                )
            else:
                other.append(f)
    if not found:
        raise AdapterError(f"{p}: no *.jsonl, *.jsonl.gz or *.parquet dump files")
    return found, other


def _unlistable(e: OSError) -> None:
    raise AdapterError(f"{e.filename}: cannot list: {e.strerror or e}")


def _gz_line(fh: Any, p: Path) -> bytes:
    """One line of a gzip stream (at most MAX_LINE_BYTES + 1 bytes); AdapterError when it is not gzip."""
    try:
        return fh.readline(MAX_LINE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise AdapterError(f"{p}: cannot decompress: {e}") from None


# ---------------------------------------------------------------- the one context schema of every adapter

# Context a trainer does not record, from keyword arguments (CLI `--context KEY=VALUE`): name -> type.
CONTEXT: dict[str, type] = {
    "environment_id": str,
    "environment_version": str,
    "verifier_version": str,
    "reset_seed": int,
    "tokenizer_id": str,
    "temperature": float,
    "top_p": float,
}
TURN_CONTEXT = ("temperature", "top_p")  # context that belongs on every turn
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _typed(key: str, value: Any, kind: type) -> Any:
    """`value` as `kind` (CLI values arrive as strings); AdapterError naming the key otherwise.
    Integers are whole numbers, floats finite, booleans true/false (or 1/0, yes/no, on/off)."""
    bad = AdapterError(f"context {key}={value!r} is not {'a boolean' if kind is bool else kind.__name__}")
    if kind is str:
        if isinstance(value, (Mapping, list, tuple, bytes)):
            raise bad
        return str(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise bad
    if isinstance(value, bool):
        raise bad
    try:
        out = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise bad from None
    if kind is float and not math.isfinite(out):
        raise bad
    if kind is int and isinstance(value, float) and value != out:
        raise bad
    return out


def context_values(context: Mapping[str, Any], allowed: Sequence[str] | Mapping[str, type] = ()) -> dict[str, Any]:
    """The keyword context in the contract's types: the one context schema every adapter validates
    `--context` with. `allowed` names an adapter's own extra keys, as a sequence (kept as strings) or
    as a mapping to their types (str, int, float, bool). An unknown key or a bad value is an
    AdapterError naming the key (exit 2 on the command line)."""
    extra = dict(allowed) if isinstance(allowed, Mapping) else dict.fromkeys(allowed, str)
    known = {**extra, **CONTEXT}  # the common keys keep their contract types
    out: dict[str, Any] = {}
    for key, value in context.items():
        kind = known.get(key)
        if kind is None:
            near = difflib.get_close_matches(key, list(known), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise AdapterError(f"unknown context {key!r}; {hint}known: {', '.join(known)}")
        out[key] = _typed(key, value, kind)
    return out


def runs(mask: Sequence[Any]) -> list[tuple[int, int]]:
    """[start, end) of every maximal run of truthy values: the turns of a framework whose only
    turn marker is its loss mask."""
    out: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(mask)))
    return out


def turn_of(n: int, starts: Sequence[int]) -> list[int]:
    """token_turn for `n` tokens whose turns begin at `starts` (increasing): -1 before the first
    turn, then the last turn that began at or before the position."""
    out, t = [], -1
    nxt = iter([*starts, n + 1])
    edge = next(nxt)
    for i in range(n):
        while i >= edge:
            t += 1
            edge = next(nxt)
        out.append(t)
    return out


def contract_table(rows: Sequence[Mapping[str, Any]], lacks: Mapping[str, str], framework: str = "") -> pa.Table:
    """Contract 1.1 trajectories from rows, naming in the file metadata (`rollout_log.not_recorded`)
    every column or turn field of `lacks` the rows do not have, with the framework's reason."""
    from ..contract import schema as S
    from ..reading.records import records_to_table

    if not rows:
        raise AdapterError(f"{framework + ': ' if framework else ''}no trajectories in the records")
    origins = [r.get(ORIGIN) for r in rows]
    mapped: list[Mapping] = [{k: v for k, v in r.items() if k != ORIGIN} if ORIGIN in r else r for r in rows]
    try:
        table = records_to_table(mapped)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
        raise AdapterError(_misfit(mapped, origins, framework, e)) from None
    have = set(table.column_names)
    turn_fields = {f.name for f in table.schema.field("turns").type.value_type} if "turns" in have else set()
    absent = {k: v for k, v in lacks.items() if (k[6:] not in turn_fields if k.startswith("turns.") else k not in have)}
    meta = dict(table.schema.metadata or {})
    meta[S.META_VERSION] = S.CONTRACT_VERSION.encode()
    meta[S.META_NOT_RECORDED] = json.dumps(absent, sort_keys=True).encode()
    if any(origins):
        meta[META_ORIGINS] = json.dumps(origins).encode()
    return table.replace_schema_metadata(meta)


def _fits(value: Any, typ: pa.DataType) -> bool:
    try:
        pa.array([value], typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False
    return True


def _misfit(rows: Sequence[Mapping[str, Any]], origins: Sequence[str | None], framework: str, e: Exception) -> str:
    """Which row and field hold a value the contract's type cannot take (a value an adapter carries
    over from the dump as it is), as `FILE:LINE: trajectory ID: field: expected TYPE, got VALUE`;
    only looked for when building the table failed."""
    from ..reading.records import schema_for_records

    schema = schema_for_records(list(rows), "trajectories")
    for row, at in zip(rows, origins):
        where = f"{at + ': ' if at else ''}trajectory {short(row.get('trajectory_id'))}"
        for f in schema:
            if f.name not in row:
                continue
            if f.name != "turns":
                if not _fits(row[f.name], f.type):
                    return (
                        f"{where}: {f.name}: expected {f.type}, got {type(row[f.name]).__name__} {short(row[f.name])}"
                    )
                continue
            for k, turn in enumerate(row["turns"] or ()):
                for tf in f.type.value_type:
                    if tf.name in turn and not _fits(turn[tf.name], tf.type):
                        value = turn[tf.name]
                        return f"{where}: turn {k}: {tf.name}: expected {tf.type}, got {type(value).__name__} {short(value)}"
    return f"{framework + ': ' if framework else ''}the records do not fit the contract's types ({e})"


def with_context(row: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """`row` with the keyword context: decoding parameters on every turn, the rest as columns."""
    for key, value in context.items():
        if key in TURN_CONTEXT:
            for turn in row["turns"]:
                turn[key] = value
        elif key in CONTEXT:
            row[key] = value
    return row


def context_lacks(framework: str) -> dict[str, str]:
    """Why each context column may be absent: the framework does not record it, and how to pass it."""
    what = {
        "environment_id": "the environment identity",
        "environment_version": "the environment version",
        "verifier_version": "the verifier (reward function) version",
        "reset_seed": "a reset seed",
        "tokenizer_id": "the tokenizer and chat template identity",
        "temperature": "the sampling temperature in its records",
        "top_p": "top_p in its records",
    }
    return {
        (f"turns.{k}" if k in TURN_CONTEXT else k): f"{framework} does not record {v}; pass --context {k}=..."
        for k, v in what.items()
    }


def aligned(record: Mapping[str, Any], field: str, like: Sequence[Any], where: str) -> list[Any]:
    """`record[field]` as a list of the same length as `like` (one value per response token)."""
    values = need(record, field, where)
    if not isinstance(values, (list, tuple)):
        raise AdapterError(f"{where}: {field} must be a list")
    if len(values) != len(like):
        raise AdapterError(f"{where}: {len(values)} {field} for {len(like)} response tokens")
    return list(values)


def reward_lacks(framework: str) -> dict[str, str]:
    """Why the per-turn reward fields are absent: the framework records one reward per sample."""
    why = f"{framework} records one reward per sample: no per-turn rewards, components, shaping, potentials or values"
    fields = (
        "reward",
        "raw_reward",
        "reward_components",
        "shaping",
        "potential_before",
        "potential_after",
        "value",
        "td_residual",
    )
    return {**{f"turns.{f}": why for f in fields}, "final_value": why, "discounted_return": why}


def logprobs_column(n_prompt: int, values: Sequence[float | None], sampled: Sequence[bool]) -> list[float | None]:
    """behavior_logprobs: null over the prompt and wherever the policy did not sample the token
    (the frameworks' 0.0 placeholder on observation tokens is not a log-prob)."""
    return [None] * n_prompt + [float(v) if k and v is not None else None for v, k in zip(values, sampled)]


def lacks(framework: str) -> dict[str, str]:
    """What none of these trainers records, with the reason: the context (`context_lacks`), per-turn
    rewards (`reward_lacks`), per-turn and per-sample counts, verifier verdicts, state, parsed actions."""
    return {
        **context_lacks(framework),
        **reward_lacks(framework),
        "turns.logprob": f"{framework} records no per-turn log-prob",
        "turns.num_policy_tokens": f"{framework} does not count policy tokens per turn",
        "num_trainable_tokens": f"{framework} does not record a trainable-token count per sample",
        "verifier_success": f"{framework} records a reward, not a verifier verdict",
        "initial_state_checksum": f"{framework} does not record environment state",
        "turns.parsed_action": f"{framework} does not record parsed actions",
        "turns.template_context_length": f"{framework} does not record the chat template's render of each turn's context",
        "turns.template_context_sha256": f"{framework} does not record the chat template's render of each turn's context",
        **loss_evidence_lacks(framework),
    }


def loss_evidence_lacks(framework: str) -> dict[str, str]:
    """Why the contract 1.2 per-token loss evidence is absent from a rollout dump: the trainer builds
    token rewards, KL and returns after the rollout, from the sample's one reward."""
    why = f"{framework}'s rollout dump holds one reward per sample; its trainer builds the token-level {{}} later"
    return {
        "token_reward": why.format("rewards"),
        "token_kl": why.format("KL penalty"),
        "token_returns": why.format("returns"),
        **{
            k: f"{framework}'s rollout dump holds no critic values: a critic computes them, and GAE over them, later"
            for k in CRITIC
        },
    }


CRITIC = ("token_values", "token_value_targets", "gae_lambda")  # the contract 1.4 critic evidence (R416)


def token_columns(
    prompt: Sequence[int], response: Sequence[int], sampled: Sequence[bool], mask: Sequence[bool], starts: Sequence[int]
) -> dict[str, list[Any]]:
    """The token lists of a prompt-then-response sample: the prompt is user input (1; these
    trainers do not tell system from user), response tokens are policy (2) where `sampled`, else
    observation (3; tool and template are not told apart); turns begin at `starts` in the response."""
    n = len(prompt)
    return {
        "token_ids": [*prompt, *response],
        "token_source": [1] * n + [2 if s else 3 for s in sampled],
        "loss_mask": [False] * n + [bool(m) for m in mask],
        "token_turn": [-1] * n + turn_of(len(response), starts),
    }


_INT64 = 2**63


def whole(value: Any, field: str, where: str) -> int:
    """`value` as an integer of int64's range: an int, or a float with an integral value (JSON writers
    print 3.0 for 3); a fraction (4975.7), a bool, a string, an infinity or a value past int64 is an
    AdapterError naming the field and record, never rounded or left to overflow later."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdapterError(f"{where}: {field}: expected an integer, got {type(value).__name__} {short(value)}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise AdapterError(f"{where}: {field}: expected an integer, got {value!r}")
    if not -_INT64 <= value < _INT64:
        raise AdapterError(f"{where}: {field}: {short(value)} is outside the 64-bit integer range")
    return int(value)


def wholes(values: Any, field: str, where: str) -> list[int]:
    """A list of integers (each as `whole` takes it), or AdapterError naming the field and record."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise AdapterError(f"{where}: {field} must be a list of integers, got {type(values).__name__}")
    return [whole(v, field, where) for v in values]


def number(value: Any, field: str, where: str) -> float:
    """`value` as a float: an int or a float (NaN and infinities kept, for the checks to judge); a
    boolean, a string, a container or an integer past float's range is an AdapterError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdapterError(f"{where}: {field}: expected a number, got {type(value).__name__} {short(value)}")
    try:
        return float(value)
    except OverflowError:
        raise AdapterError(f"{where}: {field}: {short(value)} is outside the range of a number") from None


def numbers(values: Any, field: str, where: str) -> list[float | None]:
    """A list of numbers or nulls (log-probs as a trainer records them), as floats; a string, a
    boolean or a container in it is an AdapterError naming the field and record."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise AdapterError(f"{where}: {field} must be a list of numbers, got {type(values).__name__}")
    return [None if v is None else number(v, field, where) for v in values]


def flags(values: Any, field: str, where: str) -> list[bool]:
    """A loss mask: booleans, or the integers 0 and 1 (as frameworks write them). A string such as
    "0" (truthy in Python) or any other value is an AdapterError naming the field and record."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise AdapterError(f"{where}: {field} must be a list of 0/1 or booleans, got {type(values).__name__}")
    out = []
    for v in values:
        if isinstance(v, bool) or (isinstance(v, (int, float)) and v in (0, 1)):
            out.append(bool(v))
        else:
            raise AdapterError(f"{where}: {field}: expected 0, 1, true or false, got {type(v).__name__} {short(v)}")
    return out


def short(value: Any) -> str:
    """A value as shown in a message, cut (a 5,000-digit integer is not printed whole)."""
    text = (
        repr(value)
        if not isinstance(value, int) or abs(value) < 10**40
        else f"an integer of {len(str(abs(value)))} digits"
    )
    return text if len(text) <= 60 else text[:57] + "..."


def mapping(value: Any, field: str, where: str) -> Mapping[str, Any]:
    """An optional object of a record: `value` when it is one, {} when absent (None); anything else
    is an AdapterError naming the field and record."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise AdapterError(f"{where}: {field}: expected an object, got {type(value).__name__} {short(value)}")
    return value


def objects(values: Any, field: str, where: str) -> list[Mapping[str, Any]]:
    """A list of objects (a record's steps, nodes, trajectories), or AdapterError naming the field,
    the position and the record."""
    if not isinstance(values, list):
        raise AdapterError(f"{where}: {field} must be a list of objects, got {type(values).__name__}")
    for i, v in enumerate(values):
        if not isinstance(v, Mapping):
            raise AdapterError(f"{where}: {field}[{i}]: expected an object, got {type(v).__name__} {short(v)}")
    return values


def ints(record: Mapping[str, Any], field: str, where: str) -> list[int]:
    """`record[field]` as a list of integers, or AdapterError naming the field."""
    return wholes(need(record, field, where), field, where)


_INT32 = 2**31


def token_ids(values: Any, field: str, where: str) -> list[int]:
    """A list of token ids: integers (as `whole` takes them) within int32, the contract's token type
    and the one a context hash is computed over, or AdapterError naming the field, the position and
    the record."""
    ids = wholes(values, field, where)
    for i, v in enumerate(ids):
        if not -_INT32 <= v < _INT32:
            raise AdapterError(
                f"{where}: {field}[{i}]: token id {short(v)} is outside int32, the contract's token type"
            )
    return ids


def integer(record: Mapping[str, Any], field: str, where: str) -> int:
    """`record[field]` as an integer (a decimal string too), or AdapterError naming the field."""
    value = need(record, field, where)
    if isinstance(value, str):
        text = value.strip()
        if not (text.lstrip("+-").isdigit() and len(text) <= 20):
            raise AdapterError(f"{where}: {field}: expected an integer, got {short(value)}")
        value = int(text)
    return whole(value, field, where)


# what a value of an unforeseen type raises inside an adapter (a float where an object is, a list where a number is)
SHAPE_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError)


def at_record(record: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` (its rows as a list when it yields them), with an AdapterError prefixed by the
    record's origin (FILE:LINE), so the message says where the bad value is."""
    at = getattr(record, "origin", None)
    try:
        out = fn(*args)
        return list(out) if isinstance(out, Iterator) else out
    except AdapterError as e:
        if at and not str(e).startswith(at):
            raise AdapterError(f"{at}: {e}") from None
        raise
    except SHAPE_ERRORS as e:  # a shape the adapter did not foresee: still the record that has it
        if not at:
            raise
        raise AdapterError(f"{at}: a field has the wrong shape ({type(e).__name__}: {e})") from None


def rows_of(records: Iterable[Mapping[str, Any]], row: Callable[..., dict[str, Any]], ctx: Mapping[str, Any]) -> list:
    """`row(record, n, ctx)` for every record; a record of the wrong shape the adapter did not
    foresee is still an AdapterError naming the record, never a crash."""
    out = []
    for n, rec in enumerate(records, 1):
        try:
            out.append({**at_record(rec, row, rec, n, ctx), **origin(rec)})
        except AdapterError:
            raise
        except SHAPE_ERRORS as e:
            at = getattr(rec, "origin", None) or f"record {n}"
            raise AdapterError(f"{at}: a field has the wrong shape ({type(e).__name__}: {e})") from None
    return out


def in_range(context: Mapping[str, Any], bounds: Mapping[str, tuple[float | None, float | None]]) -> None:
    """AdapterError naming the key for a context value (already typed by `context_values`) outside
    its [low, high] bounds (None: unbounded): a trainer limit of 0 or below, a negative penalty factor,
    a budget no trainer has. The settings a policy derives from them reach the audit as they are."""
    for key, (low, high) in bounds.items():
        value = context.get(key)
        if value is None:
            continue
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"at least {low}" if high is None else f"between {low} and {high}"
            raise AdapterError(f"context {key}={short(value)} is out of range: expected {span}")


_HEX64 = re.compile(r"[0-9a-f]{64}")


def sha256_hex(value: Any, field: str, where: str) -> str:
    """`value` as a hex SHA-256 (64 lower-case hex digits), or AdapterError naming the field and record."""
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise AdapterError(f"{where}: {field}: expected a 64-digit hex SHA-256, got {short(value)}")
    return value


# a recorder's own word on what it could not record, on a dump record: {contract field: reason}
UNRECORDED = "rollout_audit_unrecorded"


def declared(records: Iterable[Mapping[str, Any]], lacks: Mapping[str, str]) -> dict[str, str]:
    """`lacks` with the reasons the records' recorder gave (`UNRECORDED`) in place of the adapter's:
    a field the recorder could not record keeps its place in "not run", with the recorder's reason.
    A reason only names why a field is absent (`contract_table` writes it only where the rows lack
    the field), so it cannot weaken the audit; a field the adapter does not know is refused."""
    said: dict[str, list[str]] = {}
    for n, rec in enumerate(records, 1):
        value = rec.get(UNRECORDED)
        if value is None:
            continue
        where = getattr(rec, "origin", None) or f"record {n}"
        if not isinstance(value, Mapping):
            raise AdapterError(f"{where}: {UNRECORDED} must be an object of field: reason")
        for field, reason in value.items():
            if field not in lacks or not isinstance(reason, str):
                raise AdapterError(f"{where}: {UNRECORDED} names {short(field)}, not a field this adapter declares")
            reasons = said.setdefault(field, [])
            if reason not in reasons and len(reasons) < 4:
                reasons.append(reason[:500])
    return {**lacks, **{f: "; ".join(r) for f, r in said.items()}}
