"""`rollout-audit demo` shows everything the audit can do, through the CLI as a user runs it: the demo's
own audit replays its log, the replay command it prints works from any directory, every check that
can apply to the agent's log runs on it (M107 on its chat-template render, T306 on its response
budget), the replayer is never taken from beside the log, and broken variants are caught."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner

from reference_agent.demo import CONFIG, LOG, REPLAY
from rollout_audit.cli import main

REPLAY_CHECKS = {"L205", "L206", "L207", "L209", "L211"}
# what the agent's trainer does not have, so no log of it can record them: expert routes (it is no
# mixture of experts: P505), an overlong penalty (R414) and a split's exposed token (it never splits an
# episode: M111), a critic (its advantages are group-relative: R416), a trainer temperature apart from
# the turns' (it recomputes each turn at the temperature logged on it: L212), a capture layer in front of
# its sampler (M112); its recorded nucleus (L210) is in every log it writes
CANNOT_APPLY = {"P505", "R414", "M111", "R416", "L212", "M112"}
# everything it does it records: its update records state the ratio's anchor (the behaviour
# log-probs, no correction, clipping on), so U610 runs on its log


def cli(*args: object, cwd: Path) -> tuple[int, str, str]:
    """`rollout-audit ARGS` run from `cwd` (the configuration search starts there)."""
    old = Path.cwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(old)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.stdout, r.stderr


def summary(*args: object, cwd: Path) -> tuple[int, dict]:
    code, out, err = cli("check", *args, "--format", "json", cwd=cwd)
    assert out, err
    return code, json.loads(out)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The tiny profile's demo, run as a user runs it (from its parent directory)."""
    parent = tmp_path_factory.mktemp("demo")
    code, out, err = cli("demo", "out", "--profile", "tiny", "--no-progress", cwd=parent)
    assert code == 0, out + err
    return parent / "out", out


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory with nothing of the demo's in it, and no configuration above it."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d


def test_the_demo_audit_replays_its_log_and_runs_every_check_that_can_apply(demo: tuple[Path, str]) -> None:
    out, text = demo
    assert sorted(p.name for p in out.iterdir()) == [
        ".rollout-audit-demo",
        "checkpoints",
        LOG,
        "pyproject.toml",
        CONFIG,
    ]
    assert "replay ran (L205, L206, L207, L209): " in text, text
    assert "not run: L212, M111, M112, P505, R414, R416 (" in text, text  # nothing else lacked its evidence
    assert f"configuration: out/{CONFIG} with replay = {REPLAY}" in text, text  # as the user named OUT
    assert "\nok: 0 errors, 0 warnings" in text, text


def test_the_printed_replay_command_works_and_from_any_directory(demo: tuple[Path, str], elsewhere: Path) -> None:
    """The command the demo prints, run where the demo was run; then from another directory (the
    configuration names its checkpoints by absolute path)."""
    out, text = demo
    (line,) = [x for x in text.splitlines() if x.startswith("with replay:")]
    argv = line.split(":", 1)[1].split()
    assert argv[:2] == ["rollout-audit", "check"] and "--replay" in argv, line
    printed = argv[2:]
    absolute = [str(out.parent / a) if a.startswith("out/") else a for a in printed]
    for args, cwd in ((printed, out.parent), (absolute, elsewhere)):
        code, rep = summary(*args, cwd=cwd)
        s = rep["summary"]
        assert code == 0, rep
        assert REPLAY_CHECKS <= set(s["checks_run"]) and set(s["checks_not_run"]) == CANNOT_APPLY, s
        assert not rep["unfulfilled"] and {"M107", "T306", "U610"} <= set(s["checks_run"])
        assert all(v["max"] < 1e-4 for v in s["statistics"]["L205"]), s["statistics"]["L205"]


def test_a_plain_check_of_the_demo_log_finds_the_collector_settings(demo: tuple[Path, str], elsewhere: Path) -> None:
    """Without --config (and so without replay) the log's own pyproject.toml gives T306 its budget."""
    out, _ = demo
    code, rep = summary(out / LOG, cwd=elsewhere)
    assert code == 0, rep
    assert set(rep["summary"]["checks_not_run"]) == CANNOT_APPLY | REPLAY_CHECKS, rep["summary"]
    assert rep["summary"]["configuration"].endswith("pyproject.toml [tool.rollout-audit]")
    code, rep = summary(LOG, "--config", CONFIG, "--replay", 8, cwd=out)  # from inside OUT, relative paths
    assert code == 0 and REPLAY_CHECKS <= set(rep["summary"]["checks_run"]), rep


def test_the_replayer_is_never_taken_from_beside_the_log(demo: tuple[Path, str], tmp_path: Path) -> None:
    """The trust boundary holds for the demo's files: its replayer, put in a configuration found
    next to (or inside) the audited log, is refused with the file named."""
    out, _ = demo
    for where in ("beside", "inside"):
        copy = tmp_path / where
        shutil.copytree(out / LOG, copy / LOG)
        cfg = copy / "pyproject.toml" if where == "beside" else copy / LOG / "pyproject.toml"
        shutil.copy(out / CONFIG, cfg)
        code, _, err = cli("check", copy / LOG, "--replay", 8, cwd=tmp_path)
        assert code == 2 and f"{cfg}: replayer, replay_checkpoints: refused" in err, err


