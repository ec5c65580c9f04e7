"""What a user meets first, through the command line and the library: a directory of runs, logs
written from dataframes (dictionary-encoded strings, large and view layouts, other widths)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rollout_audit.cli import main

ROOT = Path(__file__).resolve().parent.parent
COMPLIANT = ROOT / "fixtures" / "compliant"
BROKEN = ROOT / "fixtures" / "broken"


def cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


# ---------------------------------------------------------------- a directory of runs


def test_a_directory_of_runs_is_audited_run_by_run(tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(COMPLIANT, logs / "run1")
    shutil.copytree(COMPLIANT, logs / "run2")
    res = cli("check", logs, "--format", "json", "--select", "S,U")
    assert res.exit_code == 0, res.output
    assert f"{logs}: 2 logs found" in res.stderr and "--merge" in res.stderr
    out = json.loads(res.stdout)["logs"]
    assert [x["path"] for x in out] == [str(logs / "run1"), str(logs / "run2")]
    assert all(x["summary"]["configuration"].endswith("pyproject.toml [tool.rollout-audit]") for x in out)
    merged = cli("check", logs, "--merge", "--select", "S002")  # partitions of one log: joined on request
    assert merged.exit_code == 1 and "S002 [error] duplicate trajectory_id: 128 findings" in merged.stdout


def test_a_configuration_inside_the_directory_of_runs_came_with_the_logs(tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(BROKEN / "loss_over_whole_transcript", logs / "run1")
    (logs / "pyproject.toml").write_text('[tool.rollout-audit]\nignore = ["U"]\n')  # would hide U601
    res = cli("check", logs)
    assert res.exit_code == 2 and "refused" in res.stderr and str(logs / "pyproject.toml") in res.stderr


def test_the_bundled_broken_logs_are_fifty_logs_not_one():
    n = sum(1 for p in BROKEN.iterdir() if (p / "trajectories").is_dir())
    res = cli("check", BROKEN, "--format", "concise", "--select", "S002,U601")
    assert f"fixtures/broken: {n} logs found" in res.stderr
    verdicts = [line for line in res.stdout.splitlines() if any(v in line for v in (": ok: ", ": FAIL: "))]
    assert len(verdicts) == n - 1  # one verdict per log, but corrupt_file's: nothing to audit, said on stderr
    assert f"rollout-audit: error: {BROKEN / 'corrupt_file'}: nothing to audit: " in res.stderr
    s002 = [line for line in res.stdout.splitlines() if " S002 " in line]
    assert s002 and all("duplicate_shard_row" in line for line in s002)  # only the log that repeats an id
    assert any(v.startswith(f"{BROKEN / 'loss_over_whole_transcript'}: FAIL: 1 error") for v in verdicts)


def test_a_log_directory_stays_one_log(tmp_path):
    res = cli("check", COMPLIANT)
    assert res.exit_code == 0 and "logs found" not in res.stderr and "==" not in res.stdout


# ---------------------------------------------------------------- storage forms of the contract's values


def _restore(src: Path, dst: Path, convert) -> Path:
    for kind in ("trajectories", "updates"):
        (dst / kind).mkdir(parents=True)
        t = pq.read_table(src / kind / "part-0000.parquet").combine_chunks()
        cols = [convert(c.chunks[0], True) for c in t.columns]
        out = pa.Table.from_arrays(cols, names=t.column_names).replace_schema_metadata(t.schema.metadata)
        pq.write_table(out, dst / kind / "part-0000.parquet")
    shutil.copy(src / "pyproject.toml", dst)
    return dst


def _dictionary(arr: pa.Array, top: bool) -> pa.Array:
    t = arr.type
    if pa.types.is_string(t):
        return arr.dictionary_encode()
    if pa.types.is_list(t):
        return pa.ListArray.from_arrays(arr.offsets, _dictionary(arr.values, False), mask=arr.is_null())
    if pa.types.is_struct(t):
        ch = [_dictionary(arr.field(i), False) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(ch, fields=[pa.field(f.name, c.type) for f, c in zip(t, ch)])
    return arr


def _view(arr: pa.Array, top: bool) -> pa.Array:
    t = arr.type
    if pa.types.is_list(t):
        lens = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        offs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        vals = _view(arr.flatten(), False)
        return pa.LargeListViewArray.from_arrays(pa.array(offs), pa.array(lens), vals, mask=arr.is_null())
    if pa.types.is_struct(t):
        ch = [_view(arr.field(i), False) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(ch, fields=[pa.field(f.name, c.type) for f, c in zip(t, ch)])
    if pa.types.is_string(t) and top:
        return arr.cast(pa.string_view())
    return arr


def _widths(arr: pa.Array, top: bool) -> pa.Array:
    t = arr.type
    if pa.types.is_int64(t):
        return arr.cast(pa.int32())
    if pa.types.is_int16(t) or pa.types.is_int32(t):
        return arr.cast(pa.int64())
    if pa.types.is_float64(t):
        return arr.cast(pa.float32()) if top else arr
    if pa.types.is_string(t):
        return arr.cast(pa.large_string())
    if pa.types.is_list(t):
        return arr.cast(pa.large_list(_widths(arr.flatten(), False).type))
    return arr


@pytest.mark.parametrize("form", [_dictionary, _view, _widths], ids=["dictionary", "large-list-view", "widths"])
def test_every_storage_form_of_the_contracts_values_reads_as_the_contract(tmp_path, form):
    log = _restore(COMPLIANT, tmp_path / "log", form)
    kinds = {pq.read_schema(log / "trajectories" / "part-0000.parquet").field(c).type for c in ("task_id", "turns")}
    assert all(
        t != pq.read_schema(COMPLIANT / "trajectories" / "part-0000.parquet").field("task_id").type for t in kinds
    )
    res = cli("check", log, "--format", "json")
    rep = json.loads(res.stdout)
    assert res.exit_code == 0, res.stdout[:2000]
    as_written = json.loads(cli("check", COMPLIANT, "--format", "json").stdout)["summary"]["checks_run"]
    assert rep["findings"] == [] and rep["summary"]["checks_run"] == as_written  # every check the log feeds


def test_a_pandas_category_column_is_a_string_column(tmp_path):
    t = pq.read_table(COMPLIANT / "trajectories" / "part-0000.parquet")
    flat = t.select(["task_id", "stop_reason"]).to_pandas().astype("category")
    cat = pa.Table.from_pandas(flat, preserve_index=False)
    assert pa.types.is_dictionary(cat.schema.field("task_id").type)
    for name in ("task_id", "stop_reason"):
        t = t.set_column(t.schema.get_field_index(name), name, cat.column(name))
    (tmp_path / "log" / "trajectories").mkdir(parents=True)
    pq.write_table(t, tmp_path / "log" / "trajectories" / "part-0000.parquet")
    shutil.copytree(COMPLIANT / "updates", tmp_path / "log" / "updates")
    shutil.copy(COMPLIANT / "pyproject.toml", tmp_path / "log")
    res = cli("check", tmp_path / "log", "--format", "concise")
    assert res.exit_code == 0 and "S001" not in res.stdout and "S005" not in res.stdout, res.stdout


# ---------------------------------------------------------------- the writer takes the configuration


def test_the_writer_takes_the_producers_stop_reasons(tmp_path):
    import rollout_audit as ra
    from rollout_audit.contract.config import Config, tomllib
    from rollout_audit.contract.errors import RolloutAuditError
    from rollout_audit.faults import read_records

    trajs, _ = read_records(COMPLIANT)
    cut = next(t for t in trajs if t["truncated"])
    cut["stop_reason"] = "budget_exhausted"
    path = tmp_path / "log" / "trajectories" / "part-0000.parquet"
    with pytest.raises(RolloutAuditError) as refused:
        with ra.RolloutWriter(path) as w:
            w.write(trajs)
    hint = str(refused.value)
    assert 'extra_stop_reasons = {"budget_exhausted" = "truncated"}' in hint, hint
    toml = hint[hint.index("extra_stop_reasons = {") : hint.index("})") + 1]
    settings = tomllib.loads(toml)  # the hint is TOML that pastes into [tool.rollout-audit]
    with ra.RolloutWriter(path, config=Config(**settings)) as w:
        w.write(trajs)
    (tmp_path / "log" / "pyproject.toml").write_text(f"[tool.rollout-audit]\n{toml}\n")
    res = cli("check", tmp_path / "log", "--select", "T302")
    assert res.exit_code == 0, res.stdout


# ---------------------------------------------------------------- pandera models and checks


def test_the_contract_models_enforce_the_contract():
    import pandera.errors as pe
    import polars as pl

    from rollout_audit.contract.models import TrajectoryFrame, TurnFrame, UpdateFrame

    df = pl.read_parquet(COMPLIANT / "trajectories")
    TrajectoryFrame.validate(df, lazy=True)
    TurnFrame.validate(df.select(pl.col("turns").explode()).unnest("turns"), lazy=True)
    UpdateFrame.validate(pl.read_parquet(COMPLIANT / "updates"), lazy=True)
    row = pl.int_range(pl.len())
    bad = df.drop("task_id").with_columns(
        pl.when(row == 0).then(None).otherwise(pl.col("trajectory_id")).alias("trajectory_id"),
        pl.when(row == 1).then(pl.lit("gave_up")).otherwise(pl.col("stop_reason")).alias("stop_reason"),
        pl.when(row == 2).then(True).otherwise(pl.col("truncated")).alias("truncated"),
        pl.col("reset_seed").cast(pl.Int32),  # another width of the same values: not a failure
    )
    bad = pl.concat([bad, bad.slice(5, 1)])  # row 5's id twice
    with pytest.raises(pe.SchemaErrors) as err:
        TrajectoryFrame.validate(bad, lazy=True)
    fc = err.value.failure_cases
    got = {(c, i) for c, i in fc.select("check", "index").iter_rows()}
    assert ("column_in_dataframe", None) in got and ("not_nullable", 0) in got
    assert {("field_uniqueness", 5), ("field_uniqueness", 128), ("one stop cause", 2)} <= got
    assert any(c.startswith("isin") and i == 1 for c, i in got) and not any(
        "reset_seed" in str(c) for c in fc["column"]
    )
    with pytest.raises(pe.SchemaErrors):
        UpdateFrame.validate(pl.read_parquet(COMPLIANT / "updates").drop("loss_denominator"), lazy=True)


@pytest.mark.parametrize("fault", ["tool_tokens_trained", "loss_over_whole_transcript"])
def test_the_catalogues_checks_in_pandera_name_the_rows_and_codes_check_reports(fault):
    import pandera.errors as pe
    import polars as pl

    from rollout_audit.validation import trajectory_schema

    log = BROKEN / fault
    df, updates = pl.read_parquet(log / "trajectories"), pl.read_parquet(log / "updates")
    reported = json.loads(cli("check", log, "--format", "json").stdout)["findings"]
    with pytest.raises(pe.SchemaErrors) as err:
        trajectory_schema(updates=updates).validate(df, lazy=True)
    fc = err.value.failure_cases.with_columns(pl.col("check").str.slice(0, 4).alias("code"))
    assert set(fc["code"]) == {f["code"] for f in reported}
    ids = df["trajectory_id"]
    for f in reported:
        rows = fc.filter(pl.col("code") == f["code"])["index"].to_list()
        assert rows == ([None] if f["trajectory_id"] is None else [ids.index_of(f["trajectory_id"])])
    trajectory_schema(updates=pl.read_parquet(COMPLIANT / "updates")).validate(
        pl.read_parquet(COMPLIANT / "trajectories"), lazy=True
    )


# ---------------------------------------------------------------- smaller things a user meets


def test_show_settings_is_toml_that_pastes_into_the_table(tmp_path):
    from rollout_audit.contract.config import Config, tomllib

    res = cli("check", COMPLIANT, "--show-settings")
    table = tomllib.loads(res.stdout)["tool"]["rollout-audit"]
    assert table["max_response_tokens"] == 48
    pasted = Config.from_mapping(table, "pasted").settings()
    assert pasted == {k: v for k, v in Config.from_mapping(table, "x").settings().items()}
    assert {k for k, v in pasted.items() if v is not None} == set(table)


def test_a_corrupt_logs_not_run_reasons_say_why():
    rep = json.loads(cli("check", BROKEN / "corrupt_file", "--format", "json").stdout)
    assert rep["not_run"] and all(x["reason"].startswith("nothing was audited: no readable") for x in rep["not_run"])


def test_explain_names_the_source_of_its_lessons():
    out = cli("explain", "M101").stdout
    assert "Lesson “Who generated each token”" in out and "Module 11. RL for LLM agents" in out


def test_users_meet_public_names():
    import pickle

    import rollout_audit as ra
    from rollout_audit.contract import models

    assert f"{ra.AuditFailed.__module__}.{ra.AuditFailed.__qualname__}" == "rollout_audit.AuditFailed"
    assert type(pickle.loads(pickle.dumps(ra.ConfigError("x")))) is ra.ConfigError
    assert not {"Any", "pa", "pl", "pyarrow"} & set(models.__all__)
    trajectory = "s0-i0003-g07-e1"
    out = cli("show", BROKEN / "tool_tokens_trained", trajectory, "--no-color", "--width", "200").stdout
    assert "verifier_success" not in out.splitlines()[0] and "verified " in out.splitlines()[0]
