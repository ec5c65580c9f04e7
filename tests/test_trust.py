"""A pass you can trust: a crashing check is exit 2, absent inputs are not run (never passed),
configuration is validated, unusable input is exit 2, and checks see only what they declare.

Every test goes through the path users see (the CLI or `audit`), without a debug switch.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import faultgroups
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rollout_audit as ra
import rollout_audit.reading.io
import rollout_audit.running.engine
from rollout_audit.cli import main
from rollout_audit.contract.registry import RULES, rule
from rollout_audit.faults import FAULTS, apply, read_records, write_records

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def _compliant():
    return read_records(FIXTURES / "compliant")


@pytest.fixture
def compliant(_compliant):
    """A fresh copy of the compliant fixture's records, to mutate."""
    return copy.deepcopy(_compliant)


def broken_log(tmp_path: Path, compliant, name: str, parts: int = 1, edit=None) -> Path:
    (t, u), _ = apply(name, *compliant)
    if edit is not None:
        edit(t, u)
    out = tmp_path / name
    write_records(out, t, u, parts=parts, corrupt=FAULTS[name].file_level)
    return out


@pytest.fixture
def temporary_rules():
    """Register checks for one test and remove them afterwards (as if from a new module)."""
    before = set(ra.all_rules())
    yield
    for code in set(RULES) - before:
        del RULES[code]


# ---------------------------------------------------------------- crashes are exit 2


class FakePanic(BaseException):
    """Stands for pyo3's PanicException, which derives from BaseException, not Exception."""


def test_a_crashing_check_is_exit_2_and_named_in_text_and_json(tmp_path, compliant, temporary_rules):
    @rule("Z901", "always raises", requires=("reward",))
    def boom(b, cfg):
        raise FakePanic("assertion failed: i < self.len()")

    log = broken_log(tmp_path, compliant, "tool_tokens_trained")
    res = cli("check", log)
    assert res.exit_code == 2, res.output
    # said on stderr, with the log, as every error is; the report on stdout ends on its verdict
    assert f"rollout-audit: error: {log}: check Z901 crashed on " in res.stderr and "FakePanic: assertion" in res.stderr
    assert "crashed on" not in res.stdout and res.stdout.splitlines()[-1].startswith("INCOMPLETE: ")
    assert "Traceback" not in res.output
    # the other checks still ran: the fault is still found
    assert "M101 [error]" in res.output
    doc = json.loads(cli("check", log, "--format", "json").stdout)
    crash = doc["check_errors"][0]
    assert crash["code"] == "Z901" and crash["file"].endswith(".parquet") and crash["rows"].startswith("0-")
    assert "Z901" in doc["summary"]["checks_crashed"] and "Z901" not in doc["summary"]["checks_run"]
    junit = cli("check", log, "--format", "junit").output
    assert '<error message="FakePanic: assertion failed' in junit


def test_a_check_reading_an_undeclared_input_crashes_loudly(tmp_path, compliant, temporary_rules):
    @rule("Z902", "reads a token list it did not declare", requires=("loss_mask",))
    def sneaky(b, cfg):
        return None if b.tokens.lp.size >= 0 else None  # behavior_logprobs is not declared

    @rule("Z903", "reads a configuration key it did not declare", requires=("reward",))
    def sneaky_cfg(b, cfg):
        return None if cfg.atol else None

    rep = ra.audit(FIXTURES / "compliant", select=["Z9"])
    errors = {c["code"]: c["error"] for c in rep.crashes}
    assert (
        errors["Z902"] == "UndeclaredInput: Z902 reads behavior_logprobs without declaring it "
        "(add it to requires or optional)"
    )
    assert "configuration key 'atol'" in errors["Z903"] and rep.exit_code() == 2


