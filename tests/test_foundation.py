"""Foundation: writer, reader, structural checks S001-S005, CLI exit codes and formats."""

from __future__ import annotations

import hashlib
import json

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import write_log

import rollout_audit as ra
from rollout_audit.cli import main


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def digest(root):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_compliant_log_exits_0_with_no_findings(tmp_path, records):
    root = write_log(tmp_path / "log", *records, validate=True)
    before = digest(root)
    res = run_cli("check", root)
    assert res.exit_code == 0, res.output
    assert "0 errors, 0 warnings" in res.output
    assert digest(root) == before  # never writes to its input


def test_json_shape_is_stable(tmp_path, records):
    trajs, ups = records
    trajs[1]["token_ids"] = trajs[1]["token_ids"][:-1]
    root = write_log(tmp_path / "log", trajs, ups)
    res = run_cli("check", root, "--format", "json")
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert set(doc) == {"findings", "not_run", "partially_run", "check_errors", "unusable", "unfulfilled", "summary"}
    f = doc["findings"][0]
    assert {"code", "severity", "message", "file", "trajectory_id", "turn", "position"} <= set(f)
    assert f["code"] == "S003" and f["trajectory_id"] == trajs[1]["trajectory_id"]
    assert f["file"].endswith(".parquet")
    assert doc["summary"]["counts"]["S003"] == 1
    assert doc["summary"]["rows_read"] == len(trajs)


def test_writer_refuses_bad_record_naming_column_and_trajectory(tmp_path, records):
    trajs, _ = records
    trajs[2]["loss_mask"] = trajs[2]["loss_mask"] + [True]
    with pytest.raises(ValueError, match=r"S003.*loss_mask.*t000002"):
        with ra.RolloutWriter(tmp_path / "x.parquet") as w:
            w.write(trajs)
    assert not list(tmp_path.iterdir())  # nothing published, no temp left behind


def test_writer_refuses_wrong_type(tmp_path, records):
    trajs, _ = records
    trajs[0]["reset_seed"] = "seven"
    with pytest.raises(ValueError, match="record refused"):
        with ra.RolloutWriter(tmp_path / "x.parquet") as w:
            w.write(trajs)


def test_writer_is_atomic(tmp_path, records):
    trajs, _ = records
    w = ra.RolloutWriter(tmp_path / "a.parquet")
    w.write(trajs[:5])
    w.write(trajs[5:10])
    assert not (tmp_path / "a.parquet").exists()  # only a hidden temp file so far
    log = ra.scan(tmp_path)  # a half-written file never reads as a log: it is reported, not read
    assert log.files == [] and len(log.broken) == 1 and "unfinished write" in log.broken[0][1]
    w.close()
    pf = pq.ParquetFile(tmp_path / "a.parquet")
    assert pf.metadata.num_row_groups == 2 and pf.metadata.num_rows == 10
    assert pf.schema_arrow.metadata[b"rollout_log.kind"] == b"trajectories"
    assert pf.schema_arrow.metadata[b"rollout_log.schema_version"] == b"1"


def test_one_file_and_partitions_give_same_findings(tmp_path, records):
    trajs, ups = records
    trajs[3]["token_turn"][-1] = 42
    trajs[7]["turns"][0]["turn_id"] = 5
    one = ra.audit(write_log(tmp_path / "one", trajs, ups)).findings
    many = ra.audit(write_log(tmp_path / "many", trajs, ups, parts=3)).findings
    key = ["code", "trajectory_id", "turn", "position", "message"]
    assert one.height == 2
    assert one.select(key).sort(key).equals(many.select(key).sort(key))


