"""`RolloutWriter.write` takes a log's records as a user holds them: polars and pandas dataframes
and Arrow tables, each written to the same file as the records themselves."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest

import rollout_audit as ra

COMPLIANT = "fixtures/compliant"


def _frame() -> pl.DataFrame:
    first = sorted(Path(COMPLIANT, "trajectories").glob("*.parquet"))[0]
    out = pl.from_arrow(pq.read_table(first).slice(0, 8))
    assert isinstance(out, pl.DataFrame)
    return out


def _written(tmp_path, name, batch) -> pl.DataFrame:
    path = tmp_path / name / "trajectories" / "part-0000.parquet"
    with ra.RolloutWriter(path) as w:
        w.write(batch)
    return pl.from_arrow(pq.read_table(path))


@pytest.mark.parametrize("kind", ["polars", "pandas", "pandas-read", "arrow"])
def test_a_dataframe_writes_what_its_records_write(tmp_path, kind):
    frame = _frame()
    records = frame.to_dicts()
    # pandas as a user builds it, from records (polars' to_pandas turns a nested null into NaN), or
    # as pandas reads a log back (pd.read_parquet: Arrow's conversion, a map cell as (key, value) pairs)
    batch = {
        "polars": frame,
        "pandas": pd.DataFrame(records),
        "pandas-read": frame.to_arrow().to_pandas(),
        "arrow": frame.to_arrow(),
    }[kind]
    assert _written(tmp_path, kind, batch).equals(_written(tmp_path, "records", records))
    code = ra.audit(str(tmp_path / kind)).exit_code()
    assert code in (0, 1)  # audited as a log (eight trajectories of a batch: groups may be cut)


def test_a_dataframe_missing_a_required_column_is_refused_naming_it(tmp_path):
    frame = _frame().drop("trajectory_id")
    with pytest.raises(ra.RolloutAuditError, match="trajectory_id"):
        _written(tmp_path, "bad", frame)


def test_a_pandas_index_is_not_written_as_a_column(tmp_path):
    frame = pd.DataFrame(_frame().to_dicts())
    frame.index = pd.RangeIndex(100, 100 + len(frame))
    assert not any(c.startswith("__index") for c in _written(tmp_path, "indexed", frame).columns)
