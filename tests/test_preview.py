"""A check in preview (ruff's manner): it runs only when the user asks for preview checks, through
every entry point, and `explain` and the docs mark it. A preview rule is registered here for the
test's own duration (M198 on turns sampled above temperature 10) and removed afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import write_log

import rollout_audit as ra
from rollout_audit.cli import main
from rollout_audit.contract.registry import RULES, rule
from rollout_audit.dev.docs import checks_markdown

CODE = "M198"


@pytest.fixture
def preview_rule():
    @rule(CODE, "turn sampled above temperature 10", "error", requires=("turns.temperature",), preview=True)
    def too_hot(b, cfg):
        """A turn records a sampling temperature above 10.

        No agent samples that hot: the value is a unit error of the collector.
        """
        bad = b.turns.filter(pl.col("temperature") > 10)
        return bad.select("trajectory_id", pl.col("_t").alias("turn"), pl.lit("temperature above 10").alias("message"))

    yield CODE
    RULES.pop(CODE, None)


@pytest.fixture
def hot_log(tmp_path, records):
    trajs, ups = records
    trajs[0]["turns"][0]["temperature"] = 70.0
    return write_log(tmp_path / "log", trajs, ups)


def _check(*args):
    res = CliRunner().invoke(main, ["check", *map(str, args), "--format", "json"])
    return res, json.loads(res.stdout) if res.stdout.startswith("{") else None


def test_a_preview_check_runs_only_when_asked(preview_rule, hot_log, tmp_path):
    res, rep = _check(hot_log)
    assert CODE not in {f["code"] for f in rep["findings"]} and CODE not in rep["summary"]["checks_run"]
    preview = sorted(c for c, r in ra.all_rules().items() if r.preview)  # this one and the catalogue's
    assert CODE in preview and rep["summary"]["checks_in_preview_not_selected"] == preview
    res, rep = _check(hot_log, "--preview")
    assert res.exit_code == 1 and CODE in {f["code"] for f in rep["findings"]}, res.output
    # the library and a user's configuration ask the same way
    assert CODE not in ra.audit(str(hot_log)).codes()
    cfg = tmp_path / "mine.toml"
    cfg.write_text("preview = true\n")
    assert CODE in ra.audit(str(hot_log), config_file=cfg).codes()


def test_a_preview_check_named_without_preview_is_exit_2(preview_rule, hot_log):
    res = CliRunner().invoke(main, ["check", str(hot_log), "--select", CODE])
    assert res.exit_code == 2 and "a check in preview: run with --preview" in res.output, res.output


def test_a_log_cannot_turn_preview_on(preview_rule, hot_log):
    (hot_log / "pyproject.toml").write_text("[tool.rollout-audit]\npreview = true\n")
    res = CliRunner().invoke(main, ["check", str(hot_log)])
    assert res.exit_code == 2 and "preview: refused in a configuration inside the audited log" in res.stderr


def test_explain_and_the_docs_mark_a_preview_check(preview_rule):
    out = CliRunner().invoke(main, ["explain", CODE]).stdout
    assert out.startswith(f"{CODE} (error, preview: runs only with --preview)")
    assert (
        f"{CODE}  error    turn sampled above temperature 10  (preview)"
        in CliRunner().invoke(main, ["explain", "M"]).stdout
    )
    assert f"### {CODE} (error, preview): turn sampled above temperature 10" in checks_markdown()


def test_every_stable_check_is_silent_on_the_agents_compliant_log():
    """What a check must pass before it leaves preview: the agent's compliant log audits with no
    finding from any stable check; every framework's compliant fixtures, each under its page's
    documented command, are tests/test_framework_pages.py's (the session test gives the same
    verdict through every entry point)."""
    rep = ra.audit("fixtures/compliant")
    assert rep.findings.filter(pl.col("severity") != "info").is_empty(), rep.render()


def test_a_plain_check_names_the_preview_checks_it_left_out():
    """The bundled log a preview check catches does not pass without a word: the text summary names
    the checks in preview that were not selected, and `--preview` runs them."""
    log = "fixtures/broken/bootstrapped_through_terminal"
    plain = CliRunner().invoke(main, ["check", log])
    assert plain.exit_code == 0
    preview = ", ".join(sorted(c for c, r in ra.all_rules().items() if r.preview))  # R415 and the others
    assert f"in preview, not selected: {preview} (--preview runs them)" in plain.stdout.splitlines()
    with_preview = CliRunner().invoke(main, ["check", log, "--preview"])
    assert with_preview.exit_code == 1 and "R415" in with_preview.stdout
    assert "in preview, not selected" not in with_preview.stdout


def test_each_fault_only_a_preview_check_catches_is_named_so_on_the_fixtures_page():
    """fixtures/README.md's matrix runs the checks in preview; the page names the broken logs that a
    plain `check` therefore passes, and each of them passes a plain `check` naming its check as left
    out, and fails with `--preview` on exactly its codes."""
    manifest = json.loads(Path("fixtures/manifest.json").read_text())
    preview = {c for c, r in ra.all_rules().items() if r.preview}
    only = {n: set(e["codes"]) for n, e in manifest["faults"].items() if set(e["codes"]) <= preview}
    # a fault whose setting is the user's alone is audited with the user's file, as the page says
    user = {
        n: ["--config", f"fixtures/{e['user_config_file']}"]
        for n, e in manifest["faults"].items()
        if e.get("user_config_file")
    }
    assert "bootstrapped_through_terminal" in only
    page = " ".join(Path("fixtures/README.md").read_text().split())
    assert "Caught only with `--preview`" in page
    for name, codes in only.items():
        assert f"{name} ({', '.join(sorted(codes))})" in page
        log = f"fixtures/broken/{name}"
        plain = CliRunner().invoke(main, ["check", log, *user.get(name, [])])
        assert plain.exit_code == 0 and plain.stdout.splitlines()[-1].startswith("ok: "), plain.output
        left_out = next(x for x in plain.stdout.splitlines() if x.startswith("in preview, not selected: "))
        assert codes <= set(left_out.split(": ", 1)[1].split(" (")[0].split(", "))
        res, rep = _check(log, "--preview", *user.get(name, []))
        found = {f["code"]: f["severity"] for f in rep["findings"] if f["severity"] in ("error", "warning")}
        assert set(found) == codes, (name, found)
        assert res.exit_code == (1 if "error" in found.values() else 0), (name, res.exit_code, found)
