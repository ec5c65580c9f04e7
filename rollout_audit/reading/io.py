"""Finding, reading and writing rollout logs (Parquet files or directories of them)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..contract import schema as S
from ..contract.errors import UsageError
from . import storage
from .sanitize import duplicate_columns
from .storage import is_writer_temp as _is_writer_temp


@dataclass(frozen=True)
class GroupSize:
    """What a row group's footer says it holds, read before any value is decoded: a run of
    equal values compresses to a few bytes but decodes to its full length, so the size that
    counts is values × width, not the stored bytes."""

    first_row: int  # the file row at which the group starts
    rows: int
    decoded: int  # bytes it decodes to, at least (values × width of every column, or the stored size if larger)
    tokens: int  # values of its longest token list: no trajectory of the group holds more tokens
    widest: str  # the column with the most values, and how many: what a message names
    widest_values: int


@dataclass
class LogFile:
    """One Parquet file of a log, with what its footer says."""

    path: str
    kind: str  # "trajectories" or "updates"
    schema: pa.Schema
    num_rows: int
    num_row_groups: int
    table: pa.Table | None = None  # an in-memory table audited like a file (path is its name)
    largest_row_group: int = 0  # decoded bytes of the largest row group, as the footer states (GroupSize.decoded)
    groups: tuple[GroupSize, ...] = ()  # each row group's sizes (empty for a table held in memory)
    row_groups: tuple[int, int] | None = None  # read only row groups [start, stop) (a distributed task's share)
    first_row: int = 0  # the file row at which those row groups start


@dataclass
class Discovery:
    """The files of a log, plus the ones that could not be opened (reported as S005)."""

    files: list[LogFile] = field(default_factory=list)
    broken: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)

    def of_kind(self, kind: str) -> list[LogFile]:
        return [f for f in self.files if f.kind == kind]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _parquet_paths(path: Path, follow_symlinks: bool = False) -> tuple[list[Path], list[tuple[str, str]]]:
    """Parquet files under `path` (sorted), and what was found but not read (path, reason):
    unlistable directories, writer temp files, non-regular files, symlinks out of the tree.

    Iterative (no recursion limit); a directory reached twice (a symlink loop) is walked once;
    symlinks are followed only when their target lies inside `path` unless `follow_symlinks`."""
    if not path.is_dir():
        return [path], []
    root = os.path.realpath(path)
    found: list[Path] = []
    skipped: list[tuple[str, str]] = []
    seen: set[tuple[int, int]] = set()
    stack = [path]
    while stack:
        d = stack.pop()
        try:
            st = d.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as err:
            skipped.append((str(d), f"directory cannot be listed ({one_line(err)}); its files are not audited"))
            continue
        for e in entries:
            try:
                _classify(e, root, follow_symlinks, stack, found, skipped)
            except OSError as err:  # a symlink loop (ELOOP) or a vanished entry: this entry only
                skipped.append((e.path, f"cannot be read ({one_line(err)}); not audited"))
    return sorted(found), skipped


def _classify(
    e: os.DirEntry,
    root: str,
    follow_symlinks: bool,
    stack: list[Path],
    found: list[Path],
    skipped: list[tuple[str, str]],
) -> None:
    """Put one directory entry where it belongs: a directory to walk, a Parquet file, or a skipped entry."""
    p = Path(e.path)
    if e.is_symlink() and not follow_symlinks and not _within(os.path.realpath(p), root):
        if e.name.endswith(".parquet") or e.is_dir():
            skipped.append(
                (e.path, "symlink to outside the audited directory; not followed (audit its target explicitly)")
            )
        return
    if e.is_dir():
        # a hidden or underscore directory is no part of the log (as pyarrow.dataset's discovery and
        # `watch` judge it): a killed writer's staging directory is reported, never read as data
        if not e.name.startswith((".", "_")):
            stack.append(p)
        elif e.name.endswith((".tmp", ".temp", ".partial")) or e.name == "_temporary":
            skipped.append(
                (
                    e.path,
                    "temporary directory of an unfinished write (the writer was killed or is still running); not audited",
                )
            )
    elif _is_writer_temp(e.name):
        skipped.append(
            (
                e.path,
                "temporary file of an unfinished write (the writer was killed or is still running); not audited",
            )
        )
    elif e.name.endswith(".parquet") and not e.name.startswith((".", "_")):
        if not _utf8(e.path):  # every report, table and format names files as text
            skipped.append((e.path, "file name is not UTF-8 text; not read (rename it)"))
        elif e.is_file():
            found.append(p)
        elif os.path.lexists(p):
            skipped.append((e.path, "not a regular file; not read"))


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind_of(path: PurePath, pschema: pa.Schema) -> str:
    """`trajectories` or `updates` from the file's metadata, else from its folder and columns;
    `unknown` for a file without metadata that has fewer than half the required columns of
    either kind (some other Parquet file that happens to lie in the log's directory)."""
    meta = pschema.metadata or {}
    kind = meta.get(S.META_KIND)
    if kind in (b"trajectories", b"updates"):
        return kind.decode()
    names = set(pschema.names)
    share = {k: len(names & set(S.required(k))) / len(S.required(k)) for k in ("trajectories", "updates")}
    if "updates" in path.parts[:-1] or "update_step" in names:
        return "updates" if share["updates"] >= 0.5 or "updates" in path.parts[:-1] else "unknown"
    return "trajectories" if share["trajectories"] >= 0.5 else "unknown"


class _Footer(pq.ParquetFile):
    """A Parquet file opened for its footer: the map of nested column paths that ParquetFile
    builds for reading columns by name (a Python loop over every leaf, the larger part of
    opening a small file) is not built."""

    def _build_nested_paths(self) -> dict:
        return {}


def discover(paths: Sequence[str | os.PathLike], follow_symlinks: bool = False) -> Discovery:
    """Find every Parquet file under `paths`; open each footer once. What cannot be read
    (corrupt footers, unlistable directories, writer temp files, duplicated column names,
    symlinks out of the tree unless `follow_symlinks`) goes to `broken` (S005).

    Raises UsageError for a path that does not exist or holds nothing that looks like Parquet.
    """
    out = Discovery()
    for raw in map(storage.local_path, paths):
        if not str(raw).strip():  # "" would resolve to the working directory: never audited by accident
            raise UsageError("an empty path names no log (write `.` for the current directory)")
        files, skipped = _listing(raw, follow_symlinks)
        if not files and not skipped:
            raise UsageError(f"{raw}: no *.parquet files found")
        out.broken += skipped
        last: tuple[pa.Schema | None, list[str]] = (None, [])  # files of a log mostly share one schema
        footer: tuple[Any, _Layout] = (None, _Layout(0, ()))  # the previous file's footer, and its layout
        for f in files:
            if not _utf8(str(f)):
                out.broken.append((str(f), "file name is not UTF-8 text; not read (rename it)"))
                continue
            try:
                if isinstance(f, Path) and not f.is_file():
                    raise UsageError("not a regular file")
                pf = _Footer(source(f))
                md = pf.metadata
                same = (
                    footer[0] is not None and md.schema.equals(footer[0].schema) and md.metadata == footer[0].metadata
                )
                if not same:  # the Arrow schema follows from the Parquet schema and the key-value metadata
                    sch = pf.schema_arrow
                    if last[0] is None or not sch.equals(last[0], check_metadata=True):
                        last = (sch, duplicate_columns(sch))
                    footer = (md, _layout(md.schema))
                sch, dups = last  # one schema object shared by the files that have it
                if dups:
                    out.broken.append(
                        (
                            str(f),
                            f"column name(s) {', '.join(dups)} occur more than once; "
                            "the file cannot be read unambiguously",
                        )
                    )
                    continue
                kind = _kind_of(PurePosixPath(str(f)), sch)
                if kind == "unknown":
                    out.broken.append(
                        (
                            str(f),
                            "not a rollout log file: no rollout_log.kind metadata and too few "
                            "of the contract's required columns (see `rollout-audit schema`)",
                        )
                    )
                    continue
                groups = group_sizes(md, footer[1])
                largest = max((g.decoded for g in groups), default=0)
                out.files.append(
                    LogFile(
                        str(f),
                        kind,
                        sch,
                        md.num_rows,
                        md.num_row_groups,
                        largest_row_group=largest,
                        groups=groups,
                    )
                )
            except Exception as e:  # noqa: BLE001 - any footer error means the file is unusable
                if str(f) == str(raw) and not str(raw).endswith(".parquet"):  # named on the command line: no log
                    raise UsageError(f"{raw}: not a Parquet file ({one_line(e)})") from None
                out.broken.append((str(f), one_line(e)))
    out.broken = [(_text(p), _text(why)) for p, why in out.broken]
    return out


def _text(s: str) -> str:
    """`s` as UTF-8 text: the bytes of a file name that is not UTF-8 written as \\xNN escapes."""
    return s if _utf8(s) else s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def row_group_too_large(size: GroupSize, index: int, limit: int) -> str | None:
    """Why row group `index`, of the given footer sizes, is not read, or None."""
    if size.decoded <= limit:
        return None
    detail = f" ({size.widest}: {size.widest_values:,} values)" if size.widest else ""
    return (
        f"row group {index} (rows {size.first_row}-{size.first_row + size.rows - 1}) decodes to "
        f"{size.decoded:,} bytes or more{detail}, above max_row_group_bytes ({limit:,}); "
        "not read (raise the limit to audit it)"
    )


_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8, "BYTE_ARRAY": 4}


