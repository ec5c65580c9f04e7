"""The repository stands alone: no reference to documents outside it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _sources(root: Path = ROOT) -> list[Path]:
    """The repository's .py and .md files: those git tracks (a virtual environment of any name, or
    anything else beside the checkout, is not the repository's). Without git (an unpacked
    archive), every file outside the hidden directories."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout.decode()
        names = [root / n for n in listed.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for top, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            names += [Path(top) / f for f in files]
    return [p for p in names if p.suffix in (".py", ".md")]


def test_no_reference_to_documents_outside_the_repository():
    hits = []
    for p in _sources():
        if p.is_file() and p != Path(__file__):
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if re.search(r"DESIGN(\.md)? ?\d|shared/seed|\blesson \d|\b11\.\d\.\d\b", line):
                    hits.append(f"{p.relative_to(ROOT)}:{n}")
    assert not hits, hits


def test_a_virtual_environment_of_another_name_is_not_scanned(tmp_path):
    """A `venv/` or `.venv-user/` with third-party text beside the checkout is not the repository's:
    in a clone with both (untracked, as a user's are), only what git tracks is scanned."""
    scanned = {p.relative_to(ROOT).parts[0] for p in _sources()}
    assert "rollout_audit" in scanned and "tests" in scanned
    assert not scanned & {".venv", "venv", ".git", "node_modules"}
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the scan falls back to every file outside hidden directories")
    clone = tmp_path / "clone"
    (clone / "pkg").mkdir(parents=True)
    (clone / "pkg" / "mod.py").write_text("x = 1\n")
    for venv in ("venv", ".venv-user"):
        (clone / venv / "lib").mkdir(parents=True)
        (clone / venv / "lib" / "README.md").write_text("third-party text the repository's rules do not govern\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(clone)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "pkg"], check=True)
    assert _sources(clone) == [clone / "pkg" / "mod.py"]


def test_every_page_states_the_current_contract_version():
    """A page that says which version the contract is ("the log contract v1.3", "(v1.3)") says the
    one `rollout-audit schema` writes; a mention of the version a field was added in ("contract 1.2
    evidence") is history and stays."""
    from rollout_audit.contract.schema import CONTRACT_VERSION

    stale = []
    for p in _sources():
        if p.suffix == ".md" and p.is_file():
            for n, line in enumerate(p.read_text().splitlines(), 1):
                for v in re.findall(r"\bcontract \(?v(\d+\.\d+)\)?", line):
                    if v != CONTRACT_VERSION:
                        stale.append(f"{p.relative_to(ROOT)}:{n}: v{v}")
    assert not stale, f"the contract is v{CONTRACT_VERSION}: {stale}"
