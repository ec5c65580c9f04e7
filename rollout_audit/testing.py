"""Audit a log in your own test suite: `assert_clean(path_or_tables)` raises `AuditFailed` (an
AssertionError, so pytest shows a failure) with the findings in a readable form, like `rollout-audit check` would print them.

    from rollout_audit.testing import assert_clean

    def test_exported_rollouts_are_trainable(tmp_path):
        export_rollouts(tmp_path)                      # your pipeline
        assert_clean(tmp_path, ignore=["R409"])

With pytest, the fixture `rollout_audit_clean` (this package's pytest plugin) is the same function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .api import audit
from .contract.config import Config
from .contract.errors import AuditFailed
from .reporting.report import Report, _coda, verdict_line

__all__ = ["assert_clean"]
EXAMPLES = 5  # findings shown per code in the failure message


def assert_clean(
    source: Any,
    updates: Any = None,
    *,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    config: Config | None = None,
    strict: bool = False,
    framework: str | None = None,
    context: dict[str, Any] | None = None,
) -> Report:
    """Audit `source` (a path, a list of paths, a scanned Log, or in-memory trajectory records or
    tables with `updates`) and return the report; raise AuditFailed (`.report` holds it) when the audit would exit
    non-zero: error findings (warnings too with `strict`), a crashed check, or nothing to audit. The
    configuration's tolerated rates and baseline apply, as in `rollout-audit check`. `framework` and
    `context`: the paths are that trainer's dump (as `check --from`)."""
    __tracebackhide__ = True  # pytest shows the caller's line and the message, not this library's frames
    rep = audit(source, updates, config=config, select=select, ignore=ignore, framework=framework, context=context)
    if rep.exit_code(strict):
        raise AuditFailed(failure_message(rep, strict), rep)
    return rep


def failure_message(rep: Report, strict: bool = False) -> str:
    """The verdict, then a few findings per code, then why the audit is incomplete if it is."""
    findings = rep.render("text", limit=EXAMPLES, quiet=True)
    trouble = _coda(rep) if not rep.complete else []
    head = "the rollout log is not clean: " + (verdict_line(rep, strict) if rep.unusable is None else "INCOMPLETE")
    return "\n".join([head, *([findings] if findings else []), *trouble])