def test_a_shared_value_is_keyed_by_declared_inputs(temporary_rules):
    """Checks share a per-batch value only under inputs they declared: a check that names an
    input it did not declare crashes loudly, and two checks see the one value made once."""
    made = []

    def make():
        made.append(1)
        return object()

    seen = []

    @rule("Z904", "shares a value under gamma", requires=("reward",), optional=("gamma",))
    def first(b, cfg):
        seen.append(b.shared("z", ("gamma",), make))

    @rule("Z905", "shares the same value", requires=("reward",), optional=("gamma",))
    def second(b, cfg):
        seen.append(b.shared("z", ("gamma",), make))

    @rule("Z906", "names gamma without declaring it", requires=("reward",))
    def sneaky(b, cfg):
        b.shared("z", ("gamma",), make)

    rep = ra.audit(FIXTURES / "compliant", select=["Z9"])
    assert {c["code"] for c in rep.crashes} == {"Z906"}
    assert "Z906 reads gamma without declaring it" in rep.crashes[0]["error"]
    batches = len(seen) // 2
    assert batches >= 1 and len(made) == batches and seen[0] is seen[1]


def test_a_new_check_in_its_own_module_runs_with_nothing_else_changed(tmp_path, temporary_rules):
    """One function and its declarations: the engine reads the turn field it asks for, the
    configuration key it reads, and reports it not run where its input is absent."""
    mod = tmp_path / "my_checks.py"
    mod.write_text(
        "import polars as pl\n"
        "from rollout_audit.contract.registry import rule\n\n"
        "@rule('Z950', 'temperature above the ceiling', 'warning', requires=('turns.temperature',), config=('atol',))\n"
        "def hot(b, cfg):\n"
        "    '''A turn was sampled above temperature 1.5.'''\n"
        "    bad = b.turns.filter(pl.col('temperature') > 1.5 + cfg.atol)\n"
        "    return bad.select('trajectory_id', pl.col('_t').alias('turn'),\n"
        "                      pl.format('temperature {}', 'temperature').alias('message'))\n"
    )
    import importlib.util

    spec = importlib.util.spec_from_file_location("my_checks", mod)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    trajs, ups = read_records(FIXTURES / "compliant")
    trajs[3]["turns"][1]["temperature"] = 2.0
    rep = ra.audit(trajs, ups, select=["Z950"])
    f = rep.findings
    assert f["code"].to_list() == ["Z950"] and f["turn"].to_list() == [1] and rep.exit_code() == 0
    for t in trajs:
        for tr in t["turns"]:
            del tr["temperature"]
    rep = ra.audit(trajs, ups, select=["Z950"])
    assert rep.not_run == {"Z950": "column turns.temperature absent"}


# ---------------------------------------------------------------- awkward inputs and configuration


def test_m105_with_an_earlier_context_length_out_of_range_is_a_finding(tmp_path, compliant):
    def edit(t, u):
        target = next(x for x in t if x["turns"][-1]["context_length"] != x["turns"][0]["context_length"])
        target["turns"][0]["context_length"] = 10000

    log = broken_log(tmp_path, compliant, "template_reapplied_drops_separator", edit=edit)
    res = cli("check", log, "--select", "M105")
    assert res.exit_code == 1 and "lies outside the trajectory's" in res.output, res.output


def test_a_string_tolerance_in_pyproject_is_exit_2_naming_the_key(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.rollout-audit]\natol = "1e-4"\n')
    res = cli("check", FIXTURES / "broken" / "reward_components_mismatch", "--config", tmp_path / "pyproject.toml")
    assert res.exit_code == 2
    assert "atol: input should be a valid number, got str '1e-4'" in res.output


