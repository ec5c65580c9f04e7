"""Every exception rollout-audit raises on purpose derives from `RolloutAuditError`, so a caller
(the CLI among them) catches one class. The subclasses say whose fault it is: the user's
configuration, the user's request, a framework's records, a replayer, or a check.

A `RolloutAuditError` is a message for the user: one line naming the file, record or key and
what was expected. Anything else that escapes is a defect of the tool."""

from __future__ import annotations

from typing import Any


class RolloutAuditError(Exception):
    """Base of every error rollout-audit raises on purpose: the message is for the user."""


class UsageError(RolloutAuditError):
    """The request cannot be carried out (a path, an option, an output location): exit code 2."""


class ConfigError(RolloutAuditError, ValueError):
    """The configuration cannot be used (exit code 2): names the file, key and what was expected."""


class InputError(RolloutAuditError, ValueError):
    """Input the audit was given cannot be used as asked (a tokenizer, a dump, a log to fault)."""


class DecodeError(InputError):
    """The tokenizer cannot be loaded: the message is one line for the user."""


class AdapterError(InputError):
    """A framework's records lack what the adapter needs: one line naming the field and record."""


class ReplayError(RolloutAuditError):
    """Replay cannot run as configured."""


class NotConfigured(ReplayError):
    """Replay cannot run: no replayer, or no checkpoint for a version. The message is the not-run reason."""


class NotRun(RolloutAuditError):
    """Raised by a check that cannot run on this input; the message is the reason shown
    under `not_run` (e.g. "needs first_visit_components in the configuration")."""


class Unmet(NotRun):
    """Raised by a check that cannot run although the user explicitly asked for what it needs
    (`--replay N`): the check is not run, and the audit is incomplete (exit 2)."""


class UndeclaredInput(RolloutAuditError):
    """A check read an input it did not declare: a defect of the check, reported as a crash."""


class AuditFailed(RolloutAuditError, AssertionError):
    """The audit found what blocks training, or could not complete; `.report` holds the findings.

    An AssertionError too, so that pytest shows `assert_clean` failing as a test failure."""

    def __init__(self, message: str, report: Any) -> None:
        super().__init__(message)
        self.report = report


# The errors a user meets are named as the package exports them (`rollout_audit.AuditFailed` in a
# traceback or a pytest failure), not by the module that defines them; pickling finds them there too.
for _public in (RolloutAuditError, UsageError, ConfigError, InputError, AdapterError, ReplayError, AuditFailed):
    _public.__module__ = "rollout_audit"
