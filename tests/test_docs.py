"""The repository stands alone: no reference to documents outside it."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _sources() -> list[Path]:
    """The repository's .py and .md files, outside .venv and .git (pruned, not walked: the
    virtual environment alone holds tens of thousands of files)."""
    out = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in {".venv", ".git"}]
        out += [Path(top) / f for f in files if f.endswith((".py", ".md"))]
    return out


def test_no_reference_to_documents_outside_the_repository():
    hits = []
    for p in _sources():
        if p.is_file() and p != Path(__file__):
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if re.search(r"DESIGN(\.md)? ?\d|shared/seed|\blesson \d|\b11\.\d\.\d\b", line):
                    hits.append(f"{p.relative_to(ROOT)}:{n}")
    assert not hits, hits
