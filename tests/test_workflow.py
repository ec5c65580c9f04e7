"""Living with the audit: baselines, tolerated rates, diffs, filtered copies and the watcher,
each through the command line a user would type."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout_audit.cli import main
from rollout_audit.synth import make_log

ROOT = Path(__file__).resolve().parent.parent
COMPLIANT = ROOT / "fixtures" / "compliant"


def cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """A log with one M101 error (`one`), the same log with an L201 error on top (`two`), and a
    log of another run (other trajectory ids) with no finding."""
    d = tmp_path_factory.mktemp("logs")
    assert cli("faults", "apply", "tool_tokens_trained", COMPLIANT, d / "one").exit_code == 0
    assert cli("faults", "apply", "positive_logprob", d / "one", d / "two").exit_code == 0
    from rollout_audit.faults import write_records

    write_records(d / "other", *make_log(seed=3))
    return d


# ---------------------------------------------------------------- baselines


def test_baseline_accepts_what_it_recorded_and_fails_on_what_is_new(logs, tmp_path):
    base = tmp_path / "baseline.json"
    assert cli("check", logs / "one").exit_code == 1
    res = cli("check", logs / "one", "--write-baseline", base)
    assert res.exit_code == 0 and "1 finding recorded" in res.output
    res = cli("check", logs / "one", "--baseline", base)
    assert res.exit_code == 0, res.output
    assert "baseline " in res.output and "1 of 1 recorded findings seen, 0 gone, 0 new" in res.output
    assert res.output.strip().splitlines()[-1].startswith("ok:")
    res = cli("check", logs / "two", "--baseline", base, "--format", "json")
    assert res.exit_code == 1
    rep = json.loads(res.stdout)
    assert [f["code"] for f in rep["findings"]] == ["L201"]
    assert rep["summary"]["baseline"] == {"file": str(base), "recorded": 1, "seen": 1, "gone": 0, "new": 1}
    assert rep["summary"]["by_severity"]["error"] == 1


def test_baseline_counts_what_is_gone(logs, tmp_path):
    base = tmp_path / "b.json"
    assert cli("check", logs / "two", "--write-baseline", base).exit_code == 0
    res = cli("check", logs / "one", "--baseline", base)
    assert res.exit_code == 0 and "1 of 2 recorded findings seen, 1 gone, 0 new" in res.output


def test_a_finding_whose_numbers_changed_is_new(logs, tmp_path):
    base = tmp_path / "b.json"
    assert cli("check", logs / "one", "--write-baseline", base).exit_code == 0
    doc = json.loads(base.read_text())
    doc["findings"][0]["digest"] = "000000000000"  # the same place, other numbers in its message
    base.write_text(json.dumps(doc))
    res = cli("check", logs / "one", "--baseline", base)
    assert res.exit_code == 1 and "0 of 1 recorded findings seen, 1 gone, 1 new" in res.output


def test_baseline_from_the_configuration_is_read_next_to_it(logs, tmp_path):
    assert cli("check", logs / "one", "--write-baseline", tmp_path / "accepted.json").exit_code == 0
    (tmp_path / "audit.toml").write_text('[tool.rollout-audit]\nbaseline = "accepted.json"\n')
    res = cli("check", logs / "one", "--config", tmp_path / "audit.toml")
    assert res.exit_code == 0 and "1 of 1 recorded findings seen" in res.output


def test_baseline_of_another_log_or_version_is_refused(logs, tmp_path):
    base = tmp_path / "b.json"
    assert cli("check", logs / "one", "--write-baseline", base).exit_code == 0
    res = cli("check", logs / "other", "--baseline", base)
    assert res.exit_code == 2 and "written for another log" in res.output, res.output
    doc = json.loads(base.read_text())
    doc["tool_version"] = "0.0.1"
    base.write_text(json.dumps(doc))
    res = cli("check", logs / "one", "--baseline", base)
    assert res.exit_code == 2 and "written by rollout-audit 0.0.1" in res.output
    base.write_text("not json")
    assert cli("check", logs / "one", "--baseline", base).exit_code == 2
    res = cli("check", logs / "one", "--baseline", tmp_path / "absent.json")
    assert res.exit_code == 2 and "no such file" in res.output


def test_baseline_of_another_log_whose_ids_coincide_is_refused_by_its_content(logs, tmp_path):
    import shutil

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    base = tmp_path / "b.json"
    assert cli("check", logs / "one", "--write-baseline", base).exit_code == 0
    doc = json.loads(base.read_text())["log"]
    assert len(doc["sample_token_digests"]) == len(doc["sample_trajectory_ids"]) > 0
    twin = tmp_path / "twin"  # the same trajectory ids, other token ids
    shutil.copytree(logs / "one", twin)
    for f in (twin / "trajectories").glob("*.parquet"):
        t = pq.read_table(f)
        toks = t.column("token_ids").combine_chunks()
        shifted = type(toks).from_arrays(toks.offsets, pc.add(toks.flatten(), 1).cast(toks.type.value_type))
        pq.write_table(t.set_column(t.column_names.index("token_ids"), "token_ids", shifted), f)
    res = cli("check", twin, "--baseline", base)
    assert res.exit_code == 2 and "written for another log" in res.output, res.output
    assert "but the token ids of only 0 are those it recorded" in res.output, res.output
    res = cli("check", logs / "two", "--baseline", base)  # the same log with another fault: its own baseline
    assert res.exit_code == 1 and "1 of 1 recorded findings seen" in res.output, res.output
    del doc["sample_token_digests"]  # a baseline without its log's fingerprint is not trusted
    base.write_text(json.dumps({**json.loads(base.read_text()), "log": doc}))
    res = cli("check", logs / "one", "--baseline", base)
    assert res.exit_code == 2 and "sample_token_digests" in res.output, res.output


def test_baseline_fingerprint_of_a_log_with_a_null_token_list(logs, tmp_path):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    base = tmp_path / "b.json"
    assert cli("check", logs / "one", "--write-baseline", base).exit_code == 0
    broken = tmp_path / "nulls"  # the smallest trajectory id without token ids: one of 16 no longer matches
    shutil.copytree(logs / "one", broken)
    f = sorted((broken / "trajectories").glob("*.parquet"))[0]
    t = pq.read_table(f)
    ids, toks = t.column("trajectory_id").to_pylist(), t.column("token_ids").to_pylist()
    toks[ids.index(min(ids))] = None
    col = pa.array(toks, t.schema.field("token_ids").type)
    pq.write_table(t.set_column(t.column_names.index("token_ids"), "token_ids", col), f)
    res = cli("check", broken, "--baseline", base)
    assert res.exit_code == 1 and "internal error" not in res.output, res.output
    assert "recorded findings seen" in res.output, res.output


def test_baseline_is_never_written_into_the_log_nor_from_an_incomplete_audit(logs, tmp_path):
    res = cli("check", logs / "one", "--write-baseline", logs / "one" / "b.json")
    assert res.exit_code == 2 and not (logs / "one" / "b.json").exists()
    res = cli("check", logs / "one", "--select", "L205", "--write-baseline", tmp_path / "b.json")
    assert res.exit_code == 2 and not (tmp_path / "b.json").exists()


# ---------------------------------------------------------------- tolerated rates


def test_a_rate_within_its_tolerated_share_is_a_warning_with_the_share_shown(logs, tmp_path):
    cfg = tmp_path / "rates.toml"
    cfg.write_text("[tool.rollout-audit]\ntolerated_share = {M101 = 0.01, L201 = 0.001}\n")
    res = cli("check", logs / "two", "--config", cfg)
    assert res.exit_code == 1, res.output
    assert "M101 [warning]" in res.output and "L201 [error]" in res.output
    assert "M101: 1 trajectory of 128 (0.78%), within the tolerated 1.00%: reported as warnings" in res.output
    assert "L201: 1 trajectory of 128 (0.78%), above the tolerated 0.10%: errors" in res.output
    cfg.write_text("[tool.rollout-audit]\ntolerated_share = {M101 = 0.01}\n")
    res = cli("check", logs / "one", "--config", cfg, "--format", "json")
    assert res.exit_code == 0
    rep = json.loads(res.stdout)
    assert rep["findings"][0]["severity"] == "warning"
    assert rep["summary"]["tolerated"]["M101"]["within"] is True
    assert cli("check", logs / "one", "--config", cfg, "--strict").exit_code == 1


@pytest.mark.parametrize("table, why", [("{M101 = 2}", "between 0 and 1"), ("{X101 = 0.1}", "unknown check code")])
def test_a_bad_tolerated_share_is_exit_2(logs, tmp_path, table, why):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f"[tool.rollout-audit]\ntolerated_share = {table}\n")
    res = cli("check", logs / "one", "--config", cfg)
    assert res.exit_code == 2 and why in res.output


# ---------------------------------------------------------------- the library reads the same configuration


def _project(logs, tmp_path, table: str) -> Path:
    """A copy of the log `one` (one M101 error) in a project whose pyproject.toml holds `table`."""
    import shutil

    shutil.copytree(logs / "one", tmp_path / "proj" / "one")
    (tmp_path / "proj" / "pyproject.toml").write_text(f"[tool.rollout-audit]\n{table}\n")
    return tmp_path / "proj" / "one"


def _verdict(rep: dict) -> list:
    return [(f["code"], f["severity"], f["trajectory_id"], f["message"]) for f in rep["findings"]]


def test_the_library_applies_a_configured_tolerated_share_as_check_does(logs, tmp_path, rollout_audit_clean):
    import rollout_audit as ra

    log = _project(logs, tmp_path, "tolerated_share = {M101 = 0.01}")
    res = cli("check", log, "--format", "json")
    assert res.exit_code == 0, res.output
    rep = ra.audit(log)
    assert rep.ok and rep.summary["tolerated"]["M101"]["within"] is True
    assert _verdict(json.loads(rep.render("json"))) == _verdict(json.loads(res.stdout))
    assert rollout_audit_clean(log).findings["severity"].to_list() == ["warning"]
    with pytest.raises(AssertionError, match="M101 \\[warning\\]"):
        rollout_audit_clean(log, strict=True)
    # a Config made in code, and in-memory tables, carry the same setting
    assert ra.audit(logs / "one", config=ra.Config(tolerated_share={"M101": 0.01})).ok
    assert not ra.audit(logs / "one", config=ra.Config(tolerated_share={"M101": 0.001})).ok
    from rollout_audit.faults import read_records

    trajs, ups = read_records(logs / "one")
    assert ra.audit(trajs, ups, config=ra.Config(tolerated_share={"M101": 0.01})).ok
    assert not ra.audit(trajs, ups).ok


def test_the_library_applies_a_configured_baseline_as_check_does(logs, tmp_path, rollout_audit_clean):
    import rollout_audit as ra

    log = _project(logs, tmp_path, 'baseline = "accepted.json"')
    with pytest.raises(ra.UsageError, match="accepted.json: no such file"):
        ra.audit(log)  # a configured baseline that is absent is refused, as by check (exit 2)
    assert cli("check", log, "--write-baseline", tmp_path / "proj" / "accepted.json").exit_code == 0
    res = cli("check", log, "--format", "json")
    assert res.exit_code == 0, res.output
    rep = ra.audit(log)
    assert rep.ok and rep.summary["baseline"]["seen"] == 1 and rep.findings.is_empty()
    assert _verdict(json.loads(rep.render("json"))) == _verdict(json.loads(res.stdout))
    assert rollout_audit_clean(log).summary["baseline"]["recorded"] == 1
    # what the baseline did not record still fails, in the library as in check
    two = tmp_path / "proj" / "two"
    assert cli("faults", "apply", "positive_logprob", log, two).exit_code == 0
    with pytest.raises(AssertionError, match="L201 \\[error\\]") as e:
        rollout_audit_clean(two)
    assert "M101" not in str(e.value)
    assert cli("check", two).exit_code == 1
    # `baseline=` replaces the configured one, as `check --baseline FILE` does
    assert ra.audit(logs / "one", baseline=tmp_path / "proj" / "accepted.json").ok


# ---------------------------------------------------------------- diff


def test_diff_names_findings_that_appeared_and_disappeared(logs):
    res = cli("diff", COMPLIANT, logs / "two")
    assert res.exit_code == 1, res.output
    assert (
        "appeared    L201 [error] 0 -> 1 (1 new, 0 gone)" in res.output
        and "appeared    M101 [error] 0 -> 1" in res.output
    )
    assert res.output.strip().splitlines()[-1].startswith("FAIL: 2 new error findings; ")
    res = cli("diff", logs / "two", logs / "one", "--format", "json")
    assert res.exit_code == 0  # a finding went away: nothing new to block on
    d = json.loads(res.stdout)
    assert {k: d["findings"][k] for k in ("appeared", "disappeared", "changed")} == {
        "appeared": [],
        "disappeared": [{"code": "L201", "severity": "error", "a": 1, "b": 0, "new": 0, "gone": 1}],
        "changed": [],
    }
    assert d["findings"]["new_findings"] == [] and [x["code"] for x in d["findings"]["gone_findings"]] == ["L201"]
    assert d["new_errors"] == 0 and d["exit_code"] == 0 and not any(s["moved"] for s in d["stats"])
    assert {"trainable share", "policy lag", "degenerate groups", "stop failure", "reward | success"} <= {
        s["stat"] for s in d["stats"]
    }


def test_diff_shows_statistics_that_moved_beyond_noise(tmp_path):
    from rollout_audit.faults import write_records

    write_records(tmp_path / "calm", *make_log(n_tasks=8, group_size=8, seed=1, truncated_share=0.0))
    write_records(tmp_path / "cut", *make_log(n_tasks=8, group_size=8, seed=1, truncated_share=0.9))
    res = cli("diff", tmp_path / "calm", tmp_path / "cut", "--format", "json")
    assert res.exit_code == 0, res.output
    moved = {s["stat"]: s for s in json.loads(res.stdout)["stats"] if s["moved"]}
    assert moved["stop max_turns"]["a"] == 0 and moved["stop max_turns"]["b"] > 0.5, moved  # absent in A: a share of 0
    res = cli("diff", tmp_path / "calm", tmp_path / "calm")
    assert res.exit_code == 0 and "0 codes changed; 0 of " in res.output


def test_diff_compares_findings_by_identity_not_by_count(tmp_path):
    """The same count of M101 findings, on another trajectory: one finding is new (exit 1)."""
    for seed in (0, 1):
        assert (
            cli("faults", "apply", "tool_tokens_trained", COMPLIANT, tmp_path / f"s{seed}", "--seed", seed).exit_code
            == 0
        )
    res = cli("diff", tmp_path / "s0", tmp_path / "s1", "--format", "json")
    assert res.exit_code == 1, res.output
    d = json.loads(res.stdout)
    assert d["findings"]["changed"] == [{"code": "M101", "severity": "error", "a": 1, "b": 1, "new": 1, "gone": 1}]
    (new,) = d["findings"]["new_findings"]
    (gone,) = d["findings"]["gone_findings"]
    assert new["trajectory_id"] != gone["trajectory_id"] and d["new_errors"] == 1
    res = cli("diff", tmp_path / "s0", tmp_path / "s1")
    assert f"  new   M101 {new['trajectory_id']}" in res.output
    assert res.output.strip().splitlines()[-1].startswith("FAIL: 1 new error finding;")


def test_diff_of_an_incomplete_audit_is_incomplete(tmp_path):
    """Replay asked for and not run: both audits are incomplete, and so is the diff (exit 2)."""
    (tmp_path / "audit.toml").write_text("[tool.rollout-audit]\nreplay = 4\n")
    res = cli("diff", COMPLIANT, COMPLIANT, "--config", tmp_path / "audit.toml")
    assert res.exit_code == 2, res.output
    assert res.stdout.strip().splitlines()[-1].startswith("INCOMPLETE:")
    assert "incomplete  A: L205" in res.stdout and "incomplete  B: L205" in res.stdout
    res = cli("diff", COMPLIANT, ROOT / "fixtures" / "broken" / "corrupt_file", "--format", "json")
    assert res.exit_code == 2 and json.loads(res.stdout)["incomplete"]["b"], res.output


def test_diff_shows_lost_coverage_and_fails_on_it(tmp_path):
    """B's exporter stopped writing update records: the checks of updates ran on A and not on B."""
    import shutil

    shutil.copytree(COMPLIANT / "trajectories", tmp_path / "b" / "trajectories")
    shutil.copy(COMPLIANT / "pyproject.toml", tmp_path / "b" / "pyproject.toml")
    res = cli("diff", COMPLIANT, tmp_path / "b", "--format", "json")
    assert res.exit_code == 1, res.output
    d = json.loads(res.stdout)
    lost = {x["code"]: x["on_b"] for x in d["coverage"]["lost"]}
    assert {"U601", "U602", "P503"} <= set(lost) and all(v.startswith("not run") for v in lost.values()), lost
    assert d["new_errors"] == 0 and d["coverage"]["gained"] == []
    res = cli("diff", COMPLIANT, tmp_path / "b")
    assert "lost        U601: ran on A, on B not run" in res.output
    assert f"FAIL: 0 new error findings; {len(lost)} checks that ran on A not run on B;" in res.output
    res = cli("diff", COMPLIANT, tmp_path / "b", "--allow-lost-coverage")
    assert res.exit_code == 0 and "not run on B (allowed)" in res.output
    assert cli("diff", tmp_path / "b", COMPLIANT).exit_code == 0  # coverage gained is no failure


