"""The executor seam, the options object and the one exception base.

An executor registered by name runs the audit through the reading pipeline and the runner, and
finds what the built-in one finds; options are frozen and keyword-only; every error the tool
raises on purpose is a RolloutAuditError, and a failed audit carries its report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import faultgroups
import polars as pl
import pytest
from click.testing import CliRunner

import rollout_audit as ra
from rollout_audit.cli import main
from rollout_audit.reading.io import discover
from rollout_audit.running.engine import run_audit
from rollout_audit.running.executors import Done, Work, register_executor
from rollout_audit.running.options import Options
from rollout_audit.synth import make_log
from rollout_audit.testing import assert_clean

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class Backwards:
    """Checks the batches last to first, one at a time: another schedule, the same audit (the
    summary goes to the log rules in the log's order, as the seam asks)."""

    def __init__(self, **_: object) -> None:
        self.batches = 0

    def run(self, work: Work) -> Done:
        done = [work.runner.check_batch(part, work.plan) for part in reversed(list(work.batches()))]
        self.batches = len(done)
        frames = [d.summary for d in reversed(done) if d.summary is not None]
        traj = pl.concat(frames, how="diagonal_relaxed", rechunk=True) if frames else pl.DataFrame()
        view = work.log_view(traj)
        rows = sum(d.rows for d in done)
        work.runner.check_log(view, unusable=not rows)
        return Done(rows, sum(d.tokens for d in done), view.stats)


def _outcome(rep: ra.Report) -> tuple:
    f = rep.findings
    return f.sort(f.columns, nulls_last=True).rows(), rep.not_run, rep.partial, rep.crashes, rep.summary["rows_read"]


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    group = faultgroups.RECORD_GROUPS[0]
    root = tmp_path_factory.mktemp("exec") / "log"
    faultgroups.write_group(root, group, *make_log(n_tasks=4, group_size=4, n_versions=2, seed=0), parts=3)
    return root, faultgroups.config(group)


def test_a_registered_executor_finds_what_the_threads_find(faulted):
    root, cfg = faulted
    register_executor("backwards", Backwards)
    local = run_audit(discover([root]), cfg, batch_rows=5)
    ex = Backwards()
    mine = run_audit(discover([root]), cfg, batch_rows=5, executor=ex)
    named = run_audit(discover([root]), cfg, batch_rows=5, executor="backwards")
    assert ex.batches > 1 and local.findings.height and local.count("error")
    assert _outcome(mine) == _outcome(local) == _outcome(named)


def test_an_unknown_executor_is_a_usage_error():
    with pytest.raises(ra.UsageError, match="unknown executor 'nope'.*threads"):
        ra.audit(FIXTURES / "compliant", executor="nope")


def test_options_are_frozen_and_keyword_only(faulted):
    root, cfg = faulted
    with pytest.raises(TypeError):
        Options(("M",))  # type: ignore[misc]
    opts = Options(select=["M"], workers=2)
    assert opts.select == ("M",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.workers = 3  # type: ignore[misc]
    rep = run_audit(discover([root]), cfg, opts)
    ran = set(rep.summary["checks_run"]) | set(rep.not_run)
    assert ran and all(c.startswith("M") for c in ran)


def test_every_purposeful_error_is_a_rollout_audit_error(tmp_path):
    for name in ("UsageError", "ConfigError", "InputError", "AdapterError", "ReplayError", "AuditFailed"):
        assert issubclass(getattr(ra, name), ra.RolloutAuditError), name
    bad = tmp_path / "pyproject.toml"
    bad.write_text("[tool.rollout-audit]\nrtol = 'loose'\n")
    with pytest.raises(ra.RolloutAuditError) as e:
        ra.load_config(bad)
    assert isinstance(e.value, ra.ConfigError)


def test_a_failed_audit_carries_its_report():
    broken = FIXTURES / "broken" / "loss_over_whole_transcript"
    with pytest.raises(ra.AuditFailed) as e:
        assert_clean(broken)
    assert isinstance(e.value, AssertionError)  # pytest shows it as a failed assertion
    assert e.value.report.exit_code() == 1 and e.value.report.codes("error") == {"U601", "U602"}
    assert "U601" in str(e.value) and "U602" in str(e.value)


def test_the_cli_says_a_purposeful_error_in_one_line(tmp_path):
    res = CliRunner().invoke(
        main, ["faults", "apply", "no_such_fault", str(FIXTURES / "compliant"), str(tmp_path / "o")]
    )
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "unknown fault" in res.stderr
    res = CliRunner().invoke(main, ["check", str(tmp_path / "absent")])
    assert res.exit_code == 2 and res.stderr.startswith("rollout-audit: error: ") and "internal error" not in res.stderr
