"""The check catalogue as a table of rules: each check is one decorated function.

A rule's docstring is its explanation (`rollout-audit explain CODE`): the rule, the lesson it
restates, and what to fix. A rule declares everything it reads, and the engine derives its
whole plan (what to read, what the per-trajectory summary keeps, what is not run) from these
declarations alone:

- `requires`: inputs that must be present, else the check is listed as not run with the reason;
- `optional`: inputs read when present;
- `config`: configuration keys read;
- `partition`: for a log check whose findings on a log are the union of its findings on the
  partitions of the log by these columns (the distributed engine runs it one task per partition);
  `BY_UPDATE` partitions the update records instead, each part with the summary rows of the
  trajectories its records name (and, for a segment of a split episode, the episode's last one);
- `merge`: for a partitioned check that writes statistics, how the partitions' statistics make
  the log's, whether the check ran, and its findings (`Merge`); without it, the findings are the
  partitions' and the check did not run when no partition ran it;
- `nulls`: required columns whose null values this check reports (S001 leaves them to it);
- `declare`: a hook that derives configuration from a file's metadata (`Declare`), called by
  the runner for every file it reads.

Input names: `col` (trajectory column), `turns.field` (turn struct field), `updates` /
`updates.col` (update records), and for log checks the derived per-trajectory values of the
summary (`n_trainable`, `pv_min`, ...: see `SUMMARY_INPUTS` in `rollout_audit/frames/batch.py`,
and `derived` there for a value one family computes itself). A check is handed a view that
holds only what it declared: reading anything else raises `UndeclaredInput`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .config import Config

from .errors import NotRun, UndeclaredInput, Unmet

__all__ = [
    "BY_UPDATE",
    "FAMILIES",
    "RULES",
    "NotRun",
    "Rule",
    "UndeclaredInput",
    "Unmet",
    "registered",
    "rule",
    "selected",
]

Severity = Literal["error", "warning", "info"]
Scope = Literal["batch", "log"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
# (configuration so far, file metadata, keys the user's configuration set) -> configuration updates
Declare = Callable[["Config", "dict[bytes, bytes] | None", frozenset[str]], dict[str, Any]]
# (the statistics each partition wrote, None where it wrote none; why each partition did not run
# the check, None where it ran; the partitions' findings, None for none) -> (the log's statistics,
# None for none; why the check did not run on the log, None when it ran; the log's findings)
Merge = Callable[[list[Any], list["str | None"], Any], tuple[Any, "str | None", Any]]
BY_UPDATE = ("updates",)  # `partition=`: by update record (see the module's docstring)


@dataclass(frozen=True)
class Rule:
    """One check: a stable code, a severity, what it reads, and the function that runs it."""

    code: str
    name: str
    severity: Severity
    scope: Scope
    requires: tuple[str, ...]
    optional: tuple[str, ...]
    config: tuple[str, ...]
    func: Callable[..., Any]
    partition: tuple[str, ...] = ()
    nulls: tuple[str, ...] = ()
    declare: Declare | None = None
    merge: Merge | None = None
    preview: bool = False  # runs only under `--preview` until it has passed every compliant fixture

    @property
    def reads(self) -> tuple[str, ...]:
        """Every data input the rule declares (required first)."""
        return self.requires + tuple(q for q in self.optional if q not in self.requires)

    @property
    def explanation(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or self.name)

    @property
    def summary(self) -> str:
        return self.explanation.splitlines()[0]

    @property
    def family(self) -> str:
        return self.code[0]


RULES: dict[str, Rule] = {}
# Check families: the first letter of a code, in the order the docs and `explain --list` show them.
FAMILIES = {
    "S": "Structure: the log can be read as the contract describes",
    "T": "Termination: why the episode stopped, and what that allows",
    "M": "Masks and provenance: who generated each token, what the trainer learns from",
    "L": "Log-probabilities: the behaviour log-probs every importance ratio is built on",
    "R": "Rewards and credit: turn rewards, shaping, TD residuals and returns",
    "E": "Environment: which environment, verifier and initial state each episode ran against",
    "G": "Groups and difficulty: how much relative signal the groups carry",
    "P": "Policy versions: which weights sampled each turn, and how stale the data is",
    "U": "Updates and reduction: what each optimizer update claims about its batch",
}


def rule(
    code: str,
    name: str,
    severity: Severity = "error",
    *,
    requires: tuple[str, ...] = (),
    optional: tuple[str, ...] = (),
    config: tuple[str, ...] = (),
    scope: Scope = "batch",
    partition: tuple[str, ...] = (),
    nulls: tuple[str, ...] = (),
    declare: Declare | None = None,
    merge: Merge | None = None,
    preview: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a check function under `code`.

    A `batch` check gets a view of one row-group slice of trajectories and the config; a `log`
    check gets a view of the per-trajectory summary of the whole log and the update records.
    Both return a polars DataFrame with any of the columns trajectory_id, turn, position,
    message (and file, for log checks), or None when nothing is wrong; an empty frame counts
    as None. A batch may hold no rows (every row of a slice set aside by the reader), and the
    check is still called: the slice's schema problems are S001's to report.

    `preview=True`: the check runs only when the user asks for preview checks (`--preview`, or
    `preview = true` in their configuration), as a new ruff rule does, until it has audited every
    framework's compliant fixture clean; then the flag is removed and it reaches every user.
    """
    if partition and scope != "log":
        raise ValueError(f"{code}: partition= applies to log checks")

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        if code in RULES:
            raise ValueError(f"check code {code} registered twice")
        RULES[code] = Rule(
            code,
            name,
            severity,
            scope,
            tuple(requires),
            tuple(optional),
            tuple(config),
            func,
            tuple(partition),
            tuple(nulls),
            declare,
            merge,
            preview,
        )
        return func

    return deco


def selected(code: str, select: list[str] | tuple[str, ...] = (), ignore: list[str] | tuple[str, ...] = ()) -> bool:
    """ruff-style selection by code or prefix (`M`, `R4`, `L201`); ignore wins."""
    if select and not any(code.startswith(s.upper()) for s in select):
        return False
    return not any(code.startswith(i.upper()) for i in ignore)


def registered() -> dict[str, Rule]:
    """The rules registered so far, by code (the full catalogue: `checks.all_rules`)."""
    return dict(sorted(RULES.items()))