def test_diff_of_two_steps_of_one_log(tmp_path):
    from rollout_audit.faults import read_records, write_records

    t, u = read_records(COMPLIANT)
    write_records(tmp_path / "log", t, u, parts=2)
    steps = tmp_path / "log" / "trajectories"
    res = cli("diff", steps / "step=0", steps / "step=1", "--all")
    assert res.exit_code == 0, res.output
    assert "held        trainable share:" in res.output


# ---------------------------------------------------------------- filter


def test_filter_drops_flagged_trajectories_and_the_updates_that_named_them(logs, tmp_path):
    from rollout_audit.faults import read_records

    res = cli("filter", logs / "two", tmp_path / "clean")
    assert res.exit_code == 0, res.output
    t, u = read_records(logs / "two")
    flagged = {"s0-i0003-g07-e1", "s0-i0003-g00-e2"}  # the trajectories the two faults touched
    naming = [x for x in u if flagged & set(x["trajectory_ids"])]
    assert res.output.startswith(f"dropped 2 trajectories (L201 1, M101 1) and {len(naming)} updates that named them")
    t2, u2 = read_records(tmp_path / "clean")
    assert {x["trajectory_id"] for x in t2} == {x["trajectory_id"] for x in t} - flagged
    assert len(u2) == len(u) - len(naming) and not any(flagged & set(x["trajectory_ids"]) for x in u2)
    assert cli("check", tmp_path / "clean").exit_code == 0


