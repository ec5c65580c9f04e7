"""Fuzzing: Arrow-level mutations of a compliant log, each audited by the CLI in its own
process. Every case must exit 0, 1 or 2, print no traceback, give parseable JSON (or one
line on exit 2) and leave the log's bytes unchanged. RA_EXAMPLES sets the number of cases
(25 in CI); RA_FUZZ_STATS=path appends one JSON line per case (the campaign's figures)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from fuzzlib import (
    FILE_DAMAGE,
    REGRESSION_SEEDS,
    TRAJ_COLUMNS,
    UPDATE_COLUMNS,
    build_log,
    digest,
    ops,
    prepare_evidence,
    run_cli,
    run_workflow_case,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_audit.synth import make_log

EXAMPLES = int(os.environ.get("RA_EXAMPLES", "25"))
RECORDS = make_log(n_tasks=2, group_size=2, n_versions=2, seed=5)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 25,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@given(
    traj=st.lists(ops(TRAJ_COLUMNS), min_size=1, max_size=3),
    upd=st.lists(ops(UPDATE_COLUMNS), max_size=1),
    how=FILE_DAMAGE,
    fmt=st.sampled_from(["json", "json", "json", "github", "junit", "text"]),
)
def test_mutated_log_never_crashes(traj, upd, how, fmt):
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        log = build_log(work / "log", RECORDS, traj, upd, how)
        before = digest(log)
        out = run_cli(["check", str(log), "--format", fmt], work)
        problems = [p for p in out.problems if fmt == "json" or p != "unparseable JSON"]
        if digest(log) != before:
            problems.append("input written")
        if os.environ.get("RA_FUZZ_STATS"):
            with open(os.environ["RA_FUZZ_STATS"], "a") as fh:
                fh.write(
                    json.dumps(
                        {
                            "exit": out.exit,
                            "problems": problems,
                            "fmt": fmt,
                            "traj": repr(traj),
                            "upd": repr(upd),
                            "damage": how,
                        }
                    )
                    + "\n"
                )
        assert not problems, (problems, out.exit, out.stderr[-3000:], traj, upd, how)


@pytest.mark.parametrize("args", [["report", "{log}", "-o", "{work}/r.html"], ["stats", "{log}"]])
def test_mutated_log_other_commands(tmp_path, args):
    log = build_log(tmp_path / "log", RECORDS, [("bad_utf8", "task_id", 0), ("dup", "reward", 0)], [], ("none", 0))
    before = digest(log)
    out = run_cli([a.format(log=log, work=tmp_path) for a in args], tmp_path)
    assert out.exit in (0, 1, 2) and "Traceback" not in out.stderr, out.stderr
    assert digest(log) == before


# Adapter dumps and configuration files: RA_DUMP_EXAMPLES / RA_CONFIG_EXAMPLES cases (a fixed sample in
# CI; `benchmarks/fuzz_campaign.py --kind dumps|configs` runs the long campaign).
DUMP_EXAMPLES = int(os.environ.get("RA_DUMP_EXAMPLES", "6"))
CONFIG_EXAMPLES = int(os.environ.get("RA_CONFIG_EXAMPLES", "4"))


@pytest.mark.parametrize("seed", [*range(DUMP_EXAMPLES), *REGRESSION_SEEDS["dumps"]])  # and what the campaign found
def test_mutated_dump_never_crashes(tmp_path, seed):
    from fuzzlib import run_dump_case

    out, problems = run_dump_case(seed, tmp_path)
    assert not problems, (problems, out.exit, out.stderr[-3000:])


@pytest.fixture(scope="module")
def small_log(tmp_path_factory) -> Path:
    from rollout_audit.faults import write_records

    root = tmp_path_factory.mktemp("cfg") / "log"
    write_records(root, *make_log(n_tasks=2, group_size=2, n_versions=1, seed=3))
    return root


@pytest.mark.parametrize("seed", [*range(CONFIG_EXAMPLES), *REGRESSION_SEEDS["configs"]])
def test_mutated_config_never_crashes(tmp_path, small_log, seed):
    from fuzzlib import run_config_case

    out, problems = run_config_case(seed, tmp_path, small_log)
    assert not problems, (problems, out.exit, out.stderr[-3000:])


# The workflow commands (baselines, diff, filter then `check OUT`, watch with a writer process,
# convert then `check OUT`, configurations at every depth of a log): RA_WORKFLOW_EXAMPLES cases, one
# of each command in CI (`benchmarks/fuzz_campaign.py --kind workflow` runs the long campaign).
WORKFLOW_EXAMPLES = int(os.environ.get("RA_WORKFLOW_EXAMPLES", "6"))
WORKFLOW_RECORDS = make_log(n_tasks=2, group_size=2, n_versions=2, seed=5)


@pytest.mark.parametrize("seed", range(WORKFLOW_EXAMPLES))
def test_workflow_commands_never_crash_nor_pass_silently(tmp_path, seed):
    from fuzzlib import prepare_workflow

    case = prepare_workflow(seed, tmp_path, WORKFLOW_RECORDS)
    out, problems = run_workflow_case(case, tmp_path, lambda args: run_cli(args, tmp_path, 120))
    assert not problems, (case.label, problems, out.exit, out.stderr[-3000:])


# ---------------------------------------------------------------- what the evidence campaign found


@pytest.mark.parametrize("seed", REGRESSION_SEEDS["evidence"])
def test_evidence_campaign_cases_stay_fixed(tmp_path, seed):
    """`benchmarks/fuzz_campaign.py --kind evidence` cases that failed before the fixes, each in its own
    process forked from the preloaded server (a native crash or a hang is an outcome, not a dead run)."""
    case = prepare_evidence(seed, tmp_path)
    out, problems = run_workflow_case(case, tmp_path, lambda args: run_cli(args, tmp_path, 120))
    assert not problems, (problems, out.exit, out.stderr[-3000:])
