"""Every framework page (docs/frameworks/<name>.md) keeps its promises: it documents a sampler-side and
a trainer-side hook, and the `rollout-audit check` commands it documents audit that framework's
compliant fixtures (fixtures/frameworks/<name>/compliant*.jsonl) clean: exit 0 and no finding at all.

A documented command is a line of a code block (indented or fenced) that starts with
`rollout-audit check`, with its `\\` continuations. Its log argument is replaced by the fixture; the
rest (`--from`, every `--context`) is run as written. Every compliant fixture must audit clean under at
least one documented command of its page, and every documented `--from` command must audit at least
one compliant fixture clean (a command no fixture stands behind is a promise nobody checked)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from adapterhelp import cli

from rollout_audit.adapters import NAMES
from rollout_audit.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "frameworks").glob("*.md"))
# either may go on ("## Trainer-side hook: what ..."), or be a sub-heading ("### Sampler-side hook" under a fallback)
HOOKS = ("## Sampler-side hook", "## Trainer-side hook")
NAMES_OF_PAGES = [p.stem for p in PAGES]


def commands(text: str) -> list[list[str]]:
    """The `rollout-audit check` commands of a page's code blocks, as argument lists (after `check`)."""
    out: list[list[str]] = []
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    blocks += re.findall(r"(?:^(?: {4}|\t)[^\n]*\n?)+", text, flags=re.M)
    for block in blocks:
        lines = [ln.strip() for ln in block.splitlines()]
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("rollout-audit check"):
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + " " + lines[i]
                args = shlex.split(line)[2:]
                if args not in out:
                    out.append(args)
            i += 1
    return out


def _value_options() -> set[str]:
    """The options of `check` that take a value (their next argument is not a log path)."""
    check = main.commands["check"]  # type: ignore[attr-defined]
    return {o for p in check.params if not getattr(p, "is_flag", False) and not p.nargs == -1 for o in p.opts}


def on_fixture(args: list[str], fixture: Path) -> list[str]:
    """`args` with every log path replaced by `fixture` (given once)."""
    takes_value = _value_options()
    out: list[str] = []
    placed = False
    skip = False
    for a in args:
        if skip or a.startswith("-"):
            out.append(a)
            skip = a in takes_value and "=" not in a
            continue
        if not placed:
            out.append(str(fixture))
            placed = True
    return out if placed else [*out, str(fixture)]


def _clean(args: list[str]) -> tuple[bool, str]:
    res = cli("check", *args, "--format", "json")
    if res.exit_code != 0:
        return False, f"exit {res.exit_code}: {res.stderr.strip()[:300] or res.stdout[:300]}"
    found = json.loads(res.stdout)["findings"]
    return not found, "; ".join(f"{f['code']} {f['message'][:120]}" for f in found[:3])


@pytest.mark.parametrize("name", NAMES_OF_PAGES)
def test_page_documents_a_sampler_side_and_a_trainer_side_hook(name: str) -> None:
    text = (ROOT / "docs" / "frameworks" / f"{name}.md").read_text()
    heads = ["## " + h for h in re.findall(r"^#{2,} (.*)$", text, flags=re.M)]  # under "## Fallback": ###
    lacking = [h for h in HOOKS if not any(x == h or x.startswith(h + ":") for x in heads)]
    assert not lacking, f"{name}.md lacks {lacking} (a heading may go on after a colon); has {heads}"


@pytest.mark.parametrize("name", NAMES_OF_PAGES)
def test_documented_commands_audit_the_compliant_fixtures_clean(name: str) -> None:
    text = (ROOT / "docs" / "frameworks" / f"{name}.md").read_text()
    cmds = commands(text)
    assert cmds, f"{name}.md documents no `rollout-audit check` command in a code block"
    home = ROOT / "fixtures" / "frameworks" / name  # a dump of binary files (prime-rl) is a directory
    fixtures = sorted([*home.glob("compliant*.jsonl"), *(d for d in home.glob("compliant*") if d.is_dir())])
    if name not in NAMES:  # no dump format (TRL: the guard audits in the loop and writes a contract log)
        assert not fixtures and all("--from" not in c for c in cmds), cmds
        return
    assert fixtures, f"no fixtures/frameworks/{name}/compliant*.jsonl"
    from_cmds = [c for c in cmds if "--from" in c]
    assert from_cmds, f"{name}.md documents no `rollout-audit check --from {name}` command"
    used: set[int] = set()
    for fx in fixtures:
        tried, clean = [], False
        for k, c in enumerate(from_cmds):
            ok, why = _clean(on_fixture(c, fx))
            if ok:
                used.add(k)
                clean = True
            tried.append(f"  {shlex.join(c)}\n    -> {why or 'clean'}")
        assert clean, f"{fx.name} audits clean under no documented command of {name}.md:\n" + "\n".join(tried)
    unused = [shlex.join(c) for k, c in enumerate(from_cmds) if k not in used]
    assert not unused, f"{name}.md documents commands no compliant fixture audits clean under: {unused}"


def test_commands_are_parsed_with_continuations_and_paths_replaced(tmp_path: Path) -> None:
    page = "text\n\n    rollout-audit check --from x dumps/ --context a=1 \\\n        --context b=2\n\n"
    page += "```\nrollout-audit check --config c.toml logs/\n```\n"
    cmds = sorted(commands(page))
    assert cmds == [["--config", "c.toml", "logs/"], ["--from", "x", "dumps/", "--context", "a=1", "--context", "b=2"]]
    fx = tmp_path / "compliant.jsonl"
    assert on_fixture(cmds[1], fx) == ["--from", "x", str(fx), "--context", "a=1", "--context", "b=2"]
    assert on_fixture(cmds[0], fx) == ["--config", "c.toml", str(fx)]