def test_filter_by_selected_codes_keeps_the_rest(logs, tmp_path):
    res = cli("filter", logs / "two", tmp_path / "out", "--select", "L201")
    assert res.exit_code == 0 and "dropped 1 trajectory (L201 1)" in res.output
    after = json.loads(cli("check", tmp_path / "out", "--format", "json").stdout)
    assert [f["code"] for f in after["findings"]] == ["M101"]


def test_filter_never_writes_in_place_nor_over_a_directory(logs, tmp_path):
    before = sorted(p.name for p in (logs / "two").rglob("*"))
    res = cli("filter", logs / "two", logs / "two" / "out")
    assert res.exit_code == 2 and "never writes to its input" in res.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert cli("filter", logs / "two", tmp_path / "full").exit_code == 2
    assert cli("filter", logs / "two", tmp_path / "o", "--select", "Z9").exit_code == 2
    assert sorted(p.name for p in (logs / "two").rglob("*")) == before


# ---------------------------------------------------------------- watch, with a real writer process

WRITER = r"""
import os, signal, sys, time
import pyarrow.parquet as pq

src, out, plan = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
for i, what in enumerate(plan):
    time.sleep(0.4)
    kind, _, path = what.partition(":")
    table = pq.read_table(path)
    part = table.slice(32 * (i % 4), 32)
    dst = os.path.join(out, "trajectories", f"step-{i:04d}.parquet")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = os.path.join(out, "trajectories", f".step-{i:04d}.parquet.tmp")
    pq.write_table(part, tmp)
    if kind == "killed":  # written in place, cut short, and the writer dies mid-write
        data = open(tmp, "rb").read()
        os.remove(tmp)
        with open(dst, "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stuck":  # a temporary file its writer never renamed: never a step
        continue
    os.replace(tmp, dst)
"""


