"""The README's library snippet runs and its configuration examples load (its example output is
generated: tests/test_generated.py)."""

from __future__ import annotations

import re
from pathlib import Path

from rollout_audit.contract.config import load_config

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "guide" / "configuration.md").read_text()  # the guide's pages
REPLAY = (ROOT / "docs" / "guide" / "replay.md").read_text()


def test_library_snippet_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["report"].ok


def test_config_example_loads(tmp_path):
    toml = re.search(r"```toml\n(.*?)```", CONFIGURATION, re.S).group(1)
    (tmp_path / "pyproject.toml").write_text(toml)  # a project's own configuration, for the logs under it
    cfg = load_config(start=tmp_path / "logs")
    assert cfg.ignore == ["R409"] and cfg.truncation == "exclude" and cfg.max_policy_lag == 1


def test_replay_config_example_loads(tmp_path, monkeypatch):
    toml = re.findall(r"```toml\n(.*?)```", REPLAY, re.DOTALL)[0]
    (tmp_path / "pyproject.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)  # the user's own project: replay settings are trusted there
    cfg = load_config(start=tmp_path / "logs")
    assert cfg.replay_checkpoints == "ckpt/step-{version}" and cfg.replay == 0 and cfg.replay_atol == 1e-3


def test_guide_library_pandera_snippet_names_the_rows_check_reports(monkeypatch):
    monkeypatch.chdir(ROOT)
    page = (ROOT / "docs" / "guide" / "library.md").read_text()
    (code,) = [c for c in re.findall(r"```python\n(.*?)```", page, re.S) if "trajectory_schema" in c]
    scope: dict = {}
    exec(compile(code, "docs/guide/library.md", "exec"), scope)
    assert scope["cases"]["check"].str.starts_with("M101").all()
