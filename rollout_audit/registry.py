"""The check catalogue as a table of rules: each check is one decorated function.

A rule's docstring is its explanation (`rollout-audit explain CODE`): the rule, the lesson
it comes from, and what to fix. `requires` names the inputs it needs; when they are absent
the engine lists the rule under *not run* with the reason instead of counting it as passed.
Requirement strings: `col` (trajectory column), `turns.field` (turn struct field),
`updates` / `updates.col` (update records).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]
Scope = Literal["batch", "log"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Rule:
    """One check: a stable code, a severity, what it needs, and the function that runs it."""

    code: str
    name: str
    severity: Severity
    scope: Scope
    requires: tuple[str, ...]
    func: Callable

    @property
    def explanation(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or self.name)

    @property
    def summary(self) -> str:
        return self.explanation.splitlines()[0]


RULES: dict[str, Rule] = {}


class NotRun(Exception):
    """Raised by a check that cannot run on this input; the message is the reason shown
    under `not_run` (e.g. "needs first_visit_components in the configuration")."""


def rule(
    code: str, name: str, severity: Severity = "error", *, requires: tuple[str, ...] = (), scope: Scope = "batch"
) -> Callable[[Callable], Callable]:
    """Register a check function under `code`.

    A `batch` check gets a `Batch` (one row-group slice of trajectories) and the config; a
    `log` check gets the `LogView` (per-trajectory summaries of the whole log, updates).
    Both return a polars DataFrame with any of the columns trajectory_id, turn, position,
    message (and file, for log checks), or None when nothing is wrong.
    """

    def deco(func: Callable) -> Callable:
        if code in RULES:
            raise ValueError(f"check code {code} registered twice")
        RULES[code] = Rule(code, name, severity, scope, tuple(requires), func)
        return func

    return deco


def selected(code: str, select: list[str] | tuple[str, ...] = (), ignore: list[str] | tuple[str, ...] = ()) -> bool:
    """ruff-style selection by code or prefix (`M`, `R4`, `L201`); ignore wins."""
    if select and not any(code.startswith(s.upper()) for s in select):
        return False
    return not any(code.startswith(i.upper()) for i in ignore)


def all_rules() -> dict[str, Rule]:
    """Every registered rule, importing the check modules on first use."""
    from . import checks  # noqa: F401  (registration happens at import)

    return dict(sorted(RULES.items()))