def _watch(tmp_path, plan, *extra):
    import subprocess
    import sys

    d = tmp_path / "run"
    d.mkdir()
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "rollout_audit.cli", "watch", d, "--interval", "0.2", "--idle", "4",
         "--status", tmp_path / "status.json", "--metrics", tmp_path / "metrics.jsonl", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    (tmp_path / "writer.py").write_text(WRITER)
    writer = subprocess.run(
        [sys.executable, tmp_path / "writer.py", COMPLIANT, d, ",".join(plan)], env=env, timeout=120, check=False
    )
    out, err = watcher.communicate(timeout=180)
    return writer.returncode, watcher.returncode, out.strip().splitlines(), err, d


def test_watch_audits_each_step_once_complete_and_reports_a_step_killed_mid_write(tmp_path):
    good = str(COMPLIANT / "trajectories" / "part-0000.parquet")
    plan = [f"ok:{good}", f"ok:{good}", f"stuck:{good}", f"killed:{good}"]
    wrc, rc, lines, err, d = _watch(tmp_path, plan)
    assert wrc == -9  # the writer really died mid-write
    assert [x.split(":")[0] for x in lines] == [
        "trajectories/step-0000.parquet",
        "trajectories/step-0001.parquet",
        "trajectories/step-0003.parquet",
    ], lines
    assert lines[0].split(": ", 1)[1].startswith("ok: 0 errors") and lines[1].split(": ", 1)[1].startswith("ok:")
    assert "INCOMPLETE" in lines[2] and rc == 2
    assert (d / "trajectories" / ".step-0002.parquet.tmp").exists()  # left alone, never audited
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "stopped" and status["steps_audited"] == 3 and status["worst_exit_code"] == 2
    assert [s["exit_code"] for s in status["steps"]] == [0, 0, 2]
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["audit/exit_code"] for m in metrics] == [0, 0, 2]
    assert metrics[0]["audit/errors"] == 0 and 0 < metrics[0]["audit/trainable_share"] < 1
    assert "3 step(s), worst exit code 2" in err


