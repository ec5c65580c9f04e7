"""The reference agent's compliant fixture log: the `fixture` profile trained with a fixed seed.
The broken logs, the manifest and the drift check are the developer tools'
(`python -m rollout_audit.dev generate --fixtures`, `python -m rollout_audit.dev fixtures --check`)."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

FIXTURE_SEED = 0


def agent_log(out: Path) -> None:
    """Train the reference agent's fixture profile into `out` (trajectories/, updates/, and the
    collector's settings in pyproject.toml, as `rollout-audit demo` writes them next to its log)."""
    from .demo import write_collector_settings
    from .train import PROFILES, train

    work = Path(tempfile.mkdtemp())
    try:
        train(replace(PROFILES["fixture"], seed=FIXTURE_SEED), work)
        for sub in ("trajectories", "updates"):
            shutil.copytree(work / sub, out / sub)
        write_collector_settings(out, PROFILES["fixture"].max_response_tokens)
    finally:
        shutil.rmtree(work, ignore_errors=True)
