"""Reading a log for the audit: plan each file's columns against the contract, cast them to
the contract's types, and cut them into batches. One path for Parquet files and for
in-memory tables (an in-memory table is a `LogFile` holding its table)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..contract import schema as S
from . import storage
from .arrays import fill_null
from .io import LogFile, iter_batches, one_line, row_group_too_large, share_groups, source
from .sanitize import cap_tokens, drop_invalid, duplicate_columns, over_tokens
from .types import is_list_like, plain

Problem = tuple[str, str]  # (column, what is wrong)


MEMORY = "<memory>"  # the file name of a table held in memory


def memory_file(table: pa.Table, kind: str) -> LogFile:
    """An in-memory table as a log file named `<memory>` (MEMORY)."""
    return LogFile(MEMORY, kind, table.schema, table.num_rows, 1, table=table)


def _target(name: str, found: pa.DataType, table: str) -> tuple[pa.DataType | None, str | None]:
    """(target type, problem): the contract type to cast to, or why the column is unusable."""
    spec = {c.name: c for c in S.columns(table)}
    if name not in spec:
        return None, None  # unknown columns are ignored
    if name == "turns":
        if not is_list_like(found) or not pa.types.is_struct(found.value_type):
            return None, f"expected list<struct>, found {found}"
        tspec = {c.name: c for c in S.columns("turn")}
        fields = [
            pa.field(f.name, tspec[f.name].arrow_type)
            for f in found.value_type
            if f.name in tspec and S.compatible(f.type, tspec[f.name].arrow_type)
        ]
        return pa.list_(pa.struct(fields)), None
    exp = spec[name].arrow_type
    if not S.compatible(found, exp):
        return None, f"expected {spec[name].type}, found {found}"
    return exp, None


def believed(f: LogFile, waived: Collection[str]) -> frozenset[str]:
    """The required columns `f`'s own `rollout_log.not_recorded` may waive: for a table held in
    memory (an adapter's conversion, or tables the caller built) every one the contract allows;
    for a file on disk only those the user says the trainer does not record (`Config.waived`):
    nothing inside an audited directory weakens the audit on its own word."""
    return S.waivable_names() if f.table is not None else frozenset(waived)


def schema_plan(
    f: LogFile, table: str = "trajectories", waived: Collection[str] = ()
) -> tuple[dict[str, pa.DataType], list[Problem]]:
    """Columns to read with their target types, and the schema problems (S001) of the file.
    `waived`: the required columns the user says the trainer does not record (`Config.waived`)."""
    targets: dict[str, pa.DataType] = {}
    problems: list[Problem] = []
    names = set(f.schema.names)
    problems += [(c, "column name occurs more than once; not audited") for c in duplicate_columns(f.schema)]
    trust = believed(f, waived)
    declared = S.not_recorded(f.schema.metadata, trust)  # the producer's framework does not record these
    for c in S.columns(table):
        if c.requirement == "R" and c.name not in names and c.name not in declared:
            problems.append((c.name, "required column missing" + _unwaived(c.name, f.schema.metadata, trust)))
    duplicated = {c.split(".")[0] for c, _ in problems}
    for fld in (x for x in f.schema if x.name not in duplicated):
        tgt, prob = _target(fld.name, fld.type, table)
        if prob:
            problems.append((fld.name, prob))
        elif tgt is not None:
            targets[fld.name] = tgt
    if table == "trajectories" and "turns" in targets:
        have = {x.name for x in targets["turns"].value_type}
        found = {x.name: x.type for x in f.schema.field("turns").type.value_type}
        for tc in S.columns("turn"):
            if tc.name in found and tc.name not in have:
                problems.append((f"turns.{tc.name}", f"expected {tc.type}, found {found[tc.name]}"))
            elif tc.requirement == "R" and tc.name not in found and f"turns.{tc.name}" not in declared:
                problems.append(
                    (
                        f"turns.{tc.name}",
                        "required turn field missing" + _unwaived(f"turns.{tc.name}", f.schema.metadata, trust),
                    )
                )
    return targets, problems


def _unwaived(name: str, meta: dict[bytes, bytes] | None, trust: frozenset[str]) -> str:
    """Why a required column the file declares not recorded is still missing (S001)."""
    if name not in S.meta_object(meta, S.META_NOT_RECORDED):
        return ""
    bare = name.removeprefix("updates.")
    if bare not in S.waivable_names():
        return " (rollout_log.not_recorded cannot waive it: the contract requires it of every producer)"
    if bare in S.USER_WAIVED:
        if bare in trust:
            return " (reduction and loss_denominator are waived only together)"
        return (
            " (the log's own rollout_log.not_recorded does not waive it: a log cannot vouch for itself; if the "
            "trainer records no loss denominators, say so in your own configuration: denominator_not_recorded = "
            "true; check --from sets it for rLLM and verl)"
        )
    return (
        " (the log's own rollout_log.not_recorded does not waive it: a log cannot vouch for itself; if the "
        f'trainer does not record it, say so in your own configuration: not_recorded = ["{bare}"])'
    )


def cast(table: pa.Table, targets: dict[str, pa.DataType]) -> tuple[pa.Table, list[Problem]]:
    """Cast each column to its contract type; a column whose values do not fit is dropped."""
    cols, names, problems = [], [], []
    for name in table.column_names:
        tgt = targets[name]
        col = plain(table.column(name))  # a list view's offsets rebuilt: Arrow's cast from one does not
        if col.type != tgt:
            try:
                col = col.cast(tgt)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                problems.append((name, f"values do not fit {tgt}: {str(e).splitlines()[0]}"))
                continue
        cols.append(col)
        names.append(name)
    return pa.Table.from_arrays(cols, names=names), problems


@dataclass
class Part:
    """A slice of one file's rows in contract types, with the file's problems (first part only)."""

    table: pa.Table
    file: str
    first_row: int
    problems: list[Problem]
    # several small files in one part: (file, first row in it, rows) of each, in order
    sources: list[tuple[str, int, int]] | None = None


SMALL_FILE_BYTES = 2**20  # a file of one row group that decodes to at most this is read with its neighbours


def parts(
    files: Sequence[LogFile],
    columns: Sequence[str],
    batch_rows: int,
    broken: list[Problem],
    max_row_group_bytes: int,
    max_tokens: int,
    run_tokens: int = 0,
    waived: Collection[str] = (),
    threads: bool = False,
) -> Iterator[Part]:
    """Batches of `columns` (those a file has) from every trajectory file, validated (strings
    and lists in full, before anything reaches polars), capped and cast to the contract. A file
    that fails while being read goes to `broken`, and so does a row group too large to decode.

    Consecutive small files of one schema, up to `batch_rows` rows and `run_tokens` tokens, are
    read as a run and sanitized together, one part listing them in `sources`: per file, only the
    Parquet read is paid. `waived`: as in `schema_plan`. `threads`: decode on Arrow's thread pool."""
    last: tuple[pa.Schema | None, tuple[dict[str, pa.DataType], list[Problem]]] = (None, ({}, []))
    run: list[LogFile] = []
    run_plan = last[1]
    rows = tokens = 0
    limits = (max_row_group_bytes, max_tokens)
    job = _Job(columns, batch_rows, broken, limits, threads)
    for f in files:
        if last[0] is None or not f.schema.equals(last[0]):  # consecutive files mostly share a schema
            last = (f.schema, schema_plan(f, waived=waived))
        plan = last[1]
        small = _small(f, plan, limits) and f.groups[0].tokens <= run_tokens
        if run and (
            not small
            or f.schema is not run[0].schema
            or rows + f.groups[0].rows > batch_rows
            or tokens + f.groups[0].tokens > run_tokens
        ):
            yield from _run(run, run_plan, job)
            run, rows, tokens = [], 0, 0
        if small:
            run.append(f)
            run_plan, rows, tokens = plan, rows + f.groups[0].rows, tokens + f.groups[0].tokens
        else:
            yield from _file_parts(f, plan, job)
    yield from _run(run, run_plan, job)


def _small(f: LogFile, plan: tuple[dict[str, pa.DataType], list[Problem]], limits: tuple[int, int]) -> bool:
    """Whether `f` may be read in a run: one non-empty row group within the limits, a schema without problems."""
    if f.table is not None or f.num_row_groups != 1 or len(f.groups) != 1 or f.row_groups not in (None, (0, 1)):
        return False
    size = f.groups[0]
    small = 0 < size.rows and size.decoded <= min(SMALL_FILE_BYTES, limits[0]) and size.tokens <= limits[1]
    return small and not plan[1]


@dataclass(frozen=True)
class _Job:
    """What every file of one `parts` call is read with."""

    columns: Sequence[str]
    batch_rows: int
    broken: list[Problem]
    limits: tuple[int, int]  # (max_row_group_bytes, max_tokens)
    threads: bool = False  # decode on Arrow's thread pool


def _run(run: list[LogFile], plan: tuple[dict[str, pa.DataType], list[Problem]], job: _Job) -> Iterator[Part]:
    """One part of the run's files, sanitized at once; when that finds a problem (or trajectory
    ids repeat across files, which attribute findings to files), each file on its own."""
    if len(run) > 1:
        targets = plan[0]
        cols = [c for c in job.columns if c in targets]
        try:
            table = _read_run(run, cols)
            part, bad = drop_invalid(table)
            part, long = cap_tokens(part, job.limits[1])
            part, cast_problems = cast(part, targets)
            ids = part.column("trajectory_id") if "trajectory_id" in part.column_names else None
            unique = ids is not None and not ids.null_count and pc.count_distinct(ids).as_py() == part.num_rows
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - any failure of the run's reader, a Rust panic included
            bad, unique = [("", "")], False  # read each file alone: the reader names the one that fails
        if unique and not (bad or long or cast_problems):
            yield Part(part, run[0].path, 0, [], [(f.path, 0, f.num_rows) for f in run])
            return
    for f in run:
        yield from _file_parts(f, plan, job)


def _read_run(run: list[LogFile], cols: list[str]) -> pa.Table:
    """The rows of a run of small local files of one schema, in order. Polars' reader opens the
    files on its threads at about a third of the CPU pyarrow spends per file; what it returns is
    validated and cast like any other table (its strings are checked as UTF-8 while decoding)."""
    if any(storage.is_remote(f.path) for f in run):
        return pa.concat_tables([t for f in run for _, t in iter_batches(f, cols, 1 << 30)])
    df = pl.read_parquet([f.path for f in run], columns=cols, use_pyarrow=False, glob=False)  # names, not patterns
    return df.to_arrow()


def _file_parts(f: LogFile, plan: tuple[dict[str, pa.DataType], list[Problem]], job: _Job) -> Iterator[Part]:
    """The parts of one file (or of its share of row groups)."""
    targets, problems = plan
    cols = [c for c in job.columns if c in targets]
    first = not f.row_groups or f.row_groups[0] == 0  # a share of a file: its rows
    yielded = False
    try:
        groups, pending = readable_groups(f, *job.limits, job.broken)
        pending = (problems if first else []) + pending
        for offset, raw in iter_batches(f, cols, job.batch_rows, groups, job.threads):
            have = set(raw.column_names)
            part, bad = drop_invalid(raw.select([c for c in cols if c in have]), offset)
            part, long = cap_tokens(part, job.limits[1], offset)
            part, cast_problems = cast(part, targets)
            yield Part(part, f.path, offset, pending + bad + long + cast_problems)
            pending, yielded = [], True
    except (OSError, pa.ArrowException) as e:
        job.broken.append((f.path, one_line(e)))
        return
    if not yielded and (first or pending):  # an empty file, or nothing readable: still report its problems
        yield Part(pa.table({c: pa.nulls(0, targets[c]) for c in cols}), f.path, 0, pending)


def readable_groups(
    f: LogFile, max_bytes: int, max_tokens: int, broken: list[Problem]
) -> tuple[list[int] | None, list[Problem]]:
    """The row groups of `f`'s share that may be decoded, judged before decoding: a group whose
    footer says it decodes to more than `max_bytes` goes to `broken` (S005); a group holding a
    trajectory of more than `max_tokens` tokens is left out, each such trajectory a problem
    (S001). None: every group (a table held in memory)."""
    if f.table is not None or not f.groups:
        return None, []
    keep: list[int] = []
    problems: list[Problem] = []
    for rg in share_groups(f):
        size = f.groups[rg]
        if too_large := row_group_too_large(size, rg, max_bytes):
            broken.append((f.path, too_large))
        elif size.tokens > max_tokens and (long := _long_rows(f, rg, max_tokens)):
            problems += long
        else:
            keep.append(rg)
    return keep, problems


def unread_groups(f: LogFile, max_bytes: int, max_tokens: int) -> dict[int, str]:
    """The row groups of `f` the audit does not read under its caps (`max_row_group_bytes`,
    `max_tokens_per_trajectory`), judged from the footer as the audit judges them (group -> why):
    what no command may decode. Empty for a table held in memory."""
    if f.kind == "trajectories":
        why: list[Problem] = []
        keep, long = readable_groups(f, max_bytes, max_tokens, why)
        if keep is None:
            return {}
        reasons = [w for _, w in why] + [str(p[-1]) for p in long]
        return {rg: (reasons[0] if reasons else "not read") for rg in share_groups(f) if rg not in keep}
    if f.table is not None:
        return {}
    return {rg: too for rg in share_groups(f) if (too := row_group_too_large(f.groups[rg], rg, max_bytes))}


def first_unread(files: Sequence[LogFile], max_bytes: int, max_tokens: int) -> tuple[str, str] | None:
    """(file, why) of the first row group among `files` that the audit does not read under its
    caps, or None: a command that reads every row of a log (its statistics, a transcript) refuses
    such a log rather than decode what the audit would not."""
    for f in files:
        if unread := unread_groups(f, max_bytes, max_tokens):
            return f.path, next(iter(unread.values()))
    return None


# token lists by the bytes a value decodes to: the first one present gives a group's row lengths
_NARROWEST = ("loss_mask", "token_source", "token_turn", "token_ids", "behavior_logprobs")


def _long_rows(f: LogFile, rg: int, limit: int) -> list[Problem]:
    """The trajectories of row group `rg` over `limit` tokens, from the row lengths of one token
    list (a boolean mask decodes to a bit per token): the group's other columns, where a long
    list would take gigabytes, are not decoded. Lists of unequal lengths (a file whose token lists
    disagree) are all measured."""
    size = f.groups[rg]
    lists = [c for c in _NARROWEST if c in f.schema.names and is_list_like(f.schema.field(c).type)]
    ids = ["trajectory_id"] if "trajectory_id" in f.schema.names else []
    pf = pq.ParquetFile(source(f.path))
    lengths: pa.Array | None = None
    id_col: pa.Array | None = None
    for name in lists:
        t = pf.read_row_group(rg, columns=[name, *ids])
        n = fill_null(pc.list_value_length(t.column(name)), 0).combine_chunks()
        lengths = n if lengths is None else pc.max_element_wise(lengths, n)
        if ids:
            id_col, ids = t.column("trajectory_id").combine_chunks(), []
        del t
        if (
            pc.sum(n).as_py() or 0
        ) + size.rows >= size.tokens:  # the group's longest list (an empty one is a value too)
            break
    if lengths is None:
        return []
    rest = size.rows - int(pc.sum(pc.greater(lengths, limit)).as_py() or 0)
    also = (
        f"; row group {rg} is not read, so its {rest} other trajectories (rows {size.first_row}-"
        f"{size.first_row + size.rows - 1}) are not audited either"
        if rest
        else ""
    )
    return over_tokens(lengths, id_col, limit, size.first_row, also)[1]


def read_updates(
    files: Sequence[LogFile], broken: list[Problem], max_row_group_bytes: int, waived: Collection[str] = ()
) -> pl.DataFrame | None:
    """Every update record, cast to the contract, with its `file`. A file with schema
    problems, or a row group too large to decode, is left out; a column whose values do not
    fit is dropped; all go to `broken`."""
    frames = [df for f in files if (df := read_update_file(f, broken, max_row_group_bytes, waived)) is not None]
    if not frames:
        return None
    return pl.concat(frames, how="diagonal_relaxed")


def read_update_file(
    f: LogFile, broken: list[Problem], max_row_group_bytes: int, waived: Collection[str] = ()
) -> pl.DataFrame | None:
    """The update records of one file, as `read_updates` has them (None: the file is left out).
    `waived`: as in `schema_plan`."""
    too_large = [why for rg, g in enumerate(f.groups) if (why := row_group_too_large(g, rg, max_row_group_bytes))]
    if too_large:
        broken.append((f.path, "update records: " + "; ".join(too_large)))
        return None
    targets, problems = schema_plan(f, "updates", waived)
    if problems:
        broken.append((f.path, "update records: " + "; ".join(f"{c}: {p}" for c, p in problems)))
        return None
    try:
        pieces = [t for _, t in iter_batches(f, list(targets), 1 << 30)]
        t = pa.concat_tables(pieces) if pieces else pa.table({c: pa.nulls(0, targets[c]) for c in targets})
        t, bad = drop_invalid(t)
        if bad:
            broken.append((f.path, "update records: " + "; ".join(f"{c}: {p}" for c, p in bad)))
            return None
        t, cast_problems = cast(t, targets)
    except (OSError, pa.ArrowException) as e:
        broken.append((f.path, one_line(e)))
        return None
    if cast_problems:
        broken.append((f.path, "update records: " + "; ".join(f"{c}: {p}" for c, p in cast_problems)))
    df = pl.from_arrow(t)
    assert isinstance(df, pl.DataFrame)
    return df.with_columns(pl.lit(f.path).alias("file"))