def test_watch_fail_fast_stops_at_the_first_failing_step(logs, tmp_path):
    good = str(COMPLIANT / "trajectories" / "part-0000.parquet")
    bad = str(next((logs / "one" / "trajectories").glob("*.parquet")))
    # step 1 holds rows 32-63 of the broken log; the M101 fault touched s0-i0003-g07-e1 (row >= 96)
    plan = [f"ok:{good}", f"ok:{good}", f"ok:{good}", f"bad:{bad}", f"ok:{good}"]
    wrc, rc, lines, err, d = _watch(tmp_path, plan, "--fail-fast")
    assert wrc == 0
    assert rc == 1 and lines[-1].startswith("trajectories/step-0003.parquet: FAIL: 1 error (M101), 0 warnings"), lines
    assert len(lines) == 4
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "stopped" and status["steps"][-1]["codes"] == ["M101"]


def _scalars(logdir: Path) -> dict[str, list]:
    """Every scalar of the event files in `logdir`, as TensorBoard itself reads them: tag -> events."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(logdir), size_guidance={accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def test_watch_writes_its_figures_to_a_tensorboard_event_file(logs, tmp_path):
    good = str(COMPLIANT / "trajectories" / "part-0000.parquet")
    bad = str(next((logs / "one" / "trajectories").glob("*.parquet")))  # rows 96-127 hold the M101 fault
    plan = [f"ok:{good}", f"ok:{good}", f"ok:{good}", f"bad:{bad}"]
    wrc, rc, lines, err, d = _watch(tmp_path, plan, "--tensorboard", tmp_path / "tb")
    assert wrc == 0 and rc == 1 and len(lines) == 4, (lines, err)
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    files = list((tmp_path / "tb").iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents.")
    scalars = _scalars(tmp_path / "tb")
    assert set(scalars) == set(metrics[0]) - {"step", "index"} and "audit/trainable_share" in scalars
    for tag, events in scalars.items():  # the JSON Lines figures, step by step (TensorBoard keeps float32)
        assert [e.step for e in events] == [m["index"] for m in metrics] == [0, 1, 2, 3]
        assert [e.value for e in events] == pytest.approx([m[tag] for m in metrics], rel=1e-6), tag
    assert [e.value for e in scalars["audit/errors/M"]] == [0, 0, 0, 1]
    assert [e.value for e in scalars["audit/exit_code"]] == [0, 0, 0, 1]


def test_event_file_reads_back_in_tensorboard_up_to_a_record_cut_short(tmp_path):
    from rollout_audit.workflow.events import EventFile

    f = EventFile(tmp_path / "tb")
    f.add(0, {"audit/errors": 3.0, "audit/trainable_share": 0.3125}, wall_time=1000.0)
    f.add(2**40 + 7, {"audit/errors": 0.0, "audit/policy_lag_max": 1e300, "audit/ошибки": -2.5}, wall_time=1001.0)
    f.add(5, {"audit/errors": 9.0}, wall_time=1002.0)
    data = f.path.read_bytes()
    f.path.write_bytes(data[:-7])  # the last record cut short, as by a writer killed mid-write
    scalars = _scalars(tmp_path / "tb")
    assert [(e.step, e.value, e.wall_time) for e in scalars["audit/errors"]] == [(0, 3, 1000), (2**40 + 7, 0, 1001)]
    assert [e.value for e in scalars["audit/trainable_share"]] == [0.3125]
    assert [e.value for e in scalars["audit/policy_lag_max"]] == [float("inf")]  # beyond float32: infinite
    assert [e.value for e in scalars["audit/ошибки"]] == [-2.5]


def test_watch_refuses_a_tensorboard_directory_it_cannot_write(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "file").write_text("")
    res = cli("watch", tmp_path / "run", "--tensorboard", tmp_path / "file" / "tb", "--max-steps", "1")
    assert res.exit_code == 2 and "--tensorboard" in res.output and "Traceback" not in res.output


def test_watch_follows_the_configuration_rule_of_check(tmp_path):
    """The watched directory is the audited log: a configuration inside it states only how the
    run was produced (the policy the TRL guard writes there is taken), and nothing else."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "pyproject.toml").write_text("[tool.rollout-audit]\natol = 0.5\n")
    res = cli("watch", run, "--max-steps", "1", "--interval", "0.05", "--idle", "0.1")
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and f"{run / 'pyproject.toml'}: atol: refused" in lines[0], res.output
    (run / "pyproject.toml").write_text('[tool.rollout-audit]\ntruncation = "penalize"\ngrpo_epsilon = 0.0001\n')
    res = cli("watch", run, "--max-steps", "1", "--interval", "0.05", "--idle", "0.1")
    # accepted, and then no step came: the watch says nothing was checked (exit 2, not a pass)
    assert res.exit_code == 2 and "refused" not in res.output, res.output
    assert "no step was audited: nothing was checked" in res.stderr


def test_watch_from_a_framework_dump(tmp_path):
    import os
    import shutil

    from adapterhelp import context_args

    d = tmp_path / "dumps"
    d.mkdir()
    for i, name in enumerate(("compliant", "eos_appended_logprob_zero")):
        shutil.copy(ROOT / "fixtures" / "frameworks" / "skyrl" / f"{name}.jsonl", d / f".{i}.tmp")
        os.replace(d / f".{i}.tmp", d / f"step-{i}.jsonl")  # moved in as a trainer's atomic write
    res = cli("watch", d, "--from", "skyrl", *context_args(), "--max-steps", "2", "--interval", "0.05")
    lines = res.stdout.strip().splitlines()
    assert [x.split(":")[0] for x in lines] == ["step-0.jsonl", "step-1.jsonl"], res.output
    assert lines[0].startswith("step-0.jsonl: ok: 0 errors, 0 warnings")
    # the appended EOS is trained although the engine never sampled it (SkyRL#758): M101
    assert lines[1].startswith("step-1.jsonl: FAIL: 1 error (M101)"), lines[1]
    assert res.exit_code == 1