@dataclass(frozen=True)
class _Layout:
    """A Parquet schema's leaf columns as the size estimate needs them."""

    flat: int  # bytes per row of the columns that hold one value per row
    repeated: tuple[tuple[int, int, str], ...]  # (leaf index, bytes per value, top-level column) of list leaves


def _layout(schema: pq.ParquetSchema) -> _Layout:
    flat, repeated = 0, []
    for j in range(len(schema)):
        c = schema.column(j)
        width = c.length if c.physical_type == "FIXED_LEN_BYTE_ARRAY" else _WIDTH.get(c.physical_type, 8)
        if c.max_repetition_level == 0:
            flat += width
        else:
            repeated.append((j, width, c.path.split(".")[0]))
    return _Layout(flat, tuple(repeated))


def group_sizes(md: pq.FileMetaData, layout: _Layout | None = None) -> tuple[GroupSize, ...]:
    """Each row group's decoded size and longest token list, from the footer alone. A list
    leaf's value count is what its pages decode to (a string counts its stored bytes at least)."""
    layout = layout or _layout(md.schema)
    out, first = [], 0
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        decoded, tokens, widest = rg.num_rows * layout.flat, 0, ("", 0)
        for j, width, top in layout.repeated:
            values = rg.column(j).num_values
            decoded += values * width
            if top in S.TOKEN_LISTS:
                tokens = max(tokens, values)
            if values > widest[1]:
                widest = (top, values)
        out.append(GroupSize(first, rg.num_rows, max(decoded, rg.total_byte_size), tokens, *widest))
        first += rg.num_rows
    return tuple(out)