def test_config_next_to_the_audited_log_is_found_and_validated(tmp_path, compliant):
    log = broken_log(tmp_path / "proj", compliant, "first_visit_paid_twice")
    (tmp_path / "proj" / "pyproject.toml").write_text('[tool.rollout-audit]\nignore = "R409"\n')
    res = cli("check", log)
    assert res.exit_code == 2 and "ignore: input should be a valid list" in res.output
    (tmp_path / "proj" / "pyproject.toml").write_text('[tool.rollout-audit]\nfirst_visit_components = ["key_found"]\n')
    res = cli("check", log)
    assert res.exit_code == 1 and "R408 [error]" in res.output
    assert str(tmp_path / "proj" / "pyproject.toml") in cli("check", log, "--show-settings").output


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[tool.rollout-audit\natol = 1\n", "TOML syntax error"),
        ("[tool.rollout-audit]\natoll = 1.0\n", "unknown key 'atoll'"),
        ("[tool.rollout-audit]\ntruncation = 'drop'\n", "truncation: input should be 'exclude', 'bootstrap'"),
        ("[tool.rollout-audit]\nloop_length = 1\n", "loop_length: input should be greater than or equal to 2"),
    ],
)
def test_bad_configuration_is_exit_2_with_file_and_key(tmp_path, text, expected):
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text(text)
    res = cli("check", FIXTURES / "compliant", "--config", cfg)
    assert res.exit_code == 2 and expected in res.output and str(cfg) in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_config_file_with_only_other_tools_is_defaults(tmp_path):
    cfg = tmp_path / "ruff.toml"
    cfg.write_text("[tool.ruff]\nline-length = 100\n")
    assert cli("check", FIXTURES / "compliant", "--config", cfg).exit_code == 0


def test_uint64_trainer_version_beyond_int64_is_reported_not_a_crash(tmp_path):
    log = tmp_path / "log"
    for sub in ("trajectories", "updates"):
        for f in (FIXTURES / "compliant" / sub).rglob("*.parquet"):
            dst = log / f.relative_to(FIXTURES / "compliant")
            dst.parent.mkdir(parents=True, exist_ok=True)
            t = pq.read_table(f)
            if sub == "updates":
                v = t.column("trainer_version").to_numpy().astype(np.uint64)
                v[0] = np.uint64(2**63 + 5)
                i = t.schema.get_field_index("trainer_version")
                t = t.set_column(i, pa.field("trainer_version", pa.uint64()), pa.array(v))
            pq.write_table(t, dst)
    res = cli("check", log)
    assert res.exit_code == 1, res.output
    assert "trainer_version: values do not fit int64" in res.output and "crashed" not in res.output


def test_e802_fires_on_a_log_without_initial_state_id(tmp_path, compliant):
    def edit(t, u):
        for x in t:
            x.pop("initial_state_id", None)

    log = broken_log(tmp_path, compliant, "reset_not_reproducible", edit=edit)
    rep = ra.audit(log)
    assert rep.codes("error") == {"E802"} and rep.complete


@pytest.fixture(scope="module")
def grouped_logs(tmp_path_factory, _compliant):
    """Every fault, in the shared logs of tests/faultgroups.py, split in 2 and in 3 partitions
    and audited: {(group, parts): (log, broken trajectories, touched ids, report)}."""
    out = {}
    for parts in (2, 3):
        for group in faultgroups.GROUPS:
            log = tmp_path_factory.mktemp(f"p{parts}") / faultgroups.group_id(group)
            trajs, touched = faultgroups.write_group(log, group, *_compliant, parts=parts)
            out[group, parts] = (log, trajs, touched, ra.audit(log, config=faultgroups.config(group)))
    return out


@pytest.mark.parametrize("parts", [2, 3])
def test_every_fault_is_caught_split_across_partitions(grouped_logs, parts):
    """The detection matrix over partitions, as `faults matrix --parts N` runs it, with several
    faults to a log: every fault's codes on its trajectories, nothing else."""
    failed = {}
    for group in faultgroups.GROUPS:
        _, trajs, touched, rep = grouped_logs[group, parts]
        failed[faultgroups.group_id(group)] = faultgroups.problems(group, rep.findings, trajs, touched)
    assert not any(failed.values()), {g: p for g, p in failed.items() if p}