def test_missing_required_column_s001_and_checks_not_run(tmp_path, records):
    t = ra.records_to_table(records[0]).drop_columns(["loss_mask"])
    pq.write_table(t, tmp_path / "x.parquet")
    rep = ra.audit(tmp_path)
    s001 = rep.findings.filter(pl.col("code") == "S001")
    assert "loss_mask: required column missing" in s001["message"].to_list()
    assert s001["file"][0].endswith("x.parquet")
    assert not rep.ok
    # every check that reads loss_mask says so, and no other check is missing
    # (a check that also requires a column this log never recorded names both: M111)
    readers = {
        c
        for c, r in ra.all_rules().items()
        if "loss_mask" in r.requires
        and not r.preview
        and all(q in t.column_names or q == "loss_mask" or "." in q for q in r.requires)
    }
    assert {"M101", "M102", "M103"} <= readers  # the mask checks at least
    assert {c: w for c, w in rep.not_run.items() if c in readers} == {c: "column loss_mask absent" for c in readers}
    no_updates = {
        c for c, r in ra.all_rules().items() if not r.preview and any(q.startswith("updates") for q in r.requires)
    }
    assert all(rep.not_run[c] == "the log has no update records" for c in no_updates)
    # configuration needed (R408, T306), no template render (M107); replay is off by default; no
    # per-token loss evidence (contract 1.2: R411-R413), no routes or overlong penalty (contract 1.3: P505, R414),
    # no recorded nucleus or split's exposed token (contract 1.3: L210, M111), no critic values or second
    # log-prob column (contract 1.4: R416, L211), no trainer temperature (L212), no capture digest (1.5: M112)
    evidence = {"R411", "R412", "R413", "P505", "R414", "L210", "M111", "R416", "L211", "L212", "M112"}
    assert (
        set(rep.not_run) - readers == {"R408", "T306", "M107", "L205", "L206", "L207", "L209"} | no_updates | evidence
    )


def test_token_ids_as_floats_is_s001(tmp_path, records):
    t = ra.records_to_table(records[0])
    t = t.set_column(
        t.schema.get_field_index("token_ids"), "token_ids", t.column("token_ids").cast(pa.list_(pa.float64()))
    )
    pq.write_table(t, tmp_path / "x.parquet")
    rep = ra.audit(tmp_path)
    msgs = rep.findings.filter(pl.col("code") == "S001")["message"].to_list()
    assert any("token_ids: expected list<int32>" in m for m in msgs)


def test_duplicate_ids_across_files_s002(tmp_path, records):
    trajs, ups = records
    trajs[-1]["trajectory_id"] = trajs[0]["trajectory_id"]
    rep = ra.audit(write_log(tmp_path / "log", trajs, ups, parts=2))
    s002 = rep.findings.filter(pl.col("code") == "S002")
    assert s002["trajectory_id"].to_list() == [trajs[0]["trajectory_id"]]
    assert "2 times" in s002["message"][0]