def test_watch_of_a_flat_log_audits_trajectory_files_and_names_the_update_files(tmp_path):
    """The layout the TRL guard writes (trajectories/ and updates/ filled a file at a time): each
    trajectory file is a step; an update file is no step of its own (alone it has no trajectory
    to check, which would be exit 2 on a compliant run): one line says where its audit is, and the
    status file lists it."""
    import shutil
    import subprocess
    import sys

    d = tmp_path / "run"
    for kind in ("trajectories", "updates"):
        (d / kind).mkdir(parents=True)
        for i, f in enumerate(sorted((COMPLIANT / kind).glob("*.parquet"))):
            shutil.copy(f, d / kind / f"step-{i:04d}.parquet")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "rollout_audit.cli", "watch", d, "--interval", "0.2", "--idle", "1.5",
         "--status", tmp_path / "status.json"],
        capture_output=True, text=True, env=env, timeout=180,
    )  # fmt: skip
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0, (lines, r.stderr)
    assert lines[0].startswith("trajectories/step-0000.parquet: ok: 0 errors"), lines
    notes = [x for x in lines if x.startswith("updates/")]
    assert len(notes) == 1 and f"rollout-audit check {d}" in notes[0], lines
    status = json.loads((tmp_path / "status.json").read_text())
    assert [s["step"] for s in status["steps"]] == ["trajectories/step-0000.parquet"]
    assert status["update_files_not_audited"] == ["updates/step-0000.parquet"] and status["worst_exit_code"] == 0


DIR_WRITER = r"""
import os, shutil, sys, time
src, dst = sys.argv[1], sys.argv[2]
for i, log in enumerate(src.split(",")):
    time.sleep(0.6)
    tmp = os.path.join(dst, f".step-{i}.tmp")
    shutil.copytree(log, tmp)  # a whole log: its trajectory and update files
    os.replace(tmp, os.path.join(dst, f"step-{i}"))
"""


def test_watch_audits_a_log_directory_moved_in_whole_as_one_step(tmp_path):
    """A trainer that writes each step as a log directory (trajectories/ and updates/) and moves it
    in by a rename: one step per directory, its update records audited with its trajectories (an
    update file alone has no trajectory to check)."""
    import subprocess
    import sys

    d = tmp_path / "run"
    d.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "rollout_audit.cli", "watch", d, "--interval", "0.2", "--idle", "4",
         "--status", tmp_path / "status.json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    (tmp_path / "writer.py").write_text(DIR_WRITER)
    logs = f"{COMPLIANT},{ROOT / 'fixtures' / 'broken' / 'tool_tokens_trained'}"
    subprocess.run([sys.executable, tmp_path / "writer.py", logs, d], env=env, timeout=120, check=True)
    out, err = watcher.communicate(timeout=180)
    lines = out.strip().splitlines()
    assert [x.split(":")[0] for x in lines] == ["step-0", "step-1"], (lines, err)
    assert lines[0].startswith("step-0: ok: 0 errors") and lines[1].startswith("step-1: FAIL: 1 error (M101),"), lines
    assert watcher.returncode == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert [s["codes"] for s in status["steps"]] == [[], ["M101"]]


# ---------------------------------------------------------------- filter: verdicts that cover the copy

BROKEN = ROOT / "fixtures" / "broken"


def test_filter_exit_code_is_the_verdict_of_the_copy(tmp_path):
    """A fault that names no trajectory cannot be filtered out: the copy still fails, and so does
    `filter` (`filter bad clean && train clean` does not go ahead)."""
    res = cli("filter", BROKEN / "loss_over_whole_transcript", tmp_path / "clean")
    assert res.exit_code == 1, res.output
    assert "filtered into " in res.output and "the copy does not pass (U601, U602)" in res.output
    assert cli("check", tmp_path / "clean").exit_code == 1  # what the exit code said


def test_filter_copy_carries_the_logs_own_configuration(tmp_path):
    """The compliant log states its response budget in its own pyproject.toml: T306 runs on the copy."""
    res = cli("filter", COMPLIANT, tmp_path / "copy")
    assert res.exit_code == 0, res.output
    assert "max_response_tokens = 48" in (tmp_path / "copy" / "pyproject.toml").read_text()
    rep = json.loads(cli("check", tmp_path / "copy", "--format", "json").stdout)
    assert "T306" in rep["summary"]["checks_run"]