def test_mask_check_runs_when_logprobs_are_absent(tmp_path, compliant):
    def edit(t, u):
        for x in t:
            del x["behavior_logprobs"]

    log = broken_log(tmp_path, compliant, "tool_tokens_trained", edit=edit)
    res = cli("check", log, "--select", "M")
    assert res.exit_code == 1 and "M101 [error]" in res.output, res.output
    assert "0 tokens read" not in res.output


def test_policy_lag_without_any_bound_is_not_run(compliant):
    trajs, ups = compliant
    for u in ups:
        u.pop("max_policy_lag", None)
    rep = ra.audit(trajs, ups)
    assert rep.not_run["P503"].startswith("needs max_policy_lag")
    rep = ra.audit(trajs, ups, config=ra.Config(max_policy_lag=4))
    assert "P503" not in rep.not_run


def test_partial_coverage_is_reported_with_counts(compliant):
    trajs, ups = compliant
    for t in trajs[:5]:
        t["behavior_logprobs"] = None
    rep = ra.audit(trajs, ups, select=["L201", "M101"])
    n = len(trajs)
    assert rep.partial == {"L201": f"ran on {n - 5} of {n} trajectories; 5 lack behavior_logprobs (null)"}
    assert "1 partially run" in rep.render()


@pytest.mark.parametrize("what", ["csv", "updates-only", "corrupt-only"])
def test_no_usable_input_is_exit_2_with_one_line(tmp_path, what):
    if what == "csv":
        target = tmp_path / "table.csv"
        target.write_text("a,b\n1,2\n")
    elif what == "updates-only":
        target = FIXTURES / "compliant" / "updates"
    else:
        target = FIXTURES / "broken" / "corrupt_file" / "trajectories" / "part-0000.parquet"
    res = cli("check", target)
    assert res.exit_code == 2, res.output
    last = res.output.strip().splitlines()[-1]
    expected = "rollout-audit: error: " if what == "csv" else f"rollout-audit: error: {target}: nothing to audit: "
    assert last.startswith(expected), res.output  # csv: not Parquet at all
    assert "nothing to audit" not in res.stdout
    assert "not run" not in res.output and "U605" not in res.output


# ---------------------------------------------------------------- declarations are complete


def test_every_check_sees_the_same_with_all_inputs_as_with_its_declarations(grouped_logs):
    """A check that reads an input it did not declare as optional would see it vanish from its
    view: run each check with its declarations and with every input declared, on the compliant
    fixture and on every fault (the grouped logs in three partitions, whose audits by declarations
    the detection test reads), and compare."""
    every = tuple(
        [c.name for c in ra.contract.schema.columns("trajectories")]
        + [f"turns.{c.name}" for c in ra.contract.schema.columns("turn")]
        + [f"updates.{c.name}" for c in ra.contract.schema.columns("updates")]
        + list(__import__("rollout_audit.frames.batch", fromlist=["x"]).SUMMARY_INPUTS)
    )
    keys = tuple(ra.Config.model_fields)
    wide = {c: dataclasses.replace(r, optional=every, config=keys) for c, r in ra.all_rules().items()}
    logs = {"compliant": (FIXTURES / "compliant", ra.Config(), ra.audit(FIXTURES / "compliant"))}
    for group in faultgroups.GROUPS:
        log, _, _, rep = grouped_logs[group, 3]
        logs[faultgroups.group_id(group)] = (log, faultgroups.config(group), rep)
    for name, (log, cfg, rep) in logs.items():
        assert not rep.crashes, rep.crashes
        assert rep.findings.equals(_findings(log, cfg, wide)), name


def _findings(log: Path, cfg, rules) -> pl.DataFrame:
    rep = ra.running.engine.run_audit(ra.reading.io.discover([log]), cfg, rules=rules)
    assert not rep.crashes, rep.crashes
    return rep.findings


def test_an_incomplete_audit_in_a_machine_format_says_why_on_stderr():
    target = FIXTURES / "compliant" / "updates"
    res = CliRunner().invoke(main, ["check", str(target), "--format", "github"])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        f"rollout-audit: error: {target}: nothing to audit: the log holds no trajectory records"
    ], res.stderr