def test_truncated_and_non_parquet_files_s005_rest_still_read(tmp_path, records):
    root = write_log(tmp_path / "log", *records, parts=2)
    victim = sorted(root.rglob("part-0001.parquet"))[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    (root / "notes.parquet").write_text("this is not parquet")
    rep = ra.audit(root)
    s005 = rep.findings.filter(pl.col("code") == "S005")
    assert sorted(s005["file"].to_list()) == sorted([str(victim), str(root / "notes.parquet")])
    assert rep.summary["rows_read"] == len(records[0]) // 2  # the intact file was audited
    res = run_cli("check", root)
    assert res.exit_code == 1 and "Traceback" not in res.output


@pytest.mark.parametrize("setup", ["missing", "empty_dir", "not_parquet_dir"])
def test_unusable_input_exit_2(tmp_path, setup):
    target = tmp_path / "t"
    if setup == "empty_dir":
        target.mkdir()
    elif setup == "not_parquet_dir":
        target.mkdir()
        (target / "a.csv").write_text("x,y\n1,2\n")
    res = run_cli("check", target)
    assert res.exit_code == 2
    assert res.output.startswith("rollout-audit: error:") and "Traceback" not in res.output


def test_usage_errors_exit_2(tmp_path, records):
    root = write_log(tmp_path / "log", *records)
    assert run_cli("check", root, "--select", "Z9").exit_code == 2
    assert run_cli("check", root, "--format", "yaml").exit_code == 2
    assert run_cli("explain", "Q123").exit_code == 2
    assert run_cli("check", root, "-o", root / "report.txt").exit_code == 2
    assert not (root / "report.txt").exists()


def test_select_and_ignore(tmp_path, records):
    trajs, ups = records
    trajs[1]["token_ids"] = trajs[1]["token_ids"][:-1]
    root = write_log(tmp_path / "log", trajs, ups)
    assert run_cli("check", root, "--ignore", "S003").exit_code == 0
    assert run_cli("check", root, "--select", "S").exit_code == 1
    rep = ra.audit(root, select=["S00"], ignore=["S003"])
    assert "S003" not in rep.codes() and "S003" not in rep.summary["checks_run"]


def test_github_and_junit_formats(tmp_path, records):
    trajs, ups = records
    trajs[1]["token_ids"] = trajs[1]["token_ids"][:-1]
    root = write_log(tmp_path / "log", trajs, ups)
    gh = run_cli("check", root, "--format", "github").output
    assert gh.startswith("::error file=") and "title=S003" in gh
    junit = run_cli("check", root, "--format", "junit").output
    assert "<testsuite" in junit and 'name="S003' in junit and "<failure" in junit


def test_explain_and_schema(tmp_path):
    res = run_cli("explain", "S003")
    assert res.exit_code == 0 and "differ in length" in res.output
    doc = json.loads(run_cli("schema", "--format", "json").output)
    names = [c["name"] for c in doc["tables"]["trajectories"]]
    assert names[0] == "trajectory_id" and "turns" in names
    assert "token_source" in run_cli("schema").output


def test_scan_frames(tmp_path, records):
    trajs, ups = records
    root = write_log(tmp_path / "log", trajs, ups, parts=2)
    log = ra.scan(root)
    assert log.trajectories.select(pl.len()).collect().item() == len(trajs)
    turns = log.turns.collect()
    assert turns.height == sum(len(t["turns"]) for t in trajs)
    assert {"trajectory_id", "turn", "policy_version", "logprob"} <= set(turns.columns)
    toks = log.tokens.filter(pl.col("trajectory_id") == trajs[0]["trajectory_id"]).collect()
    assert toks["token_ids"].to_list() == trajs[0]["token_ids"]
    assert toks["position"].to_list() == list(range(len(trajs[0]["token_ids"])))
    assert log.updates.collect().height == len(ups)


def test_in_memory_audit_of_arrow_and_polars(records):
    trajs, ups = records
    table = ra.records_to_table(trajs)
    for src in (table, pl.from_arrow(table)):
        rep = ra.audit(src, ra.records_to_table(ups, "updates"))
        assert rep.ok and rep.count("warning") == 0


def test_foreign_parquet_file_is_reported_once_not_as_33_missing_columns(tmp_path, records):
    root = write_log(tmp_path / "log", *records)
    pq.write_table(pa.table({"a": [1, 2, 3]}), root / "metrics.parquet")
    rep = ra.audit(root)
    s005 = rep.findings.filter(pl.col("code") == "S005")
    assert s005["file"].to_list() == [str(root / "metrics.parquet")]
    assert "not a rollout log file" in s005["message"][0]
    assert "S001" not in rep.codes()
    assert rep.summary["rows_read"] == len(records[0])  # the log itself is audited


def test_nothing_selected_ran_is_never_ok(tmp_path, records):
    """On a log without behaviour log-probs: `--select L201,L203` (full codes) exits 2 with the reason;
    `--select L201` through the library is incomplete too; a family that ran nothing is never ok."""
    trajs, ups = records
    for t in trajs:
        del t["behavior_logprobs"]
    root = write_log(tmp_path / "log", trajs, ups)
    res = run_cli("check", root, "--select", "L201,L203")
    assert res.exit_code == 2, res.output
    assert (
        f"rollout-audit: error: {root}: L201, L203: selected by its code and not run: column behavior_logprobs absent"
        in res.stderr
    )
    assert res.stdout.rstrip().splitlines()[-1].startswith("INCOMPLETE: 0 errors, 0 warnings, 0 info; 0 checks run")
    rep = ra.audit(root, select=["L201"])
    assert rep.exit_code() == 2 and not rep.ok and set(rep.unfulfilled) == {"L201"}
    only_l2 = ra.audit(root, select=["L201", "L"], ignore=["L202", "L204", "L205", "L206", "L207", "L208"])
    assert only_l2.summary["checks_run"] == [] and only_l2.exit_code() == 2
    js = json.loads(run_cli("check", root, "--select", "L203", "--format", "json").stdout)
    assert js["unfulfilled"] == [
        {"code": "L203", "reason": "selected by its code and not run: column behavior_logprobs absent"}
    ]


def test_report_ok_means_exit_0(records):
    rep = ra.audit(*records)
    assert rep.ok and rep.exit_code() == 0
    assert not ra.audit(None).ok


def test_library_finds_the_configuration_next_to_the_log_as_the_cli_does(tmp_path, records):
    root = write_log(tmp_path / "proj" / "log", *records)
    (tmp_path / "proj" / "pyproject.toml").write_text('[tool.rollout-audit]\nselect = ["M"]\n')
    rep = ra.audit(root)
    assert rep.rules and all(c.startswith("M") for c in rep.rules)
    cli_json = json.loads(run_cli("check", root, "--format", "json").stdout)
    assert sorted(cli_json["summary"]["checks_run"]) == sorted(rep.summary["checks_run"])
    assert any(c.startswith("S") for c in ra.audit(root, config=ra.Config()).rules)  # config= replaces it


def test_value_domains_come_from_the_contract_alone():
    """The pandera schemas and S001's fast predicate are built from the `domain` of each column
    in schemas/: a value just outside a domain is flagged by both, one just inside by neither."""
    import polars as pl

    from rollout_audit.checks import structure
    from rollout_audit.contract import schema as S
    from rollout_audit.contract.models import TrajectoryValues, TurnValues, domain_problems

    for table, model, fast in (
        ("trajectories", TrajectoryValues, structure._TRAJ_DOMAIN),
        ("turn", TurnValues, structure._TURN_DOMAIN),
    ):
        doms = S.domains(table)
        assert doms and set(doms) <= set(model.columns) and set(doms) <= set(fast)
        for name, d in doms.items():
            lo, hi = d.get("gt", d.get("ge")), d.get("le")
            outside = [float("nan") if lo is None and hi is None else (lo - 1 if lo is not None else hi + 1)]
            if lo is not None and hi is not None:
                inside = [(lo + hi) / 2]
            else:
                inside = [lo + 1 if lo is not None else hi - 1 if hi is not None else 0.5]
            for values, broken in ((outside, True), (inside, False)):
                df = pl.DataFrame({name: values}, schema={name: pl.Float64})
                assert (domain_problems(model, df).height > 0) is broken, (name, values)
                assert structure._suspect(df, fast) is broken, (name, values)


def test_s004_misnumbered_turn_and_stray_token_turn(records):
    trajs, ups = records
    a, b = trajs[3], trajs[7]
    a["turns"][1]["turn_id"] = 5
    b["token_turn"] = [*b["token_turn"][:-1], 42]
    rep = ra.audit(trajs, ups, select=["S004"])
    f = rep.findings.filter(pl.col("code") == "S004").sort("trajectory_id")
    n_turns = len(b["turns"])
    assert f.select("trajectory_id", "turn", "position", "message").rows() == [
        (a["trajectory_id"], 1, None, "turn at index 1 has turn_id 5"),
        (
            b["trajectory_id"],
            None,
            len(b["token_turn"]) - 1,
            f"1 token(s) name a turn that does not exist (first: token_turn 42, the trajectory has {n_turns} turns)",
        ),
    ]
