"""`scan(path)`: a rollout log as polars LazyFrames, for notebooks and pipelines."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import polars as pl
import pyarrow as pa

from ..contract.errors import UsageError
from .io import Discovery, discover

_TOKEN_LISTS = ["token_ids", "token_source", "loss_mask", "behavior_logprobs", "token_turn"]


@dataclass
class Log:
    """A discovered log. Frames are lazy: nothing is read until `.collect()`.

    `broken` lists files that could not be opened (path, reason); they are left out of
    the frames and reported as S005 by the audit.
    """

    discovery: Discovery

    @property
    def files(self) -> list[str]:
        return [f.path for f in self.discovery.files]

    @property
    def broken(self) -> list[tuple[str, str]]:
        return self.discovery.broken

    def _scan(self, kind: str) -> pl.LazyFrame | None:
        files = self.discovery.of_kind(kind)
        paths = [f.path for f in files if f.table is None]
        frames = [  # a table held in memory (a conversion, tables made in code) is read where it is
            pl.from_arrow(f.table).lazy().with_columns(pl.lit(f.path).alias("file"))  # type: ignore[union-attr]
            for f in files
            if f.table is not None
        ]
        if paths:
            frames.insert(
                0,
                pl.scan_parquet(  # glob=False: a file called `s[1].parquet` is that file, never a pattern
                    paths,
                    hive_partitioning=False,
                    missing_columns="insert",
                    extra_columns="ignore",
                    include_file_paths="file",
                    glob=False,
                ),
            )
        if not frames:
            return None
        return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")

    @cached_property
    def trajectories(self) -> pl.LazyFrame:
        """One row per trajectory, every column as stored, plus `file`."""
        lf = self._scan("trajectories")
        if lf is None:
            n = len(self.broken)
            raise UsageError(
                f"no readable trajectory file ({n} file{'s' * (n != 1)} unreadable: {self.broken[0][0]})"
                if n
                else "the log holds no trajectory files"
            )
        return _contract_columns(lf, "trajectories")

    @property
    def turns(self) -> pl.LazyFrame:
        """One row per turn: trajectory_id, turn (index in the list) and the turn fields."""
        return (
            self.trajectories.select("trajectory_id", "turns")
            .with_columns(pl.int_ranges(pl.col("turns").list.len()).alias("turn"))
            .explode(["turns", "turn"])
            .drop_nulls("turn")
            .unnest("turns")
        )

    @property
    def tokens(self) -> pl.LazyFrame:
        """One row per token: trajectory_id, position, and the token lists as columns.

        Rows whose token lists differ in length (S003) are left out.
        """
        lf = self.trajectories
        names = [c for c in _TOKEN_LISTS if c in lf.collect_schema().names()]
        same = pl.all_horizontal([pl.col(c).list.len() == pl.col(names[0]).list.len() for c in names])
        return (
            lf.select("trajectory_id", *names)
            .filter(same)
            .with_columns(pl.int_ranges(pl.col(names[0]).list.len()).alias("position"))
            .explode([*names, "position"])
            .drop_nulls("position")
            .select("trajectory_id", "position", *names)
        )

    @property
    def updates(self) -> pl.LazyFrame | None:
        """One row per optimizer update, or None when the log has no update records."""
        lf = self._scan("updates")
        return None if lf is None else _contract_columns(lf, "updates")


def _contract_columns(lf: pl.LazyFrame, kind: str) -> pl.LazyFrame:
    """`lf` with every contract column of `kind` its files lack added as nulls of the contract's
    type: a log without a required column (S001 in an audit) still has statistics, never a crash."""
    from ..contract import schema as S

    have = set(lf.collect_schema().names())
    absent = [c for c in S.columns(kind) if c.name not in have]
    if not absent:
        return lf
    return lf.with_columns(
        pl.lit(None, dtype=pl.from_arrow(pa.nulls(0, c.arrow_type)).dtype).alias(c.name)  # type: ignore[union-attr]
        for c in absent
    )


def scan(path: str | os.PathLike | Sequence[str | os.PathLike]) -> Log:
    """Discover the Parquet files of a log (a file, a directory, or several)."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    return Log(discover(paths))
