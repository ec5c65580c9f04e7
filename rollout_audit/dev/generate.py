"""Everything in the repository that is derived from the code, rewritten by one command:

    python -m rollout_audit.dev generate              # docs, README, fixture manifest and broken logs
    python -m rollout_audit.dev generate --fixtures   # also retrain the compliant agent log (torch)
    python -m rollout_audit.dev generate --check      # exit 1, naming the stale files, if any is stale

- docs/contract.md from `schemas/`, docs/checks.md from the registered rules, and the rules' text
  that `explain` reads without importing a check (rollout_audit/running/catalogue.json);
- the code blocks of docs/frameworks/{verl,skyrl,slime}.md that name an integration's options and
  the keys it writes (`dev/pages.py`);
- the README's generated regions: the check example (written by running the audit on the
  bundled fixture), the number of checks with their code ranges, the number of faults, the
  configuration keys a log may set and those refused inside it;
- fixtures/broken/<fault>/ and fixtures/manifest.json, from the committed compliant agent log
  and the registered faults, and the detection matrix of fixtures/README.md (each fault
  applied, written and audited). `--fixtures` first retrains the compliant log itself
  (reference_agent.fixtures.agent_log: trains the agent with torch, about a minute on 2 cores).

A generated region of a Markdown file lies between `<!-- generated: NAME -->` and
`<!-- end generated -->`; the text around it is written by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

from ..checks import all_rules
from ..contract.registry import FAMILIES
from ..running import catalogue
from .docs import checks_markdown, configuration_markdown, contract_markdown
from .pages import regions as framework_regions

ROOT = Path(__file__).resolve().parent.parent.parent
COMMAND = "python -m rollout_audit.dev generate"
EXAMPLE = "fixtures/broken/loss_over_whole_transcript"
_REGION = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
_NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve".split()


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def fill_regions(text: str, regions: dict[str, Callable[[], str]], where: str) -> str:
    """`text` with each generated region's body replaced by its renderer's output."""
    seen = set()

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in regions:
            raise ValueError(f"{where}: no renderer for generated region {name!r}")
        seen.add(name)
        return f"{m.group(1)}{regions[name]()}{m.group(4)}"

    out = _REGION.sub(sub, text)
    missing = sorted(set(regions) - seen)
    if missing:
        raise ValueError(f"{where}: generated region {', '.join(missing)} not found")
    return out


def _ranges(codes: list[str]) -> str:
    """`S001–S005` for consecutive codes, runs joined by commas."""
    runs: list[list[str]] = []
    for c in codes:
        if runs and int(c[1:]) == int(runs[-1][-1][1:]) + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


def checks_sentence() -> str:
    rules = all_rules()
    fams = [f for f in FAMILIES if any(r.family == f for r in rules.values())]
    parts = [
        f"{FAMILIES[f].split(':')[0].lower()} ({_ranges(sorted(c for c, r in rules.items() if r.family == f))})"
        for f in fams
    ]
    n = _NUMBERS[len(fams)] if len(fams) < len(_NUMBERS) else str(len(fams))
    return textwrap.fill(f"{len(rules)} checks in {n} families: {', '.join(parts)}.", 100) + "\n"


def faults_sentence() -> str:
    from ..faults import FAULTS

    return (
        f"On the bundled agent log all {len(FAULTS)} named faults are caught with no false positive, in one\n"
        "file and split across partitions; the matrix is in [fixtures/README.md](../../fixtures/README.md)\n"
        "(`rollout-audit faults matrix fixtures/compliant`).\n"
    )


def example_block(root: Path = ROOT) -> str:
    """The README's example: `rollout-audit check` on a bundled broken log, as printed."""
    from click.testing import CliRunner

    from ..cli import main

    with _cwd(root):
        res = CliRunner().invoke(main, ["check", EXAMPLE], catch_exceptions=False)
    lines = [f"$ rollout-audit check {EXAMPLE}", *res.stdout.splitlines()]
    return "\n" + "".join(f"    {line}".rstrip() + "\n" for line in lines) + "\n"


def log_context() -> str:
    """The keys a configuration inside the audited log may set, and the keys refused there."""
    from ..contract.config import LOG_CONTEXT, Config

    def keys(names) -> str:
        return ", ".join(f"`{k}`" for k in names)

    refused = [k for k in Config.model_fields if k not in LOG_CONTEXT]
    lines = [
        "- **may come with the log** (how the run was produced; `max_examples` only changes what is shown): "
        + keys(LOG_CONTEXT)
        + ";",
        "- **refused inside the log** (which checks run, tolerances, shares, baselines, caps, timeouts, replay): "
        + keys(refused)
        + ".",
    ]
    return "".join(textwrap.fill(line, 100, subsequent_indent="  ", break_on_hyphens=False) + "\n" for line in lines)


