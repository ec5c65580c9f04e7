"""The check catalogue as text: what `explain`, `explain --list` and `config KEY` print of each rule,
read without importing a check.

`catalogue.json` beside this module is derived from the registered rules by
`python -m rollout_audit.dev generate` (tests/test_generated.py holds it equal to them), so that
a command that only describes the checks starts in a fraction of a second instead of importing
every check module with polars, numpy and pyarrow. Rules registered in this process (every one
once `rollout_audit.checks` is imported, or a rule of the user's own) are described from their
declaration and take precedence over the file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from ..contract.registry import Rule, Severity, registered

FILE = Path(__file__).with_name("catalogue.json")


@dataclass(frozen=True)
class Entry:
    """A rule as the catalogue describes it: its declaration without its function, its inputs
    named as the contract names them (`pv_min` -> `turns.policy_version`)."""

    code: str
    name: str
    severity: Severity
    preview: bool
    explanation: str
    needs: tuple[str, ...]  # the rule's `requires`
    reads: tuple[str, ...]  # the rule's `optional`: read when present
    config: tuple[str, ...]

    @property
    def family(self) -> str:
        return self.code[0]


def entry(r: Rule) -> Entry:
    """The catalogue's entry of a registered rule."""
    from ..frames.batch import contract_names

    return Entry(
        r.code,
        r.name,
        r.severity,
        r.preview,
        r.explanation,
        tuple(contract_names(r.requires)),
        tuple(contract_names(r.optional)),
        r.config,
    )


def render(rules: dict[str, Rule]) -> str:
    """catalogue.json's text for `rules` (the generate command's)."""
    return json.dumps({c: asdict(entry(r)) for c, r in sorted(rules.items())}, indent=1, ensure_ascii=False) + "\n"


@cache
def _committed() -> dict[str, Entry]:
    raw = json.loads(FILE.read_text(encoding="utf-8"))
    return {
        c: Entry(**{**e, "needs": tuple(e["needs"]), "reads": tuple(e["reads"]), "config": tuple(e["config"])})
        for c, e in raw.items()
    }


def entries() -> dict[str, Entry]:
    """Every rule's entry, by code: the committed catalogue's, and those of the rules registered in
    this process over them (every rule's, imported, when there is no catalogue to read: before the
    generate command first writes it)."""
    if not FILE.is_file():
        from .. import checks  # noqa: F401  (registers every rule)
    live = {c: entry(r) for c, r in registered().items()}
    return dict(sorted({**(_committed() if FILE.is_file() else {}), **live}.items()))
