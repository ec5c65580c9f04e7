"""`rollout-audit watch DIR`: follow a directory a trainer writes into, and audit each new
step once it is complete (a file, or a log directory moved in whole: its trajectory and update
files together): never a writer's temporary file (hidden, or `.tmp`), and only
once its size and modification time held across two polls (a file moved in by an atomic rename
holds at once; one written in place holds when its writer stops, finished or killed).

One line per step; a JSON status file rewritten (atomically) after each step; optionally the
step's figures (`audit/...`, as the TRL guard logs them) as one JSON line, and as scalars in a
TensorBoard event file (step = the step's index)."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..reporting.outputs import append_atomic, write_atomic
from ..reporting.report import Report, incomplete, json_text, printable, verdict, verdict_line
from ..running.report import plural
from .events import EventFile

_DATA = (".parquet", ".jsonl", ".json")


def _is_candidate(p: Path, root: Path) -> bool:
    rel = p.relative_to(root).parts
    return (
        p.suffix in _DATA
        and not any(x.startswith(".") for x in rel)
        and not p.name.endswith(".tmp")
        and not any(x in ("_temporary", "_SUCCESS") for x in rel)
    )


Sig = tuple[int, int, int, int]  # size, mtime (ns), device, inode of one file at one poll


@dataclass
class Watcher:
    """Finds complete new files under `root`; `audit_step(path) -> (Report, figures)` audits one.

    A step is audited again when one of its files changed after its audit (appended to, replaced,
    a file added to a step directory). A file seen and never audited (still growing, empty, or
    left when the watch stops) makes the watch end with exit 2, as does the directory vanishing.
    Symbolic links are never followed out of the directory, nor are non-regular files read: each
    is a step that could not be audited (exit 2)."""

    root: Path
    audit_step: Callable[[Path], tuple[Report, dict]]
    status_path: Path | None = None
    metrics_path: Path | None = None
    events: EventFile | None = None  # the figures as TensorBoard scalars
    ignore: set[Path] = field(default_factory=set)  # our own outputs, when they sit under root
    native: bool = True  # the files are contract logs (not a framework's dumps, converted per step)
    seen: dict[Path, Sig] = field(default_factory=dict)  # each file at the last poll
    done: set[Path] = field(default_factory=set)
    audited: dict[Path, dict[Path, Sig]] = field(default_factory=dict)  # step -> its files as audited
    changed: set[Path] = field(default_factory=set)  # steps that changed after their audit
    refused: set[Path] = field(default_factory=set)  # links out of the directory, non-regular files
    steps: list[dict] = field(default_factory=list)
    updates_alone: list[Path] = field(default_factory=list)  # update files that are not a step
    worst: int = 0
    vanished: bool = False
    by_step: dict[Path, dict[Path, Sig]] = field(default_factory=dict)  # the files of each step at the last poll

    def step_of(self, p: Path) -> Path:
        """The step a file belongs to: a log directory moved in whole (a child of the root that
        holds a `trajectories` folder: its trajectory and update files) is one step; any other
        file is a step of its own."""
        top = p.relative_to(self.root).parts[0]
        return self.root / top if top != p.name and (self.root / top / "trajectories").is_dir() else p

    def _files(self) -> tuple[dict[Path, Sig], list[Path]]:
        """Every candidate file under the root with its signature (links inside the directory
        followed to regular files), and the candidates refused (a link out of the directory, a
        FIFO or device). Directories reached through a link are not entered."""
        found: dict[Path, Sig] = {}
        refused: list[Path] = []
        real_root = os.path.realpath(self.root)
        for d, dirs, names in os.walk(self.root, followlinks=False):
            dirs.sort()
            for name in [*sorted(names), *(x for x in dirs if os.path.islink(os.path.join(d, x)))]:
                p = Path(d) / name
                if p in self.ignore or not _is_candidate(p, self.root):
                    continue
                try:
                    if p.is_symlink():
                        real = os.path.realpath(p)
                        if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
                            refused.append(p)
                            continue
                    st = p.stat()
                except OSError:  # renamed or removed between listing and stat, or a dangling link
                    continue
                if not stat.S_ISREG(st.st_mode):
                    if not stat.S_ISDIR(st.st_mode):
                        refused.append(p)
                    continue
                found[p] = (st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino)
        return found, refused

    def complete_files(self) -> list[Path]:
        """Steps not yet audited (or changed since their audit) whose every file's size and mtime
        held since the last poll and is not empty, in name order."""
        if not self.root.is_dir():
            self.vanished = True
            return []
        found, refused = self._files()
        by_step: dict[Path, dict[Path, Sig]] = {}
        for p, sig in found.items():
            by_step.setdefault(self.step_of(p), {})[p] = sig
        for step, was in list(self.audited.items()):  # a step changed after its audit: audited again
            now = by_step.get(step, {})
            if now and now != was:
                self.done.discard(step)
                del self.audited[step]
                self.changed.add(step)
        held = [
            step
            for step, files in by_step.items()
            if step not in self.done and all(self.seen.get(p) == sig and sig[0] > 0 for p, sig in files.items())
        ]
        self.seen = found
        self.by_step = by_step
        new_refused = [p for p in refused if p not in self.refused]
        self.refused.update(new_refused)
        return sorted(held + new_refused)

    def pending(self) -> list[Path]:
        """Steps seen at the last poll and never audited (still being written, or empty)."""
        return sorted(s for s in self.by_step if s not in self.done)

    def updates_only(self, path: Path) -> bool:
        """`path` is a file of update records and nothing else: in a log whose trajectories/ and
        updates/ the trainer writes a file at a time (the TRL guard does), an update names
        trajectories of several steps, so it is no step of its own (audited alone, it has no
        trajectory to check against); `check` on the directory audits it with them."""
        if not self.native or not path.is_file():
            return False
        from ..reading.io import discover

        try:
            disc = discover([str(path)])
        except Exception:  # noqa: BLE001 - unreadable: the step's audit reports it
            return False
        return bool(disc.of_kind("updates")) and not disc.of_kind("trajectories") and not disc.broken

    def run_step(self, path: Path) -> dict:
        """Audit one complete step (a file, or a log directory); its status entry (also when it
        could not be audited)."""
        name = str(path.relative_to(self.root))
        entry: dict[str, Any]
        again = path in self.changed
        files = dict(self.by_step.get(path, {}))
        if path in self.refused:
            what = "a link out of the watched directory" if path.is_symlink() else "not a regular file"
            entry = {"step": name, "exit_code": 2, "verdict": f"INCOMPLETE: {what}, not read", "figures": {}}
            entry.update(errors=0, warnings=0, codes=[])
        else:
            try:
                rep, figures = self.audit_step(path)
                code = rep.exit_code()
                why = incomplete(rep) + [
                    f"{r['code']} {r['message']}" for r in rep.findings.head(1).iter_rows(named=True)
                ]
                line = named_verdict(rep) + (f" ({why[0]})" if code == 2 and why else "")
                entry = {"step": name, "exit_code": code, "verdict": line, "figures": figures}
                entry["errors"], entry["warnings"] = rep.count("error"), rep.count("warning")
                entry["codes"] = sorted(rep.codes())
            except Exception as e:  # noqa: BLE001 - a step that cannot be read is reported, the watch goes on
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                entry = {"step": name, "exit_code": 2, "verdict": f"INCOMPLETE: {msg}", "figures": {}}
                entry.update(errors=0, warnings=0, codes=[])
        if again:
            entry["verdict"] = f"{entry['verdict']} (changed after its audit: audited again)"
            entry["audited_again"] = True
            self.changed.discard(path)
        entry["verdict"] = printable(entry["verdict"])
        self.done.add(path)
        if path not in self.refused:
            self.audited[path] = files
        self.steps.append(entry)
        self.worst = max(self.worst, entry["exit_code"])
        if self.metrics_path is not None and entry["figures"]:
            line = json_text({"step": name, "index": len(self.steps) - 1, **entry["figures"]}, indent=None)
            append_atomic(self.metrics_path, line + "\n")  # never through a link, never into a FIFO
        if self.events is not None and entry["figures"]:
            self.events.add(len(self.steps) - 1, entry["figures"])
        return entry

    def write_status(self, state: str) -> None:
        """The status file a trainer or scheduler polls: every step so far, the worst exit code, state."""
        if self.status_path is None:
            return
        doc = {
            "directory": str(self.root),
            "state": state,
            "steps_audited": len(self.steps),
            "worst_exit_code": self.worst,
            "steps": self.steps,
            "update_files_not_audited": [str(p.relative_to(self.root)) for p in self.updates_alone],
            "seen_not_audited": [str(p.relative_to(self.root)) for p in self.pending()],
            "directory_vanished": self.vanished,
            "updated": time.time(),
        }
        write_atomic(self.status_path, json_text(doc) + "\n")

    def checked_nothing(self) -> bool:
        """No step was audited (and no update file seen): the watch verified nothing."""
        return not self.steps and not self.updates_alone

    def finish(self, say: Callable[[str], None], *, asked: bool = False) -> int:
        """End the watch: the status file marked stopped, and the exit code: the worst step's, or 2
        when the directory vanished or (unless the stop was `asked` for: --max-steps, --fail-fast)
        a file was seen and never audited (still being written, or empty), or no step was audited."""
        code = self.worst
        if self.vanished:
            say(f"{printable(self.root)}: the watched directory vanished")
            code = 2
        pend = self.pending()
        if pend and not asked:
            names = ", ".join(printable(p.relative_to(self.root)) for p in pend[:10])
            more = f" and {len(pend) - 10} more" if len(pend) > 10 else ""
            say(
                f"{len(pend)} step(s) seen and never audited (still being written, or empty): {names}{more}; "
                "not checked"
            )
            code = 2
        if self.checked_nothing():  # nothing was checked: not a pass (the command line says so)
            code = 2
        self.write_status("stopped")
        return code

    def follow(
        self,
        say: Callable[[str], None],
        *,
        interval: float = 1.0,
        idle: float | None = None,
        fail_fast: bool = False,
        max_steps: int | None = None,
    ) -> int:
        """Poll every `interval` seconds; stop after `idle` seconds without a new complete file,
        after `max_steps` steps, or (`fail_fast`) after the first step that does not pass; at once
        when the directory vanished. Returns `finish`'s exit code."""
        last = time.monotonic()
        self.write_status("watching")
        while True:
            for p in self.complete_files():
                if p not in self.refused and self.updates_only(p):
                    self.done.add(p)
                    self.audited[p] = dict(self.by_step.get(p, {}))
                    self.changed.discard(p)
                    if p in self.updates_alone:
                        continue
                    self.updates_alone.append(p)
                    if len(self.updates_alone) == 1:
                        say(
                            f"{printable(p.relative_to(self.root))}: update records, not a step (an update names "
                            f"trajectories of several steps); `rollout-audit check {printable(self.root)}` audits "
                            "them with their trajectories"
                        )
                    continue
                e = self.run_step(p)
                say(f"{printable(e['step'])}: {e['verdict']}")
                self.write_status("watching")
                last = time.monotonic()
                if (fail_fast and e["exit_code"]) or (max_steps is not None and len(self.steps) >= max_steps):
                    return self.finish(say, asked=True)
            if self.vanished or (idle is not None and time.monotonic() - last > idle):
                return self.finish(say)
            time.sleep(interval)


