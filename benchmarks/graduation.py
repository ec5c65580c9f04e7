"""False positives of the contract 1.4 rules and the capture layers' (L212, M112) on every compliant fixture, and their cost on a benchmark log.

    python -m benchmarks.graduation [--all] [--cost 12M] [--codes R416,U609]

A rule graduates from preview when every framework's compliant fixtures stay clean with it on. This
audits each compliant fixture with the checks in preview on, the way its framework page documents
(`docs/frameworks/<name>.md`: every documented `rollout-audit check --from <name>` command, the log
argument replaced by the fixture), and counts each rule's findings there. A fixture counts under a
command when that command audits it clean but for checks in preview (the page's promise, held by
tests/test_framework_pages.py); a rule's count on a fixture is the most it reported under any of
those commands, and "ran" says whether it ran under one of them at all (a rule that is not run on a
fixture has nothing to say about false positives there). The bundled compliant log
(`fixtures/compliant`) and TRL's contract log are audited with a plain `check --preview`.

Compliant fixtures are `fixtures/compliant*`, `fixtures/frameworks/*/compliant*` and `EXERCISED`; `--all` also
audits every other framework fixture and keeps those that audit clean by default under a documented
command (the compliant fixtures without "compliant" in their name, such as slime's `ppo_masked_gae`).

`--cost LABEL` times each rule on the benchmark log `benchmarks/data/LABEL` (generated when absent; its
`trainer_logprobs` is the second log-prob column L211 compares), with `rollout_audit.audit` and the
checks in preview on, median of three, wall and process CPU (every thread): the rule alone (`select =
[CODE]`: the columns it reads and its own work), beside the full audit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
CODES = ("R416", "R417", "U609", "U610", "L211", "L212", "M112")  # contract 1.4 rules, and the capture layers'
# each rule's faults in a framework's own record shape (fixtures/frameworks/<name>/<case>): never compliant
FRAMEWORK_FAULTS = {
    "R416": ("slime/ppo_gae_over_every_position", "verl/trainer_gae_over_every_position"),
    "R417": (),  # no adapted framework records the paid per-turn reward beside the trained one
    "U609": (),  # no adapted framework records the reducer's divisor with the samples it divides
    "U610": ("slime/async_ratio_on_current_weights",),
    "L211": ("verifiers/v1_top_p_against_full_vocab_trainer",),
    "L212": ("agent_lightning/temperature_override",),
    "M112": ("nemo_gym/token_rewritten_after_capture",),
}
# the trainer's settings that make a case a fault, after its page's documented command (the last
# `--context` of a key wins): agent-lightning's proxy sampled at 1.0, its trainer recomputes at 0.7
FAULT_SETTINGS = {"agent_lightning/temperature_override": ("--context", "rollout_temperature=0.7")}
# compliant fixtures without "compliant" in their name on which these rules run (their faults' counterparts)
EXERCISED = ("slime/ppo_masked_gae", "slime/removed_sample", "verl/trainer_compliant")


@dataclass
class Row:
    """One fixture: per code, whether it ran and the most findings it gave under a command that applies."""

    fixture: str
    commands: int = 0  # documented commands under which the fixture audits clean but for checks in preview
    ran: dict[str, bool] = field(default_factory=dict)
    found: dict[str, int] = field(default_factory=dict)


def _pages():
    """The documented-command parsing of tests/test_framework_pages.py (one parser, not two)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import test_framework_pages as pages

    return pages


def preview_codes() -> set[str]:
    from rollout_audit.checks import all_rules

    return {c for c, r in all_rules().items() if r.preview} | set(CODES)


def _run(args: list[str]) -> tuple[int, dict | None]:
    from rollout_audit.cli import main

    res = CliRunner().invoke(main, ["check", *args, "--preview", "--format", "json"])
    try:
        return res.exit_code, json.loads(res.stdout)
    except ValueError:
        return res.exit_code, None


def _account(row: Row, code: int, rep: dict | None, codes: tuple[str, ...], preview: set[str]) -> None:
    if rep is None or code not in (0, 1):
        return
    found = rep["findings"]
    if any(f["code"] not in preview for f in found):
        return  # the command does not audit this fixture clean: not the policy its trainer follows
    row.commands += 1
    ran = set(rep["summary"]["checks_run"]) | set(rep["summary"].get("checks_partially_run") or [])
    for c in codes:
        row.ran[c] = row.ran.get(c, False) or c in ran
        row.found[c] = max(row.found.get(c, 0), sum(f["code"] == c for f in found))


def compliant_fixtures(every: bool = False) -> list[tuple[str | None, Path]]:
    """(framework page name or None for a plain `check`, path) of each fixture to audit."""
    faulty = {case for cases in FRAMEWORK_FAULTS.values() for case in cases}
    out: list[tuple[str | None, Path]] = [(None, p) for p in sorted(ROOT.glob("fixtures/compliant*")) if p.is_dir()]
    for home in sorted((ROOT / "fixtures" / "frameworks").iterdir()):
        pattern = "*" if every else "compliant*"
        found = sorted(p for p in home.glob(pattern) if p.suffix == ".jsonl" or p.is_dir())
        found += [p for p in sorted(home.glob("*.jsonl")) if f"{home.name}/{p.stem}" in EXERCISED and p not in found]
        found = [p for p in found if f"{home.name}/{p.stem}" not in faulty]
        out += [(home.name, p) for p in found]
    return out


