"""Hostile input, round 5: a log on disk cannot waive a required column on its own word
(`rollout_log.not_recorded`); only the user's configuration (`not_recorded`) or an adapter's
in-memory conversion is believed. Through the CLI, as a user runs it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_hostile import cli

from rollout_audit.contract import schema as S

ROOT = Path(__file__).resolve().parent.parent
BROKEN = ROOT / "fixtures" / "broken"


def _waive_itself(log: Path, col: str) -> None:
    """Every trajectory file of `log` without `col`, declaring it not recorded in its own metadata."""
    for f in (log / "trajectories").glob("*.parquet"):
        t = pq.read_table(f).drop_columns([col])
        meta = {**(t.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps({col: "not recorded here"}).encode()}
        pq.write_table(t.replace_schema_metadata(meta), f)


@pytest.mark.parametrize(
    "name,col",
    [("positive_logprob", "behavior_logprobs"), ("stop_reason_contradicts_flag", "stop_reason")],
)
def test_a_log_cannot_waive_its_own_required_column(tmp_path, name, col):
    """The broken fixture with the column its finding reads dropped and declared not recorded: S001
    naming the column and the setting, until the user's own configuration says so."""
    log = tmp_path / name
    shutil.copytree(BROKEN / name, log)
    _waive_itself(log, col)
    r = cli("check", str(log), "--format", "concise")
    assert r.returncode == 1 and f"{col}: required column missing" in r.stdout, r.stdout
    assert f'not_recorded = ["{col}"]' in r.stdout, r.stdout
    own = (log / "pyproject.toml").read_text() if (log / "pyproject.toml").exists() else "[tool.rollout-audit]\n"
    (log / "pyproject.toml").write_text(own + f'not_recorded = ["{col}"]\n')
    r = cli("check", str(log))
    assert r.returncode == 2 and "not_recorded: refused" in r.stderr, r.stderr  # a log's own config cannot either
    (log / "pyproject.toml").write_text(own)
    mine = tmp_path / "mine.toml"
    mine.write_text(f'[tool.rollout-audit]\nnot_recorded = ["{col}"]\n')
    r = cli("check", str(log), "--config", str(mine), "--format", "json")
    rep = json.loads(r.stdout)
    assert "S001" not in {f["code"] for f in rep["findings"]}, r.stdout[-800:]
    assert "not recorded here" in {n["reason"] for n in rep["not_run"]}


def test_the_user_cannot_waive_what_the_contract_requires_of_everyone(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('[tool.rollout-audit]\nnot_recorded = ["loss_mask"]\n')
    r = cli("check", str(ROOT / "fixtures" / "compliant"), "--config", str(mine))
    assert r.returncode == 2 and "'loss_mask' cannot be left out" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_l207_names_the_same_turn_in_every_run_when_ratios_are_nan(tmp_path):
    """A second log-prob column of NaN for one trajectory: every turn of it is beyond the bound
    (NaN is no ratio), and the finding names its first turn, whatever order the turns were summed in."""
    import numpy as np
    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    import rollout_audit as ra
    from rollout_audit.contract.config import Config

    src = sorted(Path("fixtures/compliant/trajectories").glob("*.parquet"))[0]
    table = pq.read_table(src)
    lp = table.column("behavior_logprobs").combine_chunks()
    lengths = pc.list_value_length(lp).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(lp).to_numpy(zero_copy_only=False).astype(np.float64)
    owner = np.repeat(np.arange(table.num_rows), lengths)
    flat = np.where((owner == 3) & ~np.isnan(flat), np.nan, flat)  # NaN values, not nulls
    other = pa.ListArray.from_arrays(lp.offsets, pa.array(flat, pa.float32(), from_pandas=False))
    (tmp_path / "trajectories").mkdir()
    pq.write_table(table.append_column("old_logprobs", other), tmp_path / "trajectories" / "p.parquet")
    turns = set()
    for workers in (1, 2, 1):
        rep = ra.audit(str(tmp_path), config=Config(compare_logprobs="old_logprobs"), select=["L207"], workers=workers)
        found = rep.findings.filter(pl.col("code") == "L207")
        assert found["trajectory_id"].to_list() == [table.column("trajectory_id")[3].as_py()], rep.render()
        turns.add(found["turn"][0])
    assert len(turns) == 1