KILLED_FILTER = """
import signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: the process dies as a C program would
from rollout_audit.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("killed", [True, False])
def test_filter_killed_or_failing_part_way_leaves_nothing_that_passes(tmp_path, killed):
    """The filter stops while it writes (a file-size limit in the middle of the first Parquet
    file): killed by the signal, or failing on the write error. OUT does not exist, and what a
    killed filter left passes no audit (a failing one leaves nothing)."""
    import resource
    import subprocess
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    how = ["-c", KILLED_FILTER] if killed else ["-m", "rollout_audit.cli"]
    r = subprocess.run(
        [sys.executable, *how, "filter", COMPLIANT, tmp_path / "out"],
        env=env, preexec_fn=limit, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert not (tmp_path / "out").exists()
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    if not killed:
        assert r.returncode == 2 and "File too large" in r.stderr and not left, r.stderr
        return
    assert r.returncode < 0, (r.returncode, r.stderr[-2000:])  # killed by the signal
    assert len(left) == 1 and list(left[0].rglob("*.parquet"))  # killed with files written
    assert cli("check", left[0]).exit_code != 0
    assert cli("check", tmp_path).exit_code != 0


def test_filter_leaves_out_a_row_group_the_audit_could_not_read(tmp_path):
    """A row group over max_row_group_bytes is not audited: it is never decoded nor copied."""
    import pyarrow.parquet as pq

    src = tmp_path / "log"
    t = pq.read_table(COMPLIANT / "trajectories" / "part-0000.parquet")
    (src / "trajectories").mkdir(parents=True)
    with pq.ParquetWriter(src / "trajectories" / "part-0000.parquet", t.schema) as w:
        w.write_table(t.slice(0, 4))
        w.write_table(t.slice(4, 124))  # many more tokens: over the cap below
    first = pq.ParquetFile(src / "trajectories" / "part-0000.parquet").metadata
    small = first.row_group(0).total_byte_size
    (tmp_path / "audit.toml").write_text(f"[tool.rollout-audit]\nmax_row_group_bytes = {small * 4}\n")
    rep = json.loads(cli("check", src, "--config", tmp_path / "audit.toml", "--format", "json").stdout)
    assert any("max_row_group_bytes" in f["message"] for f in rep["findings"])  # the audit did not read it
    res = cli("filter", src, tmp_path / "out", "--config", tmp_path / "audit.toml", "--select", "S")
    assert "row group 1 (124 rows) not audited, left out" in res.output, res.output
    assert pq.read_table(tmp_path / "out" / "trajectories" / "part-0000.parquet").num_rows == 4


# ---------------------------------------------------------------- watch: nothing seen goes unaudited


def _watch_bg(d: Path, status: Path, *extra: object):
    """A watcher process on `d`; returns it once it has started polling (its status file exists)."""
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        [sys.executable, "-m", "rollout_audit.cli", "watch", d, "--interval", "0.1", "--status", status, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    for _ in range(600):
        if status.exists() or p.poll() is not None:
            break
        time.sleep(0.1)
    return p


def _wait_steps(status: Path, n: int) -> None:
    import time

    for _ in range(600):
        if status.exists() and json.loads(status.read_text() or "{}").get("steps_audited", 0) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} steps audited")


def test_watch_audits_a_step_again_when_it_is_replaced_after_its_audit(tmp_path, logs):
    import shutil

    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(COMPLIANT / "trajectories" / "part-0000.parquet", d / "step-0.parquet")
    status = tmp_path / "status.json"
    w = _watch_bg(d, status, "--idle", "2")
    _wait_steps(status, 1)
    bad = next((logs / "one" / "trajectories").glob("*.parquet"))
    shutil.copy(bad, d / ".step-0.tmp")
    os.replace(d / ".step-0.tmp", d / "step-0.parquet")  # the step replaced by a broken one
    out, err = w.communicate(timeout=180)
    lines = out.strip().splitlines()
    assert w.returncode == 1, (lines, err)
    assert lines[0].startswith("step-0.parquet: ok: 0 errors")
    assert lines[1].startswith("step-0.parquet: FAIL: 1 error (M101)") and "changed after its audit" in lines[1]
    assert [s["exit_code"] for s in json.loads(status.read_text())["steps"]] == [0, 1]


def test_watch_audits_a_dump_appended_to_after_its_audit(tmp_path):
    from adapterhelp import context_args

    d = tmp_path / "dumps"
    d.mkdir()
    dumps = ROOT / "fixtures" / "frameworks" / "skyrl"
    (d / "step-0.jsonl").write_bytes((dumps / "compliant.jsonl").read_bytes())
    status = tmp_path / "status.json"
    w = _watch_bg(d, status, "--from", "skyrl", *context_args(), "--idle", "2")
    _wait_steps(status, 1)
    with open(d / "step-0.jsonl", "ab") as fh:  # the trainer appends after a pause
        fh.write(b"{not json\n")
    out, err = w.communicate(timeout=180)
    lines = out.strip().splitlines()
    assert len(lines) == 2 and "changed after its audit" in lines[1], (lines, err)
    assert w.returncode != 0 and not lines[1].split(": ", 1)[1].startswith("ok"), lines


def test_watch_of_an_empty_or_growing_step_is_not_a_pass(tmp_path):
    import threading
    import time

    d = tmp_path / "run"
    d.mkdir()
    (d / "step-0.parquet").write_bytes(b"")
    res = cli("watch", d, "--interval", "0.05", "--idle", "0.5")
    assert res.exit_code == 2, res.output
    assert "1 step(s) seen and never audited (still being written, or empty): step-0.parquet" in res.output
    (d / "step-0.parquet").unlink()
    stop = threading.Event()

    def grow() -> None:
        with open(d / "step-1.parquet", "ab") as fh:
            while not stop.is_set():
                fh.write(b"x" * 64)
                fh.flush()
                time.sleep(0.02)

    t = threading.Thread(target=grow)
    t.start()
    try:
        res = cli("watch", d, "--interval", "0.1", "--idle", "0.8")
    finally:
        stop.set()
        t.join()
    assert res.exit_code == 2 and "seen and never audited" in res.output and "step-1.parquet" in res.output


def test_watch_ends_with_exit_2_when_the_directory_vanishes(tmp_path):
    import shutil

    d = tmp_path / "run"
    d.mkdir()
    status = tmp_path / "status.json"
    w = _watch_bg(d, status, "--idle", "30")
    shutil.rmtree(d)
    out, err = w.communicate(timeout=120)
    assert w.returncode == 2 and "the watched directory vanished" in out, (out, err)
    assert json.loads(status.read_text())["directory_vanished"] is True


def test_watch_does_not_follow_links_out_of_the_directory(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "step-0.parquet").symlink_to(COMPLIANT / "trajectories" / "part-0000.parquet")
    (d / "sub").symlink_to(COMPLIANT / "trajectories", target_is_directory=True)
    res = cli("watch", d, "--interval", "0.05", "--idle", "0.4")
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2, res.output
    assert "step-0.parquet: INCOMPLETE: a link out of the watched directory, not read" in lines
    assert not any(x.startswith("sub/") or "ok:" in x for x in lines), lines  # the linked directory: never entered


# ---------------------------------------------------------------- every string escaped, strict JSON, no globs

FORGED = "a\n::error file=x,line=1::forged\x1b[2J\u202e"


def _strict(text: str):
    """JSON as RFC 8259 has it: NaN and Infinity are not JSON."""

    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _clean_lines(text: str) -> None:
    assert "\x1b" not in text and "\u202e" not in text, text
    assert not any(x.lstrip().startswith("::error") for x in text.splitlines()), text


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A log whose strings and file name carry a forged CI command, an escape sequence and a
    bidirectional override, with a NaN reward and an infinite one."""
    import pyarrow.parquet as pq

    from rollout_audit.reading.records import records_to_table

    t, _ = make_log(n_tasks=2, group_size=2, n_versions=1, seed=3)
    t[0]["stop_reason"] = FORGED
    t[1]["reward"] = float("nan")
    t[2]["reward"] = float("inf")
    d = tmp_path_factory.mktemp("hostile") / "log"
    (d / "trajectories").mkdir(parents=True)
    pq.write_table(records_to_table(t), d / "trajectories" / f"x{FORGED}.parquet")
    return d