def _listing(raw: str | os.PathLike, follow_symlinks: bool) -> tuple[Sequence[Path | str], list[tuple[str, str]]]:
    """The Parquet files under a local path or an object-store URI, and what was skipped."""
    if storage.is_remote(raw):
        try:
            return storage.list_parquet(str(raw))
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
    p = Path(raw)
    if not p.exists():
        raise UsageError(f"{raw}: no such file or directory")
    return _parquet_paths(p, follow_symlinks)


def source(path: str | os.PathLike) -> Any:
    """What pyarrow's Parquet reader opens for a log file: a local path, or an open object."""
    return storage.open_input(str(path)) if storage.is_remote(path) else path


def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".strip()


_SMALL_ROW_GROUP = 8 * 2**20  # decoded bytes
# A local row group that decodes to more is not decoded whole: decoding a whole row group of list
# columns holds about three times its decoded size in transient buffers (a 72 MB row group took
# the process 200 MB up). On one thread it is read a column at a time (about one column's worth of
# transients); decoded on Arrow's thread pool, a batch of rows at a time (every column of the
# batch at once, spread over the pool's threads), in pieces of DECODE_BYTES joined into the batch.
COLUMNWISE_BYTES = 16 * 2**20
SLICE_BYTES = 256 * 2**20  # a row group that decodes to more is read in slices of about this size
DECODE_BYTES = 16 * 2**20  # decoded bytes Arrow's reader decodes at once on its pool (`_pieced`)


def share_groups(f: LogFile) -> range:
    """The row groups `f` reads: its share's, or all."""
    return range(*f.row_groups) if f.row_groups else range(f.num_row_groups)


def iter_batches(
    f: LogFile,
    columns: Sequence[str],
    batch_rows: int = 4096,
    groups: Iterable[int] | None = None,
    threads: bool = False,
) -> Iterator[tuple[int, pa.Table]]:
    """(file row of its first row, table) batches of the given columns (those present in the
    file) from the row groups `groups` (default: the file's share). `threads`: decode on Arrow's
    thread pool (else on the calling thread). A row group that decodes to more than SLICE_BYTES
    is decoded a slice of rows at a time; a local one of more than COLUMNWISE_BYTES a column at a
    time on one thread, or `batch_rows` rows at a time on the pool."""
    names = set(f.schema.names)
    cols = [c for c in columns if c in names]
    if f.table is not None:
        tables: Iterable[tuple[int, pa.Table]] = [(0, f.table.select(cols))]
    else:
        small = f.largest_row_group < _SMALL_ROW_GROUP  # Arrow's read-ahead and threads cost more than they save
        pf = pq.ParquetFile(source(f.path), pre_buffer=not small or storage.is_remote(f.path))
        tables = _groups(pf, f, cols, share_groups(f) if groups is None else groups, batch_rows, threads and not small)
    for first, t in tables:
        for off in range(0, max(t.num_rows, 1), batch_rows):
            part = t.slice(off, batch_rows)
            if part.num_rows:
                yield first + off, part


