"""docs/contract.md and docs/checks.md say what the code says, and the repository stands alone."""

from __future__ import annotations

import re
from pathlib import Path

from rollout_audit.docs import main

ROOT = Path(__file__).resolve().parent.parent


def test_reference_pages_are_current():
    assert main(["--check"]) == 0, "run `python -m rollout_audit.docs`"


def test_no_reference_to_documents_outside_the_repository():
    hits = []
    for p in ROOT.rglob("*"):
        if p.suffix in (".py", ".md") and not {".venv", ".git"} & set(p.parts) and p.is_file() and p != Path(__file__):
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if re.search(r"DESIGN(\.md)? ?\d|shared/seed|\blesson \d|\b11\.\d\.\d\b", line):
                    hits.append(f"{p.relative_to(ROOT)}:{n}")
    assert not hits, hits
