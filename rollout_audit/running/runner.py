"""Running checks: each through a view of what it declared, with exact bookkeeping of where
it ran, where it could not (and why), and where it crashed.

The engine (whole logs) and the writer (one batch before it is written) both run checks
through a `Runner`, so they agree on what a check sees and on what "ran" means.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np
import polars as pl

from ..checks import all_rules
from ..contract import schema as S
from ..contract.config import Config, ConfigError
from ..contract.registry import NotRun, Rule, Unmet, selected
from ..frames.batch import SUMMARY_INPUTS, TOKEN_LISTS, Batch, contract_names
from ..frames.views import BatchView, ConfigView, LogCheckView, LogView
from ..reading.io import one_line
from ..reading.read import Part
from .concurrency import spread

R = TypeVar("R")

FINDING_SCHEMA: dict[str, Any] = {
    "code": pl.String,
    "severity": pl.String,
    "message": pl.String,
    "file": pl.String,
    "trajectory_id": pl.String,
    "turn": pl.Int64,
    "position": pl.Int64,
}
_RAISE = bool(os.environ.get("ROLLOUT_AUDIT_RAISE"))  # developers: re-raise a crashing check with its traceback
MAX_CRASHES_KEPT = 5  # per check; the count is always exact


@dataclass
class Crash:
    """A check that raised: where, and the exception's one-line summary."""

    code: str
    error: str
    file: str | None
    rows: str | None  # "first-last" rows of the batch in its file, for batch checks

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "error": self.error, "file": self.file, "rows": self.rows}


@dataclass
class Coverage:
    """Trajectory rows a check ran on, and the rows it could not run on, by reason."""

    ran: int = 0
    lacking: dict[str, int] = field(default_factory=dict)
    calls: int = 0  # times the check function was called and returned

    def lack(self, why: str, rows: int) -> None:
        self.lacking[why] = self.lacking.get(why, 0) + rows


def normalise(df: pl.DataFrame | None, rule: Rule, file: str | None) -> pl.DataFrame | None:
    """A check's output in the finding schema, with its code and severity."""
    if df is None or df.height == 0:
        return None
    exprs = []
    for name, dtype in FINDING_SCHEMA.items():
        if name == "code":
            exprs.append(pl.lit(rule.code).alias(name))
        elif name == "severity":
            exprs.append(pl.lit(rule.severity).alias(name))
        elif name == "file" and "file" not in df.columns:
            exprs.append(pl.lit(file, dtype=pl.String).alias(name))
        elif name in df.columns:
            exprs.append(pl.col(name).cast(dtype))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return df.select(exprs)


def _data_inputs(rule: Rule) -> list[str]:
    """A rule's data inputs at the level a file has them: derived values map to their bases."""
    out: list[str] = []
    for q in rule.requires:
        for base in SUMMARY_INPUTS.get(q, (q,)):
            if base not in out:
                out.append(base)
    return out


def _absent(missing: list[str], declared: dict[str, str] | None = None) -> str:
    if "updates" in missing:
        return "the log has no update records"
    said = list(dict.fromkeys((declared or {})[q] for q in missing if q in (declared or {})))
    if said:  # the producer declared why (file metadata `rollout_log.not_recorded`)
        return "; ".join(said)
    named = contract_names(missing)
    return f"{'column' if len(named) == 1 else 'columns'} {', '.join(named)} absent"


def _codes(what: str, codes: Sequence[str] | None, pool: dict[str, Rule]) -> list[str]:
    """`codes` checked against the catalogue: a string (not a list), an empty prefix or a code that
    matches no check would silently select or skip the wrong checks, so each is a ConfigError."""
    if isinstance(codes, str):
        raise ConfigError(f"{what}: a list of codes, not the string {codes!r} (write [{codes!r}])")
    out = []
    for c in codes or []:
        if not isinstance(c, str) or not c.strip():
            raise ConfigError(f"{what}: {c!r} is not a check code or prefix (an empty one matches every check)")
        if not any(k.startswith(c.strip().upper()) for k in pool):
            raise ConfigError(f"{what}: unknown check code or prefix {c!r}; see `rollout-audit explain --list`")
        out.append(c.strip())
    return out