def test_stats_escapes_the_logs_strings_and_writes_strict_json(hostile):
    res = cli("stats", hostile)
    assert res.exit_code == 0, res.output
    _clean_lines(res.output)
    assert "a\\n:\\x3aerror file=x,line=1:\\x3aforged\\x1b[2J\\u202e" in res.output
    d = _strict(cli("stats", hostile, "--format", "json").stdout)
    assert d["reward_mean"] in ("NaN", "Infinity"), d["reward_mean"]  # a string, stated in the README


def test_diff_escapes_the_logs_strings_and_file_names_and_writes_strict_json(hostile):
    res = cli("diff", COMPLIANT, hostile, "--all")
    _clean_lines(res.output)
    assert "stop a\\n:\\x3aerror" in res.output
    res = cli("diff", COMPLIANT, hostile, "--format", "json")
    d = _strict(res.stdout)
    assert any(s["stat"].startswith("stop a\n::error") for s in d["stats"])  # JSON holds the value itself


def test_check_json_is_strict(hostile):
    res = cli("check", hostile, "--format", "json")
    _strict(res.stdout)


def test_watch_escapes_file_names(tmp_path):
    import shutil

    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(COMPLIANT / "trajectories" / "part-0000.parquet", d / f"step{FORGED}.parquet")
    res = cli("watch", d, "--interval", "0.05", "--idle", "0.4", "--status", tmp_path / "s.json")
    assert res.exit_code == 0, res.output
    _clean_lines(res.output)
    assert res.stdout.startswith("stepa\\n:\\x3aerror file=x,line=1:\\x3aforged\\x1b[2J\\u202e.parquet: ok: 0 errors")
    _strict((tmp_path / "s.json").read_text())


@pytest.mark.parametrize("command", ["stats", "show", "diff", "check"])
def test_a_file_name_with_glob_characters_is_that_file(tmp_path, command):
    """`s[1].parquet` is read, never `s1.parquet` (which a glob would match instead)."""
    import pyarrow.parquet as pq

    d = tmp_path / "trajectories"
    d.mkdir()
    t = pq.read_table(COMPLIANT / "trajectories" / "part-0000.parquet")
    pq.write_table(t, d / "s[1].parquet")
    pq.write_table(t.slice(0, 3), d / "s1.parquet")
    named = d / "s[1].parquet"
    first = t.column("trajectory_id")[0].as_py()
    if command == "stats":
        res = cli("stats", named, "--format", "json")
        assert json.loads(res.stdout)["trajectories"] == 128, res.output
    elif command == "show":
        last = t.column("trajectory_id")[127].as_py()  # only in s[1].parquet
        res = cli("show", named, last, "--no-color")
        assert res.exit_code in (0, 1) and last in res.output, res.output
    elif command == "diff":
        res = cli("diff", named, COMPLIANT / "trajectories" / "part-0000.parquet", "--format", "json", "--all")
        rows = {s["stat"]: s for s in json.loads(res.stdout)["stats"]}
        assert rows["trainable share"]["n_a"] == rows["trainable share"]["n_b"], rows["trainable share"]
    else:
        res = cli("check", named, "--format", "json")
        assert json.loads(res.stdout)["summary"]["rows_read"] == 128 and first


def test_filter_stays_bounded_on_a_compression_bomb(tmp_path):
    """One row group of a trajectory file holds a trajectory of 20M tokens (a few hundred KB on
    disk, about 1 GB decoded): `check` leaves it unread (S001); `filter` neither decodes nor copies
    it, and its peak memory stays where `check`'s does."""
    import random

    from fuzzlib import _bomb, run_cli

    records = make_log(n_tasks=2, group_size=2, n_versions=1, seed=3)
    from rollout_audit.faults import write_records

    write_records(tmp_path / "log", *records)
    _bomb(tmp_path / "log", records, random.Random(0), n=20_000_000)
    out = run_cli(["filter", str(tmp_path / "log"), str(tmp_path / "out")], tmp_path)
    assert out.exit == 0, out.stderr[-2000:]
    assert "z-bomb.parquet: row group 0 (1 rows) not audited, left out" in out.stdout
    assert out.peak_mb < 800, out.peak_mb
    import pyarrow.parquet as pq

    assert pq.read_metadata(tmp_path / "out" / "trajectories" / "z-bomb.parquet").num_rows == 0


def test_a_watch_with_no_step_says_in_one_line_that_it_checked_nothing(tmp_path):
    res = cli("watch", tmp_path, "--interval", "0.05", "--idle", "0.1")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        f"rollout-audit: error: {tmp_path}: no step was audited: nothing was checked"
    ]
