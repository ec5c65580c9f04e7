"""The reading pipeline: a log's trajectory files in, parts of at most so many rows and tokens
out. The engine and every executor consume `batches` and nothing else; an executor that spreads
the work over processes cuts the files into `shares` first and calls `batches` on each.

Memory follows tokens: episodes of 20k tokens in row groups sized for 600 would make batches
thirty times larger, so a part holds at most `BATCH_TOKENS` tokens (one trajectory may exceed it
alone). Consecutive small parts of different files share a batch: each batch costs some hundred
polars calls whatever its size, so a log of many small files would otherwise pay that per file."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..contract.config import Config
from ..contract.schema import TOKEN_LISTS
from .arrays import list_lengths
from .io import Discovery, LogFile
from .read import Part, Problem, parts

BATCH_TOKENS = 1 << 21  # tokens per batch at most (one trajectory may exceed it alone)


def batches(
    files: Sequence[LogFile],
    columns: Sequence[str],
    batch_rows: int,
    broken: list[Problem],
    cfg: Config | None = None,
    threads: bool = False,
) -> Iterator[Part]:
    """The files' rows (`columns` of them) in parts of at most `batch_rows` rows and
    `BATCH_TOKENS` tokens, read, sanitized and cast by `read.parts` within the configuration's
    limits; unreadable files go to `broken`. A part of several small files lists them in `sources`.
    `threads`: decode on Arrow's thread pool (the parts are the same either way)."""
    cfg = cfg or Config()
    pending: list[Part] = []
    rows = tokens = 0
    limits = (cfg.max_row_group_bytes, cfg.max_tokens_per_trajectory)
    read = parts(
        files, columns, batch_rows, broken, *limits, run_tokens=BATCH_TOKENS // 2, waived=cfg.waived(), threads=threads
    )
    for part, k in (piece for whole in read for piece in _by_tokens(whole)):
        n = part.table.num_rows
        small = not part.problems and part.sources is None and 0 < n <= batch_rows // 2 and k <= BATCH_TOKENS // 2
        if pending and (not small or rows + n > batch_rows or tokens + k > BATCH_TOKENS or not _same(pending[0], part)):
            yield from _merged(pending)
            pending, rows, tokens = [], 0, 0
        if small:
            pending.append(part)
            rows, tokens = rows + n, tokens + k
        else:
            yield part
    yield from _merged(pending)


def why_unusable(disc: Discovery, broken: list[Problem]) -> str:
    """One line: why no trajectory row could be read."""
    n_traj = len(disc.of_kind("trajectories"))
    if not n_traj and not broken:
        return "the log holds no trajectory records"
    if broken and not n_traj:
        return f"no readable trajectory file ({len(broken)} file{'s' * (len(broken) != 1)} unusable: see S005)"
    paths = {f.path for f in disc.of_kind("trajectories")}
    refused = sum(1 for path, _ in broken if path in paths)
    if refused:
        return f"every row of the trajectory files was refused ({refused} part{'s' * (refused != 1)}: see S005)"
    return "the trajectory files hold no rows"


@dataclass(frozen=True)
class Share:
    """Row groups [start, stop) of one trajectory file, starting at `first_row` of the file."""

    file: LogFile
    start: int
    stop: int
    first_row: int

    def opened(self) -> LogFile:
        """The file restricted to this share's row groups (a file held in memory stays whole)."""
        f = self.file
        return f if f.table is not None else replace(f, row_groups=(self.start, self.stop), first_row=self.first_row)


def shares(files: Sequence[LogFile], rows_per_share: int) -> list[Share]:
    """Cut every file into runs of row groups of about `rows_per_share` rows (a file held in
    memory is one share). A row group too large to decode is reported by the reader of its share."""
    out: list[Share] = []
    for f in files:
        if f.table is not None or f.num_row_groups < 2 or len(f.groups) != f.num_row_groups:
            out.append(Share(f, 0, f.num_row_groups, 0))
            continue
        sizes = np.array([g.rows for g in f.groups], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        start = 0
        for i in range(1, len(sizes) + 1):
            if i == len(sizes) or starts[i] - starts[start] >= rows_per_share:
                out.append(Share(f, start, i, int(starts[start])))
                start = i
    return out


def _token_lengths(table: pa.Table) -> np.ndarray | None:
    """Tokens of each row, from the first token list the table has (None when it has none)."""
    name = next((c for c in TOKEN_LISTS if c in table.column_names), None)
    if name is None:
        return None
    return list_lengths(table.column(name), 0)


def _by_tokens(part: Part) -> Iterator[tuple[Part, int]]:
    """`part` in consecutive slices of at most `BATCH_TOKENS` tokens (a longer row stays whole),
    each with its token count; the file's problems go with the first slice."""
    lengths = _token_lengths(part.table)
    total = 0 if lengths is None else int(lengths.sum())
    if lengths is None or total <= BATCH_TOKENS or part.sources is not None:  # a run of files stays whole
        yield part, total
        return
    ends = np.cumsum(lengths)
    start, problems = 0, part.problems
    while start < len(lengths):
        base = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, base + BATCH_TOKENS, side="right")), start + 1)
        piece = Part(part.table.slice(start, stop - start), part.file, part.first_row + start, problems)
        yield piece, int(ends[stop - 1]) - base
        start, problems = stop, []


def _same(a: Part, b: Part) -> bool:
    return a.table.schema.equals(b.table.schema)


def _merged(pending: list[Part]) -> Iterator[Part]:
    """One part of several files' parts, or each part alone when trajectory ids collide
    between them (findings are attributed to files by id)."""
    if len(pending) <= 1:
        yield from pending
        return
    table = pa.concat_tables([q.table for q in pending]).combine_chunks()
    ids = table.column("trajectory_id") if "trajectory_id" in table.column_names else None
    if ids is None or ids.null_count or pc.count_distinct(ids).as_py() < table.num_rows:
        yield from pending
        return
    sources = [(q.file, q.first_row, q.table.num_rows) for q in pending]
    yield Part(table, pending[0].file, 0, [], sources)