def named_verdict(rep: Report) -> str:
    """The verdict line with the codes of the errors and warnings it counts:
    'FAIL: 2 errors (M101 ×2), 1 warning (T306), 0 info; …'."""
    line = verdict_line(rep)
    by = rep.summary["by_severity"]
    head = f"{plural(by['error'], 'error')}, {plural(by['warning'], 'warning')}, "
    if not line.startswith(f"{verdict(rep)}: {head}"):
        return line

    def codes(severity: str) -> str:
        n = rep.findings.filter(pl.col("severity") == severity).group_by("code").len().sort("code")
        said = ", ".join(f"{c} ×{k}" if k > 1 else str(c) for c, k in n.iter_rows())
        return f" ({said})" if said else ""

    named = f"{plural(by['error'], 'error')}{codes('error')}, {plural(by['warning'], 'warning')}{codes('warning')}, "
    return f"{verdict(rep)}: {named}{line[len(verdict(rep)) + 2 + len(head) :]}"


def step_auditor(config_file: str | None, root: Path, framework: str | None, context: dict) -> Callable:
    """Audit one step's file as a log of its own (a framework's dump: converted first), through the
    session `check` goes through; its report and its figures."""
    import polars as pl

    from ..reading.io import discover
    from ..reading.log import scan
    from ..session import Request, configure, run
    from .figures import audit_figures, trainable_share

    configure(Request(source=[str(root)], config_file=config_file))  # a refused configuration stops the watch at once

    def audit_step(path: Path) -> tuple[Report, dict]:
        a = run(
            Request(source=[str(path)], framework=framework, context=context, config_file=config_file, log_root=root)
        )
        if a.converted is not None:
            share = trainable_share(pl.from_arrow(a.converted.tables()[0]))  # type: ignore[arg-type]
        else:
            share = (
                trainable_share(scan(str(path)).trajectories) if discover([str(path)]).of_kind("trajectories") else None
            )
        return a.report, audit_figures(a.report, share)

    return audit_step