def test_broken_variants_of_the_demo_log_are_caught(demo: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = demo
    config = out / CONFIG
    # a trainer that builds each turn alone, without the template's separator: M107
    broken = tmp_path / "separator"
    assert cli("faults", "apply", "turn_separator_dropped", out / LOG, broken, cwd=tmp_path)[0] == 0
    code, rep = summary(broken, "--config", config, "--strict", cwd=tmp_path)
    assert code == 1 and {f["code"] for f in rep["findings"]} == {"M107"}, rep["findings"]
    # a collector whose budget was smaller than the episodes it recorded as terminated: T306
    small = tmp_path / "budget.toml"
    small.write_text(config.read_text().replace("max_response_tokens = 48", "max_response_tokens = 20"))
    code, rep = summary(out / LOG, "--config", small, "--strict", cwd=tmp_path)
    assert code == 1 and {f["code"] for f in rep["findings"]} == {"T306"}, rep["findings"]
    # checkpoints mapped one version late (each version's file holds the next one's weights): L205
    stale = tmp_path / "stale"
    stale.mkdir()
    versions = sorted(int(p.stem[1:]) for p in (out / "checkpoints").glob("v*.safetensors"))
    for v in versions[:-1]:
        shutil.copy(out / "checkpoints" / f"v{v + 1}.safetensors", stale / f"v{v}.safetensors")
    late = tmp_path / "late.toml"
    late.write_text(config.read_text().replace(str(out / "checkpoints"), str(stale)))
    code, rep = summary(out / LOG, "--config", late, "--replay", REPLAY, cwd=tmp_path)
    assert code == 1 and "L205" in {f["code"] for f in rep["findings"]}, rep["findings"]
    # the checkpoints moved away: the asked-for replay cannot run, exit 2 naming the path tried
    gone = tmp_path / "gone.toml"
    gone.write_text(config.read_text().replace(str(out / "checkpoints"), str(tmp_path / "nowhere")))
    code, text, err = cli("check", out / LOG, "--config", gone, "--replay", 8, cwd=tmp_path)
    assert code == 2 and str(tmp_path / "nowhere") in text + err, text + err


def test_the_collector_cuts_an_episode_its_budget_cannot_hold(tmp_path: Path, elsewhere: Path) -> None:
    """A budget that binds: episodes are cut before a turn it cannot hold (truncated, max_tokens), so no
    episode recorded as terminated fills it; the audit under that budget is clean and runs T306."""
    import pyarrow.parquet as pq

    from reference_agent.train import PROFILES, TURN_TOKENS, train

    budget = 2 * TURN_TOKENS  # a second turn starts only after a short first one, a third never
    train(replace(PROFILES["tiny"], max_response_tokens=budget), tmp_path / "run", log_dir=LOG)
    rows = pq.read_table(tmp_path / "run" / LOG / "trajectories").to_pylist()
    cut = [r for r in rows if r["stop_reason"] == "max_tokens"]
    assert cut and all(r["truncated"] and not r["terminated"] for r in cut)
    assert all(sum(t >= 0 for t in r["token_turn"]) < budget for r in rows if r["terminated"])
    (tmp_path / "run" / "pyproject.toml").write_text(f"[tool.rollout-audit]\nmax_response_tokens = {budget}\n")
    code, rep = summary(tmp_path / "run" / LOG, "--strict", cwd=elsewhere)
    assert code == 0 and "T306" in rep["summary"]["checks_run"], rep


def test_the_demo_may_replace_what_it_wrote_and_nothing_else(demo: tuple[Path, str], tmp_path: Path) -> None:
    """Re-running the README's line replaces the demo's own output (it carries the demo's mark); a
    directory the demo did not write is refused; without a terminal, progress comes as lines."""
    import reference_agent.train as train

    old = train.PROGRESS_EVERY
    train.PROGRESS_EVERY = 0.0  # a line per round: what is printed does not depend on this machine's speed
    try:
        shutil.copytree(demo[0], tmp_path / "out")
        (tmp_path / "out" / "stale").write_text("from the earlier run")
        code, out, err = cli("demo", "out", "--profile", "tiny", cwd=tmp_path)
    finally:
        train.PROGRESS_EVERY = old
    assert code == 0 and "replacing out: an earlier `rollout-audit demo` wrote it" in err, err
    assert not (tmp_path / "out" / "stale").exists() and (tmp_path / "out" / ".rollout-audit-demo").is_file()
    rounds = [x for x in err.splitlines() if x.startswith("training seed 0: round ")]
    assert rounds[0].startswith("training seed 0: round 1/") and len(rounds) > 1, err
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    code, _, err = cli("demo", "mine", "--profile", "tiny", cwd=tmp_path)
    assert code == 2 and "not empty" in err and (mine / "notes").is_dir()


def test_the_guide_names_the_checks_that_cannot_apply() -> None:
    """docs/guide/reference-agent.md states the demo's not-run list; it is the one this file holds."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "reference-agent.md").read_text()
    said = re.search(r"but (?:\w+) that cannot apply to it: ([A-Z]\d{3}(?:, [A-Z]\d{3})* and [A-Z]\d{3})", page)
    assert said, "the page no longer states which checks cannot apply to the agent's log"
    assert set(re.findall(r"[A-Z]\d{3}", said.group(1))) == CANNOT_APPLY