def readme(text: str, root: Path = ROOT) -> str:
    return fill_regions(text, {"example": lambda: example_block(root)}, "README.md")


def quoted(root: Path, *args: str) -> str:
    """`rollout-audit ARGS` run from `root`, quoted as a guide page shows it (stdout, then stderr)."""
    from click.testing import CliRunner

    from ..cli import main

    with _cwd(root):
        res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    lines = [f"$ rollout-audit {' '.join(args)}", *res.stdout.splitlines(), *res.stderr.splitlines()]
    # paths relative to the checkout, so that the page is the same in every clone and worktree
    lines = [line.replace(f"{root.resolve()}/", "") for line in lines]
    return "\n" + "".join(f"    {line}".rstrip() + "\n" for line in lines) + "\n"


def guide_regions(root: Path = ROOT) -> dict[str, dict[str, Callable[[], str]]]:
    """The generated regions of each page of docs/guide/: what a page quotes of the tool's output."""
    two = ("fixtures/compliant", "fixtures/broken/loss_over_whole_transcript")
    return {
        "reading-reports.md": {
            "several-logs": lambda: quoted(root, "check", *two, "--format", "concise", "--select", "U"),
        },
        "configuration.md": {
            "log-context": log_context,
            "show-settings": lambda: quoted(root, "check", "fixtures/compliant", "--show-settings"),
        },
        "checks-and-evidence.md": {
            "checks": checks_sentence,
            "faults": faults_sentence,
            "explain": lambda: quoted(root, "explain", "T302"),
        },
    }


# ---------------------------------------------------------------- fixtures


def write_broken(root: Path) -> dict:
    """fixtures/broken/ and manifest.json under `root`, from `root`/compliant and the faults."""
    from .fixtures import write_broken as write

    return write(root)


def matrix_text(root: Path) -> str:
    """The detection matrix: each fault applied to the compliant log, written and audited."""
    from ..faults import FAULTS, detect, read_records, render_matrix

    trajs, ups = read_records(root / "compliant")
    with tempfile.TemporaryDirectory() as work:
        rows = [detect(n, trajs, ups, work) for n in FAULTS]
    problems = [p for r in rows if (p := r.problem())]
    if problems:  # the matrix is the catalogue's promise: a miss or a false positive is never written down
        raise MatrixError("the detection matrix fails:\n" + "\n".join(f"  {p}" for p in problems))
    return render_matrix(rows)


class MatrixError(Exception):
    """`generate` found a fault not caught, or a check firing on another fault's log."""


def preview_note() -> str:
    """The faults only a check in preview catches: the matrix runs those checks, a plain `check` of
    their broken logs does not (it says ok, and names the checks in preview it left out)."""
    from ..faults import FAULTS

    preview = {c for c, r in all_rules().items() if r.preview}
    only = [f for f in FAULTS.values() if f.codes and f.codes <= preview]
    if not only:
        return ""
    named = ", ".join(f"{f.name} ({', '.join(sorted(f.codes))})" for f in only)
    example = next((f for f in only if not f.user_config), only[0])  # a fault of the user's setting needs their file
    config = f" --config fixtures/broken/{example.name}.user.toml" if example.user_config else ""
    text = (
        "Caught only with `--preview`: the faults whose checks are all in preview, which the matrix runs and a "
        "plain `rollout-audit check` does not (it says ok, and its summary names the checks in preview it left "
        f"out): {named}. For example `rollout-audit check fixtures/broken/{example.name} --preview{config}`."
    )
    return "\n" + textwrap.fill(text, 100, break_on_hyphens=False, break_long_words=False) + "\n"


def matrix_region(matrix: str) -> str:
    return (
        f"\n`rollout-audit faults matrix fixtures/compliant` (each fault applied, written, audited):\n\n{matrix}\n"
        f"{preview_note()}\n"
    )


# ---------------------------------------------------------------- the command