class Runner:
    """The selected rules of one audit, and what happened when each one ran.

    `apply_batch` and `apply_log` are safe to call from several threads at once.
    """

    def __init__(
        self,
        cfg: Config,
        select: Sequence[str] | None = None,
        ignore: Sequence[str] | None = None,
        rules: dict[str, Rule] | None = None,
    ) -> None:
        self.cfg = cfg
        pool = all_rules() if rules is None else rules
        sel = _codes("select", select, pool) or _codes(f"{cfg.source}: select", cfg.select, pool)
        ign = _codes("ignore", ignore, pool) + _codes(f"{cfg.source}: ignore", cfg.ignore, pool)
        chosen = {c: r for c, r in pool.items() if selected(c, sel, ign)}
        # a check in preview runs only when the user asks for preview checks
        self.preview_skipped = sorted(c for c, r in chosen.items() if r.preview and not cfg.preview)
        self.rules = {c: r for c, r in chosen.items() if c not in self.preview_skipped}
        named = {s.upper() for s in sel}
        # checks the user named by their full code: one that cannot run makes the audit incomplete
        self.named = sorted(c for c in self.rules if c in named)
        self.unmet: dict[str, str] = {  # code -> why something the user asked for did not happen
            c: "a check in preview: run with --preview (or preview = true in your configuration)"
            for c in self.preview_skipped
            if c in named
        }
        self.findings: list[pl.DataFrame] = []
        self.coverage: dict[str, Coverage] = {c: Coverage() for c in self.rules}
        self.reasons: dict[str, set[str]] = {c: set() for c in self.rules}  # NotRun and absence reasons
        self.crashes: list[Crash] = []
        self.crash_counts: dict[str, int] = {}
        self.file_inputs: dict[str, tuple[frozenset[str], int]] = {}  # file -> (inputs it has, rows)
        self.declared: dict[str, str] = {}  # input -> why the producer's framework does not record it
        self._configured = cfg.users_keys()  # keys the user's configuration set (never the log's own)
        self._lock = threading.Lock()
        self._cost: dict[str, float] = {}  # seconds each batch task took last (a scheduling hint only)

    @property
    def batch_rules(self) -> list[Rule]:
        return [r for r in self.rules.values() if r.scope == "batch"]

    @property
    def log_rules(self) -> list[Rule]:
        return [r for r in self.rules.values() if r.scope == "log"]

    # ------------------------------------------------------------ running
    def _call(
        self, rule: Rule, view: Any, file: str | None, rows: str | None, attribute: Any = None
    ) -> tuple[bool, str | None]:
        """Call the check; (returned normally, NotRun reason). Crashes are recorded, never raised,
        except KeyboardInterrupt and SystemExit. `attribute` fills in each finding's own file."""
        try:
            out = rule.func(view, ConfigView(self.cfg, rule))
        except NotRun as e:
            if isinstance(e, Unmet):
                with self._lock:
                    self.unmet.setdefault(rule.code, str(e))
            return False, str(e)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            if _RAISE:
                raise
            with self._lock:
                n = self.crash_counts.get(rule.code, 0)
                self.crash_counts[rule.code] = n + 1
                if n < MAX_CRASHES_KEPT:
                    self.crashes.append(Crash(rule.code, one_line(e), file, rows))
            return False, None
        norm = normalise(out, rule, file)
        if norm is not None and attribute is not None:
            norm = attribute(norm)
        if norm is not None:
            with self._lock:
                self.findings.append(norm)
        return True, None

    def declare(self, meta: dict[bytes, bytes] | None, believed: frozenset[str]) -> None:
        """Take a file's declarations: what its producer does not record (with the reasons; of the
        required columns only those `believed`, see `reading.read.believed`), and
        the configuration the selected rules derive from its metadata (`Rule.declare`)."""
        with self._lock:
            self.declared.update(S.not_recorded(meta, believed))
            for r in self.rules.values():
                if r.declare is not None:
                    update = r.declare(self.cfg, meta, self._configured)
                    if update:
                        self.cfg = self.cfg.model_copy(update=update)

    def check_batch(self, part: Part, p: Plan, pool: Executor | None = None, helpers: int = 1) -> Checked:
        """Every batch rule on one part of the log (read by `reading.batches`): the per-batch
        step of every executor. Returns the rows and tokens read and, when log rules are
        selected, the part's per-trajectory summary; the batch's buffers are released.

        With a `pool`, the rules (and the summary) run on this thread and `helpers` of the pool's
        threads at once, the longest in the last batch first; what each records is the same, and
        the report orders findings and crashes whichever finished first."""
        b = Batch(part.table, part.file, part.first_row, part.problems, p.turn_fields, part.sources)
        self.note_batch(b)
        summarise = any(r.scope == "log" for r in self.rules.values())
        tasks: list[tuple[str, Callable[[], Any]]] = [
            (r.code, partial(self.apply_batch, r, b)) for r in self.batch_rules
        ]
        if summarise:
            tasks.append(("summary", partial(b.summary, p.summary)))
        if pool is not None:
            tasks.sort(key=lambda t: -self._cost.get(t[0], 0.0))
        out = spread([partial(self._timed, code, task) for code, task in tasks], pool, helpers)
        k = int(np.clip(b.lengths["token_source"], 0, None).sum()) if "token_source" in b.columns else 0
        n = b.n
        summary = next((o for (code, _), o in zip(tasks, out) if code == "summary"), None)
        b.release()
        return Checked(n, k, summary)

    def _timed(self, code: str, task: Callable[[], R]) -> R:
        """`task()`, remembering how long it took (the order `check_batch` runs tasks in on a pool)."""
        start = time.perf_counter()
        try:
            return task()
        finally:
            self._cost[code] = time.perf_counter() - start

    def check_log(
        self,
        view: LogView,
        *,
        unusable: bool,
        swap: dict[str, tuple[Rule, LogView]] | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        """Every log rule on the log's summary `view`. Rules that read the same inputs share
        cached frames and run one after the other; the frames are dropped (then `release`
        called) after the last of them, so the log phase holds one set at a time. When no
        trajectory was read (`unusable`) and no file was unreadable, only rules that require
        nothing run (not one U605 per batch member). `swap` runs a rule as another rule on
        another view (an executor that ran it elsewhere hands back its outcome)."""
        swap = swap or {}
        rules = self.log_rules
        first = {frozenset(r.reads): i for i, r in reversed(list(enumerate(rules)))}
        rules = sorted(rules, key=lambda r: first[frozenset(r.reads)])
        last_reader = {frozenset(r.reads): i for i, r in enumerate(rules)}
        for i, r in enumerate(rules):
            if not unusable or view.broken or not r.requires:
                rule, on = swap.get(r.code, (r, view))
                self.apply_log(rule, on)
            if last_reader[frozenset(r.reads)] == i:
                view.cache.pop(frozenset(r.reads), None)
                if release is not None:
                    release()

    def note_batch(self, b: Batch) -> None:
        """Remember which inputs this batch's file has (for the coverage of log checks)."""
        have = frozenset(b.columns) | {f"turns.{f}" for f in b.turn_fields}
        with self._lock:
            for file, _, n in b.sources or [(b.file, b.first_row, b.n)]:
                old = self.file_inputs.get(file)
                self.file_inputs[file] = (have, (old[1] if old else 0) + n)

    def apply_batch(self, rule: Rule, b: Batch) -> None:
        """Run one batch rule on one batch and account for every row."""
        cov = self.coverage[rule.code]
        missing = [q for q in rule.requires if not b.has(q)]
        if missing:
            with self._lock:
                cov.lack(_absent(missing, self.declared), b.n)
            return
        view = BatchView(b, rule)
        rows = f"{b.first_row}-{b.first_row + b.n - 1}" if b.n and b.sources is None else None
        done, why = self._call(rule, view, b.where, rows, b.attribute)
        lacking: dict[str, int] = {}
        ran = b.n
        if done and view.used_tokens:
            ok = b.tokens(view.lists).ok
            ran = int(ok.sum())
            if ran < b.n:
                lacking = _why_rows_lack(b, view.lists, ok)
        with self._lock:
            if why is not None:
                cov.lack(why, b.n)
                self.reasons[rule.code].add(why)
            elif done:
                cov.ran += ran
                cov.calls += 1
                for k, v in lacking.items():
                    cov.lack(k, v)

    def _log_has(self, log: LogView, req: str) -> bool:
        """Update inputs from the update records; trajectory inputs when some file has them."""
        if req.startswith("updates"):
            return log.has(req)
        bases = SUMMARY_INPUTS.get(req, (req,))
        return any(all(b in have for b in bases) for have, _ in self.file_inputs.values())

    def apply_log(self, rule: Rule, log: LogView) -> None:
        """Run one log rule on the whole log."""
        cov = self.coverage[rule.code]
        missing = [q for q in rule.requires if not self._log_has(log, q)]
        total = log.height
        if missing:
            no_updates = log.updates is None and any(q.startswith("updates") for q in missing)
            cov.lack(_absent(["updates"] if no_updates else missing, self.declared), max(total, 1))
            return
        done, why = self._call(rule, LogCheckView(log, rule), None, None)
        if why is not None:
            cov.lack(why, max(total, 1))
            self.reasons[rule.code].add(why)
            return
        if not done:
            return
        cov.calls += 1
        need = [q for q in _data_inputs(rule) if not q.startswith("updates")]
        lacking = 0
        for have, n in self.file_inputs.values():
            gone = [q for q in need if q not in have]
            if gone:
                cov.lack(f"lack {', '.join(gone)}", n)
                lacking += n
        cov.ran += max(total - lacking, 0) if total else 1

    # ------------------------------------------------------------ results
    def not_run(self) -> dict[str, str]:
        """Checks that ran nowhere, with the reason."""
        out = {}
        for code, cov in self.coverage.items():
            if code in self.crash_counts or cov.ran:
                continue
            why = "; ".join(sorted(cov.lacking)) if cov.lacking else "no input reached this check"
            out[code] = why
        return out

    def unfulfilled(self) -> dict[str, str]:
        """What the user asked for that did not happen: a check named by its full code that did not
        run, or a request (replay) that failed, with the reason."""
        out = dict(self.unmet)
        for code, why in self.not_run().items():
            if code in self.named:
                out.setdefault(code, f"selected by its code and not run: {why}")
        return out

    def partial(self, rows: int) -> dict[str, str]:
        """Checks that ran on some trajectories and not others: 'ran on 812 of 1000 …'."""
        out = {}
        for code, cov in self.coverage.items():
            if not cov.ran or not cov.lacking or code in self.crash_counts:
                continue
            rule = self.rules[code]
            total = rows if rule.scope == "batch" else cov.ran + sum(cov.lacking.values())
            lack = "; ".join(f"{n} {why}" for why, n in sorted(cov.lacking.items(), key=lambda kv: -kv[1]))
            out[code] = f"ran on {cov.ran} of {total} trajectories; {lack}"
        return out

    def findings_frame(self) -> pl.DataFrame:
        return pl.concat(self.findings) if self.findings else pl.DataFrame(schema=FINDING_SCHEMA)


@dataclass(frozen=True)
class Checked:
    """What one batch step hands on: rows and tokens read, and the part's summary for log rules."""

    rows: int
    tokens: int
    summary: pl.DataFrame | None


@dataclass(frozen=True)
class Plan:
    """What to read, derived from the selected rules' declarations alone."""

    columns: tuple[str, ...]  # trajectory columns to read
    turn_fields: frozenset[str]  # turn fields converted into the per-turn frame
    summary: frozenset[str]  # per-trajectory summary kept for log checks


def plan(runner: Runner) -> Plan:
    """The columns, turn fields and summary columns the selected rules declare."""
    cols: set[str] = {"trajectory_id"}
    fields: set[str] = set()
    summary: set[str] = set()

    def need(q: str) -> None:
        if q.startswith("updates"):
            return
        if q.startswith("turns."):
            cols.add("turns")
            fields.add(q[6:])
        elif q in SUMMARY_INPUTS:
            for base in SUMMARY_INPUTS[q]:
                need(base)
        else:
            cols.add(q)

    for r in runner.rules.values():
        for q in r.reads:
            need(q)
            if r.scope == "log" and not q.startswith("updates"):
                summary.add(q)
    order = [c.name for c in S.columns("trajectories")]
    return Plan(tuple(c for c in order if c in cols), frozenset(fields), frozenset(summary))


def _why_rows_lack(b: Batch, lists: frozenset[str], ok: Any) -> dict[str, int]:
    """Per reason, how many rows of `b` lie outside `ok` (a declared list null, or lists of
    different lengths)."""
    out: dict[str, int] = {}
    nulls = None
    for c in TOKEN_LISTS:
        if c in lists:
            isnull = b.lengths[c] < 0
            k = int((isnull & ~ok).sum())
            if k:
                out[f"lack {c} (null)"] = k
            nulls = isnull if nulls is None else nulls | isnull
    mismatched = int((~ok).sum()) - (int((nulls & ~ok).sum()) if nulls is not None else 0)
    if mismatched:
        out["have token lists of different lengths (S003)"] = mismatched
    return out


def check_table(runner: Runner, b: Batch) -> None:
    """Every selected rule on one batch that is the whole log (the writer's validation)."""
    runner.note_batch(b)
    for r in runner.batch_rules:
        runner.apply_batch(r, b)
    log = LogView(b.summary(plan(runner).summary), None, [])
    for r in runner.log_rules:
        runner.apply_log(r, log)