def measure(codes: tuple[str, ...] = CODES, every: bool = False) -> list[Row]:
    """Each compliant fixture audited with the checks in preview on, as its page documents."""
    pages, preview = _pages(), preview_codes()
    from rollout_audit.adapters import NAMES

    rows = []
    for name, path in compliant_fixtures(every):
        row = Row(str(path.relative_to(ROOT)))
        if name is None or name not in NAMES:  # a contract log (the bundled one, TRL's guard's)
            _account(row, *_run([str(path)]), codes, preview)
        else:
            text = (ROOT / "docs" / "frameworks" / f"{name}.md").read_text()
            for c in (c for c in pages.commands(text) if "--from" in c):
                _account(row, *_run(pages.on_fixture(c, path)), codes, preview)
        if row.commands or not every:  # under --all, a fixture no documented command audits clean is a fault
            rows.append(row)
    return rows


def caught(codes: tuple[str, ...] = CODES) -> dict[str, dict[str, int]]:
    """Per code, each of its framework-shape faults and the most findings of the code it got under a
    documented command of its page (with the checks in preview on)."""
    pages = _pages()
    out: dict[str, dict[str, int]] = {}
    for code in codes:
        out[code] = {}
        for case in FRAMEWORK_FAULTS.get(code, ()):
            name, stem = case.split("/")
            text = (ROOT / "docs" / "frameworks" / f"{name}.md").read_text()
            path = ROOT / "fixtures" / "frameworks" / name / f"{stem}.jsonl"
            n = 0
            for c in (c for c in pages.commands(text) if "--from" in c):
                _, rep = _run([*pages.on_fixture(c, path), *FAULT_SETTINGS.get(case, ())])
                n = max(n, sum(f["code"] == code for f in (rep or {}).get("findings", [])))
            out[code][case] = n
    return out


def synthetic(codes: tuple[str, ...] = CODES) -> dict[str, list[str]]:
    """Per code, the registered faults (rollout_audit/faults) that expect it: the detection matrix holds each."""
    from rollout_audit.faults import FAULTS

    return {c: sorted(f.name for f in FAULTS.values() if c in f.codes) for c in codes}


def table(rows: list[Row], codes: tuple[str, ...] = CODES) -> str:
    """Markdown: one line per fixture, per code its findings or "not run"."""
    head = "| fixture | commands | " + " | ".join(codes) + " |\n|---|---|" + "---|" * len(codes) + "\n"
    body = ""
    for r in rows:
        cells = [(str(r.found[c]) if r.ran.get(c) else "not run") if r.commands else "-" for c in codes]
        body += f"| {r.fixture} | {r.commands} | " + " | ".join(cells) + " |\n"
    runs = {c: sum(bool(r.ran.get(c)) for r in rows) for c in codes}
    fps = {c: sum(r.found.get(c, 0) for r in rows) for c in codes}
    body += "| **findings / fixtures it ran on** | | " + " | ".join(f"{fps[c]} / {runs[c]}" for c in codes) + " |\n"
    return head + body


# ---------------------------------------------------------------- cost on a benchmark log


def _timed(path: Path, repeat: int, **settings) -> tuple[float, float, dict]:
    """Median wall and process CPU seconds (every thread) of `repeat` audits of `path` with the checks in
    preview on and `trainer_logprobs` as the second log-prob column; the last report's codes and not-run."""
    import rollout_audit as ra
    from benchmarks.generate import TRAINER_LOGPROBS
    from rollout_audit.contract.config import Config

    cfg = Config(preview=True, compare_logprobs=TRAINER_LOGPROBS, **settings)
    walls, cpus = [], []
    rep = None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        rep = ra.audit(str(path), config=cfg)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    assert rep is not None
    return statistics.median(walls), statistics.median(cpus), {"not_run": rep.not_run, "codes": sorted(rep.codes())}


def cost(label: str, codes: tuple[str, ...] = CODES, repeat: int = 3) -> str:
    """Each code alone on `benchmarks/data/<label>` (`select = [CODE]`: the columns it reads and its own
    work), beside the full audit. A difference of two full audits (with and without `ignore = [CODE]`)
    would be the rule's share, but on a loaded machine it is within the run-to-run spread of either."""
    from benchmarks.run import DATA, dataset

    path = dataset(label, 0.0, DATA)
    _timed(path, 1)  # warm: imports, page cache
    load = os.getloadavg()[0]
    w0, c0, full = _timed(path, repeat)
    out = [
        f"# {label} ({path}), {os.cpu_count()} CPUs, 1-min load {load:.1f} at the start; median of {repeat}; "
        "CPU is process time over every thread",
        f"full audit (checks in preview on, compare_logprobs = trainer_logprobs): wall {w0:.2f} s, CPU {c0:.2f} s, "
        f"findings {', '.join(full['codes']) or 0}",
        "| rule | alone: wall s | alone: CPU s | findings | not run |",
        "|---|---|---|---|---|",
    ]
    for c in codes:
        w, cpu, info = _timed(path, repeat, select=[c])
        why = info["not_run"].get(c, "")
        out.append(f"| {c} | {w:.2f} | {cpu:.2f} | {', '.join(info['codes']) or 0} | {why[:80]} |")
    out.append(f"1-min load at the end {os.getloadavg()[0]:.1f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="also every framework fixture that audits clean by default")
    ap.add_argument("--codes", default=",".join(CODES))
    ap.add_argument("--cost", metavar="LABEL", help="time each rule on benchmarks/data/LABEL (e.g. 12M)")
    ap.add_argument("--no-fixtures", action="store_true", help="only the cost")
    a = ap.parse_args(argv)
    codes = tuple(c.strip().upper() for c in a.codes.split(",") if c.strip())
    if not a.no_fixtures:
        print(table(measure(codes, a.all), codes))
        synth = synthetic(codes)
        for code, cases in caught(codes).items():
            shape = ", ".join(f"{k} ({v} finding(s))" for k, v in cases.items()) or "none"
            print(f"{code}: synthetic {', '.join(synth[code]) or 'none'}; framework shape {shape}")
    if a.cost:
        print(cost(a.cost, codes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
