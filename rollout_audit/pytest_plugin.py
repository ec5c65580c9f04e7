"""pytest plugin (entry point `pytest11`): the `rollout_audit_clean` fixture."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def rollout_audit_clean() -> Callable:
    """`rollout_audit.testing.assert_clean`: audit a log or in-memory tables, fail with the findings."""
    from .testing import assert_clean

    return assert_clean
