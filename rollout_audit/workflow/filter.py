"""`rollout-audit filter LOG OUT`: a copy of a log without the trajectories that the selected
checks flagged, and without the updates that named them (an update trained on a dropped
trajectory cannot be kept whole). File layout and file metadata are kept, with the log's own
configuration (the keys that state how the run was produced); the input is never written (OUT
must be new and outside it).

The copy is written under a hidden temporary sibling of OUT that holds, until the last file is
written, a marker file no audit passes (a filter killed part-way leaves nothing that passes), and
is renamed to OUT at the end: OUT appears whole or not at all. A row group the audit could not
read (over `max_row_group_bytes`, or holding a trajectory over `max_tokens_per_trajectory`) is
never decoded nor copied: it is left out, and said so; a file the audit could not open is refused
(exit 2). Every row group is read alone, under the same caps as `check`."""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ..contract.config import LOG_CONTEXT, Config
from ..reading.io import Discovery, LogFile, UsageError, one_line, source
from ..reading.read import unread_groups

# the marker a copy under construction holds: not a Parquet file, so any audit of it is S005
MARKER = "FILTER-INCOMPLETE.parquet"


@dataclass
class Filtered:
    """What `filter_log` wrote and what it left out."""

    trajectories_kept: int = 0
    trajectories_dropped: int = 0
    updates_kept: int = 0
    updates_dropped: int = 0
    files: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # row groups left out unread: file, group, why


def _relative(path: str, roots: list[Path]) -> Path:
    """`path` relative to the audited root that holds it (a file given alone: its name)."""
    p = Path(path).resolve()
    for r in roots:
        if r.is_dir() and (r == p or r in p.parents):
            return p.relative_to(r)
    return Path(p.name)


def _toml(v: object) -> str:
    """One TOML value (the types of the log-context keys)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (int, float, str)):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def own_table(own: Config | None) -> str | None:
    """The log's own configuration (its keys that state how the run was produced) as a
    `[tool.rollout-audit]` table, for the copy to carry; None when the log came with none."""
    if own is None:
        return None
    keys = {k: getattr(own, k) for k in LOG_CONTEXT if k in own.model_fields_set}
    if not keys:
        return None
    lines = ["# the configuration the filtered log came with (how the run was produced)", "[tool.rollout-audit]"]
    lines += [f"{k} = {_toml(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def _copy_file(f: LogFile, drop: pl.Series, dst: Path, res: Filtered, unread: dict[int, str]) -> None:
    """Copy `f` to `dst` a row group at a time, without the dropped rows and without the row
    groups the audit did not read (schema and metadata kept). UsageError naming the file when it
    cannot be read or holds no ids to filter by."""
    try:
        _copy_groups(f, drop, dst, res, unread)
    except (OSError, pa.ArrowException, pl.exceptions.PolarsError, KeyError, ValueError) as e:
        raise UsageError(f"{f.path}: cannot be copied ({one_line(e)}); nothing written") from None


def _copy_groups(f: LogFile, drop: pl.Series, dst: Path, res: Filtered, unread: dict[int, str]) -> None:
    pf = pq.ParquetFile(source(f.path))
    key = "trajectory_id" if f.kind == "trajectories" else "trajectory_ids"
    if len(pf.schema_arrow.get_all_field_indices(key)) != 1:
        raise KeyError(f"no single {key} column: filter cannot tell which rows to drop")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(dst, pf.schema_arrow, compression="zstd") as w:
        for rg in range(pf.num_row_groups):
            if rg in unread:
                n = f.groups[rg].rows if rg < len(f.groups) else 0
                res.unread.append(f"{f.path}: row group {rg} ({n} rows) not audited, left out: {unread[rg]}")
                if f.kind == "trajectories":
                    res.trajectories_dropped += n
                else:
                    res.updates_dropped += n
                continue
            table = pf.read_row_group(rg)
            if f.kind == "trajectories":
                ids = pl.Series("id", table.column("trajectory_id")).cast(pl.String)
                gone = ids.is_in(drop).fill_null(False)
                res.trajectories_dropped += int(gone.sum())
            else:
                named = pl.DataFrame(
                    {"u": pl.Series("u", table.column("trajectory_ids")).cast(pl.List(pl.String))}
                ).with_row_index("row")
                hit = named.explode("u").filter(pl.col("u").is_in(drop))["row"].unique()
                gone = named["row"].is_in(hit.implode())
                res.updates_dropped += int(gone.sum())
            kept = table.filter(pa.array((~gone).to_numpy()))
            if f.kind == "trajectories":
                res.trajectories_kept += kept.num_rows
            else:
                res.updates_kept += kept.num_rows
            w.write_table(kept)
        if pf.num_row_groups == 0:
            w.write_table(pf.schema_arrow.empty_table())


def filter_log(
    disc: Discovery,
    roots: list,
    drop: set[str],
    out: str | os.PathLike,
    cfg: Config,
    own: Config | None = None,
    unreadable: dict[str, str] | None = None,
) -> Filtered:
    """Copy the files of `disc` under `out`, without trajectories whose id is in `drop` and
    without updates whose `trajectory_ids` name one of them, with the log's own configuration
    `own`. A row group the audit did not read is left out unread (`Filtered.unread`); a file it
    could not open, or that the audit reported unreadable (`unreadable`: file -> why, its S005
    findings), is a UsageError (nothing written)."""
    unreadable = unreadable or {}
    if disc.broken:
        path, why = disc.broken[0]
        raise UsageError(f"{path}: cannot be read ({why}); filter copies whole logs only: nothing written")
    for f in disc.files:
        if f.path in unreadable:
            raise UsageError(
                f"{f.path}: the audit could not read it ({unreadable[f.path]}); filter copies only what the "
                "audit read: nothing written"
            )
    base = [Path(r).resolve() for r in roots]
    dropped = pl.Series("d", sorted(drop), pl.String).implode()
    target = Path(out).absolute()
    tmp = target.with_name(f".{target.name}.filter-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    res = Filtered()
    try:
        (tmp / MARKER).write_text("a filtered copy still being written: not a log (rollout-audit filter)\n")
        for f in disc.files:
            rel = _relative(f.path, base)
            _copy_file(
                f, dropped, tmp / rel, res, unread_groups(f, cfg.max_row_group_bytes, cfg.max_tokens_per_trajectory)
            )
            res.files.append(str(target / rel))
        if table := own_table(own):
            (tmp / "pyproject.toml").write_text(table)
        (tmp / MARKER).unlink()
        if target.is_dir():  # an empty directory named as OUT (check_new_directory allows it)
            target.rmdir()
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return res