def text_files(root: Path = ROOT, matrix: str | None = None) -> dict[Path, str]:
    """The derived text files as the code renders them now (the fixture matrix only when given)."""
    out = {
        root / "docs" / "contract.md": contract_markdown(),
        root / "docs" / "checks.md": checks_markdown(),
        root / "rollout_audit" / "running" / catalogue.FILE.name: catalogue.render(all_rules()),
        root / "docs" / "configuration.md": configuration_markdown(),
        root / "README.md": readme((root / "README.md").read_text(), root),
    }
    for name, regions in guide_regions(root).items():
        page = root / "docs" / "guide" / name
        out[page] = fill_regions(page.read_text(), regions, f"docs/guide/{name}")
    for name, regions in framework_regions().items():
        page = root / "docs" / "frameworks" / name
        out[page] = fill_regions(page.read_text(), regions, f"docs/frameworks/{name}")
    if matrix is not None:
        page = root / "fixtures" / "README.md"
        out[page] = fill_regions(page.read_text(), {"matrix": lambda: matrix_region(matrix)}, "fixtures/README.md")
    return out


def generate(root: Path = ROOT, *, fixtures: bool = False) -> list[Path]:
    """Rewrite every derived file under `root`; the files written."""
    if fixtures:
        from reference_agent.fixtures import agent_log

        shutil.rmtree(root / "fixtures" / "compliant", ignore_errors=True)
        agent_log(root / "fixtures" / "compliant")
    write_broken(root / "fixtures")
    written = [root / "fixtures" / "manifest.json", root / "fixtures" / "broken"]
    # the README's example audits a broken fixture: rendered after the fixtures are written
    for path, text in text_files(root, matrix_text(root / "fixtures")).items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written


def stale(root: Path = ROOT) -> list[str]:
    """Derived files that differ from what `generate` writes, without retraining or auditing
    every fault: the pages and README regions; the manifest and the set of broken logs, from
    the faults applied to the committed compliant log; the matrix's rows and the faults it
    names. (That each fault is caught exactly is what tests/test_faults.py and
    tests/test_fixtures.py show.)"""
    out = [p.relative_to(root).as_posix() for p, text in text_files(root).items() if p.read_text() != text]
    broken = root / "fixtures" / "broken"
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(root / "fixtures" / "compliant", Path(tmp) / "compliant")
        manifest = write_broken(Path(tmp))
        users = {p.name: p.read_text() for p in (Path(tmp) / "broken").glob("*.user.toml")}
    committed = root / "fixtures" / "manifest.json"
    if not committed.is_file() or json.loads(committed.read_text()) != manifest:
        out.append("fixtures/manifest.json")
    logs = sorted(p.name for p in broken.iterdir() if p.is_dir())
    if logs != sorted(manifest["faults"]) or {p.name for p in broken.glob("*.user.toml")} != set(users):
        out.append("fixtures/broken/")
    out += [
        f"fixtures/broken/{n}"
        for n, text in sorted(users.items())
        if (broken / n).is_file() and (broken / n).read_text() != text
    ]
    page = (root / "fixtures" / "README.md").read_text()
    named = re.findall(r"^\| (\w+) \| ([A-Z0-9, ]+) \|", page, re.M)
    if (
        named != [(n, ", ".join(e["codes"])) for n, e in _in_fault_order(manifest).items()]
        or preview_note() not in page
    ):
        out.append("fixtures/README.md")
    return out


def _in_fault_order(manifest: dict) -> dict:
    from ..faults import FAULTS

    return {n: manifest["faults"][n] for n in FAULTS if n in manifest["faults"]}


def main(argv: list[str] | None = None) -> int:
    from ..faults import NoTarget

    ap = argparse.ArgumentParser(prog="python -m rollout_audit.dev", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="rewrite every derived file")
    gen.add_argument("--fixtures", action="store_true", help="also retrain the compliant agent log (needs torch)")
    gen.add_argument("--check", action="store_true", help="exit 1 if a derived file is stale; write nothing")
    gen.add_argument("--root", type=Path, default=ROOT, help="the checkout to rewrite (default: this one)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.check:
            bad = stale(root)
            if bad:
                print(f"stale: {', '.join(bad)}; run `{COMMAND}`", file=sys.stderr)
            return 1 if bad else 0
        written = generate(root, fixtures=args.fixtures)
    except MatrixError as e:
        print(f"generate: error: {e}", file=sys.stderr)
        return 1
    except NoTarget as e:  # nothing was written: every fault is applied before a file is replaced
        print(f"generate: error: {root / 'fixtures' / 'compliant'}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    return 0