def _groups(
    pf: pq.ParquetFile, f: LogFile, cols: list[str], groups: Iterable[int], batch_rows: int, threads: bool
) -> Iterator[tuple[int, pa.Table]]:
    sizes = f.groups or group_sizes(pf.metadata)
    remote = storage.is_remote(f.path)
    for rg in groups:
        size = sizes[rg]
        whole = size.decoded <= COLUMNWISE_BYTES or remote or not cols  # object storage keeps whole row groups
        if size.decoded <= SLICE_BYTES and whole:
            yield size.first_row, pf.read_row_group(rg, columns=cols, use_threads=threads)
            continue
        if size.decoded <= SLICE_BYTES and not threads:  # a request per column costs more on object storage
            columns = [pf.read_row_group(rg, columns=[c], use_threads=False).column(0) for c in cols]
            yield size.first_row, pa.Table.from_arrays(columns, names=cols)
            continue
        rows = max(1, min(batch_rows, size.rows * SLICE_BYTES // size.decoded))
        step = max(1, min(rows, size.rows * DECODE_BYTES // size.decoded))
        yield from _pieced(
            pf.iter_batches(batch_size=step, row_groups=[rg], columns=cols, use_threads=threads), rows, size.first_row
        )


def _pieced(pieces: Iterator[pa.RecordBatch], rows: int, first: int) -> Iterator[tuple[int, pa.Table]]:
    """(first row, table) of `rows` rows each (the last fewer) from the record batches `pieces`,
    each table one chunk per column: Arrow's reader keeps buffers of about twice the rows it
    decodes at once for as long as it reads, so it decodes pieces of DECODE_BYTES and they are
    joined here, a column at a time (one column's copy in flight)."""
    held: list[pa.RecordBatch] = []
    n = 0
    for b in pieces:
        while b.num_rows:
            take = min(b.num_rows, rows - n)
            held.append(b.slice(0, take))
            n += take
            b = b.slice(take)
            if n == rows:
                yield first, _joined(held)
                first, held, n = first + rows, [], 0
    if held:
        yield first, _joined(held)


def _joined(held: list[pa.RecordBatch]) -> pa.Table:
    """One table of the record batches `held` (emptied), a chunk per column."""
    schema = held[0].schema
    columns = [[b.column(i) for b in held] for i in range(len(schema))]
    held.clear()
    out = []
    for i, chunks in enumerate(columns):
        columns[i] = []
        out.append(chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks))
        del chunks
    return pa.Table.from_arrays(out, schema=schema)


def read_table(f: LogFile, columns: Sequence[str] | None = None) -> pa.Table:
    cols = None if columns is None else [c for c in columns if c in f.schema.names]
    return pq.read_table(source(f.path), columns=cols)


def _is_log_root(d: Path) -> bool:
    """A directory laid out as one log: it holds a `trajectories` or `updates` folder, or Parquet
    files of its own (a flat log)."""
    try:
        with os.scandir(d) as it:
            for e in it:
                if e.name in ("trajectories", "updates") and e.is_dir():
                    return True
                if e.name.endswith(".parquet") and not e.name.startswith((".", "_")):
                    return True
    except OSError:
        return False
    return False


def logs_under(path: str | os.PathLike) -> list[str] | None:
    """The logs a local directory holds when it is not a log itself but a directory of runs
    (`logs/run1/trajectories/`, `logs/run2/trajectories/`): each directory under it that holds a
    `trajectories` folder, outermost first, sorted. None when `path` is a log itself (or a file, a
    URI, or a directory with no such run in it): it is audited as one log, as before. A run's own
    subdirectories are not searched for further runs. Parquet files outside every run found make
    no log of their own: they are listed by `stray_files`."""
    if storage.is_remote(path):
        return None
    p = Path(path)
    if not p.is_dir() or _is_log_root(p):
        return None
    runs: list[str] = []
    for here, subdirs, _ in os.walk(p, onerror=None, followlinks=False):  # symlinked directories are not entered
        subdirs.sort()
        for s in list(subdirs):
            if s.startswith((".", "_")):  # hidden: no part of any log (`_classify`), nor a run
                subdirs.remove(s)
            elif os.path.isdir(os.path.join(here, s, "trajectories")):
                runs.append(os.path.join(here, s))
                subdirs.remove(s)  # a run's own folders hold its partitions, not further runs
    return sorted(runs) or None


def stray_files(path: str | os.PathLike, runs: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Parquet files under `path` that lie in none of `runs` (the logs `logs_under` found), and
    what lies in none of them and was not read (path, reason: a killed writer's temporary output)."""
    files, skipped = _parquet_paths(Path(path))
    roots = [os.path.realpath(r) for r in runs]
    outside = lambda f: not any(_within(os.path.realpath(f), r) for r in roots)
    return [str(f) for f in files if outside(f)], [(f, why) for f, why in skipped if outside(f)]
