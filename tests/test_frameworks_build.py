"""The committed framework fixtures are what their generators (tests/frameworks/<name>.py) make."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frameworks import build


def test_committed_fixtures_match_their_generators(capsys):
    assert build.main(["--check"]) == 0, capsys.readouterr().err
    assert build.generators(), "no framework generator found"
