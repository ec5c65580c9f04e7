"""`rollout-audit watch DIR`: follow a directory a trainer writes into, and audit each new
step once it is complete (a file, or a log directory moved in whole: its trajectory and update
files together): never a writer's temporary file (hidden, or `.tmp`), and only
once its size and modification time held across two polls (a file moved in by an atomic rename
holds at once; one written in place holds when its writer stops, finished or killed).

One line per step; a JSON status file rewritten (atomically) after each step; optionally the
step's figures (`audit/...`, as the TRL guard logs them) as one JSON line, and as scalars in a
TensorBoard event file (step = the step's index)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..reporting.outputs import append_atomic, write_atomic
from ..reporting.report import Report, incomplete, printable, verdict_line
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


@dataclass
class Watcher:
    """Finds complete new files under `root`; `audit_step(path) -> (Report, figures)` audits one."""

    root: Path
    audit_step: Callable[[Path], tuple[Report, dict]]
    status_path: Path | None = None
    metrics_path: Path | None = None
    events: EventFile | None = None  # the figures as TensorBoard scalars
    ignore: set[Path] = field(default_factory=set)  # our own outputs, when they sit under root
    native: bool = True  # the files are contract logs (not a framework's dumps, converted per step)
    seen: dict[Path, tuple[int, int]] = field(default_factory=dict)  # size, mtime at the last poll
    done: set[Path] = field(default_factory=set)
    steps: list[dict] = field(default_factory=list)
    updates_alone: list[Path] = field(default_factory=list)  # update files that are not a step
    worst: int = 0

    def step_of(self, p: Path) -> Path:
        """The step a file belongs to: a log directory moved in whole (a child of the root that
        holds a `trajectories` folder: its trajectory and update files) is one step; any other
        file is a step of its own."""
        top = p.relative_to(self.root).parts[0]
        return self.root / top if top != p.name and (self.root / top / "trajectories").is_dir() else p

    def complete_files(self) -> list[Path]:
        """Steps not yet audited whose every file's size and mtime held since the last poll, in
        name order."""
        held: dict[Path, bool] = {}
        for p in sorted(self.root.rglob("*")):
            if p in self.ignore or not p.is_file() or not _is_candidate(p, self.root):
                continue
            step = self.step_of(p)
            if step in self.done:
                continue
            try:
                st = p.stat()
            except OSError:  # renamed or removed between listing and stat
                continue
            now = (st.st_size, st.st_mtime_ns)
            held[step] = held.get(step, True) and self.seen.get(p) == now and st.st_size > 0
            self.seen[p] = now
        return [step for step, ok in held.items() if ok]

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
        try:
            rep, figures = self.audit_step(path)
            code = rep.exit_code()
            why = incomplete(rep) + [f"{r['code']} {r['message']}" for r in rep.findings.head(1).iter_rows(named=True)]
            line = verdict_line(rep) + (f" ({printable(why[0])})" if code == 2 and why else "")
            entry = {"step": name, "exit_code": code, "verdict": line, "figures": figures}
            entry["errors"], entry["warnings"] = rep.count("error"), rep.count("warning")
            entry["codes"] = sorted(rep.codes())
        except Exception as e:  # noqa: BLE001 - a step that cannot be read is reported, the watch goes on
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            entry = {"step": name, "exit_code": 2, "verdict": f"INCOMPLETE: {msg}", "figures": {}}
            entry.update(errors=0, warnings=0, codes=[])
        self.done.add(path)
        self.steps.append(entry)
        self.worst = max(self.worst, entry["exit_code"])
        if self.metrics_path is not None and entry["figures"]:
            line = json.dumps({"step": name, "index": len(self.steps) - 1, **entry["figures"]})
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
            "updated": time.time(),
        }
        write_atomic(self.status_path, json.dumps(doc, indent=1, default=str) + "\n")

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
        after `max_steps` steps, or (`fail_fast`) after the first step that does not pass.
        Returns the worst exit code of the steps (0 when none was audited)."""
        last = time.monotonic()
        self.write_status("watching")
        while True:
            for p in self.complete_files():
                if self.updates_only(p):
                    self.done.add(p)
                    self.updates_alone.append(p)
                    if len(self.updates_alone) == 1:
                        say(
                            f"{p.relative_to(self.root)}: update records, not a step (an update names trajectories "
                            f"of several steps); `rollout-audit check {self.root}` audits them with their trajectories"
                        )
                    continue
                e = self.run_step(p)
                say(f"{e['step']}: {e['verdict']}")
                self.write_status("watching")
                last = time.monotonic()
                if (fail_fast and e["exit_code"]) or (max_steps is not None and len(self.steps) >= max_steps):
                    self.write_status("stopped")
                    return self.worst
            if idle is not None and time.monotonic() - last > idle:
                self.write_status("stopped")
                return self.worst
            time.sleep(interval)


def step_auditor(config_path: str | None, root: Path, framework: str | None, context: dict) -> Callable:
    """Audit one step's file as a log of its own (a framework's dump: converted first), through the
    session `check` goes through; its report and its figures."""
    import polars as pl

    from ..reading.io import discover
    from ..reading.log import scan
    from ..session import Request, configure, run
    from .figures import audit_figures, trainable_share

    configure(Request(source=[str(root)], config_file=config_path))  # a refused configuration stops the watch at once

    def audit_step(path: Path) -> tuple[Report, dict]:
        a = run(
            Request(source=[str(path)], framework=framework, context=context, config_file=config_path, log_root=root)
        )
        if a.converted is not None:
            share = trainable_share(pl.from_arrow(a.converted.tables()[0]))  # type: ignore[arg-type]
        else:
            share = (
                trainable_share(scan(str(path)).trajectories) if discover([str(path)]).of_kind("trajectories") else None
            )
        return a.report, audit_figures(a.report, share)

    return audit_step
