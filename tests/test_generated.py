"""Every file derived from the code (docs/checks.md, docs/contract.md, the README's generated
regions, the fixture manifest, broken logs and detection matrix) is what the code renders now.
A stale one fails here, and only here, with the command that rewrites it."""

from __future__ import annotations

from rollout_audit.dev.generate import COMMAND, stale


def test_derived_files_are_current():
    bad = stale()
    assert not bad, f"stale: {', '.join(bad)}; run `{COMMAND}`"
