"""`rollout-audit filter LOG OUT`: a copy of a log without the trajectories that the selected
checks flagged, and without the updates that named them (an update trained on a dropped
trajectory cannot be kept whole). File layout and file metadata are kept; the input is never
written (OUT must be new and outside it)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ..reading.io import Discovery, UsageError


@dataclass
class Filtered:
    """What `filter_log` wrote and what it left out."""

    trajectories_kept: int = 0
    trajectories_dropped: int = 0
    updates_kept: int = 0
    updates_dropped: int = 0
    files: list[str] = field(default_factory=list)


def _write(table: pa.Table, dst: Path) -> None:
    """Write `table` (schema metadata kept) to `dst` through a temporary name and a rename."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, dst)


def _relative(path: str, roots: list[Path]) -> Path:
    """`path` relative to the audited root that holds it (a file given alone: its name)."""
    p = Path(path).resolve()
    for r in roots:
        if r.is_dir() and (r == p or r in p.parents):
            return p.relative_to(r)
    return Path(p.name)


def filter_log(disc: Discovery, roots: list, drop: set[str], out: str | os.PathLike) -> Filtered:
    """Copy the files of `disc` under `out`, without trajectories whose id is in `drop` and
    without updates whose `trajectory_ids` name one of them."""
    if disc.broken:
        path, why = disc.broken[0]
        raise UsageError(f"{path}: cannot be read ({why}); filter copies whole logs only")
    base = [Path(r).resolve() for r in roots]
    dropped = pl.Series("d", sorted(drop), pl.String).implode()
    res = Filtered()
    for f in disc.files:
        table = pq.read_table(f.path)
        if f.kind == "trajectories":
            ids = pl.Series("id", table.column("trajectory_id")).cast(pl.String)
            gone = ids.is_in(dropped).fill_null(False)
            res.trajectories_dropped += int(gone.sum())
        else:
            named = pl.DataFrame(
                {"u": pl.Series("u", table.column("trajectory_ids")).cast(pl.List(pl.String))}
            ).with_row_index("row")
            hit = named.explode("u").filter(pl.col("u").is_in(dropped))["row"].unique()
            gone = named["row"].is_in(hit.implode())
            res.updates_dropped += int(gone.sum())
        kept = table.filter(pa.array((~gone).to_numpy()))
        if f.kind == "trajectories":
            res.trajectories_kept += kept.num_rows
        else:
            res.updates_kept += kept.num_rows
        dst = Path(out) / _relative(f.path, base)
        _write(kept, dst)
        res.files.append(str(dst))
    return res
