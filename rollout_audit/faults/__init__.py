"""Named faults: each turns a compliant log into a broken one, the way a real pipeline bug
would (the lessons from “Success, termination, truncation, and infrastructure failure” to “A
training environment is stricter than a demo environment”), and declares the codes the audit
must raise.

A fault takes the log as records (lists of dicts, see `Records`), mutates a deep copy and
returns the trajectory ids it touched. Mutations stay consistent where the real bug would
be: a pipeline that trains on tool tokens also counts them in num_trainable_tokens and in
its loss denominator, so the provenance check, not a bookkeeping check, has to catch it.
Each fault lives in the module named for the check family it targets (`faults/masks.py` for
the M checks) and is registered with `@fault` (`faults/base.py`).

    broken, touched = apply("tool_tokens_trained", trajs, updates)
"""

from __future__ import annotations

import copy
import importlib
import json
from dataclasses import dataclass

from ..contract.config import Config
from .base import FAULTS, Ctx, Fault, NoTarget, Records, fault

# the family modules register their faults at import, in the order the catalogue lists families
for _family in ("structure", "masks", "logprobs", "termination", "rewards", "versions", "updates", "environment"):
    importlib.import_module(f".{_family}", __name__)


__all__ = [
    "FAULTS",
    "Fault",
    "MatrixRow",
    "NoTarget",
    "Records",
    "apply",
    "declared_components",
    "detect",
    "fault",
    "groups",
    "read_records",
    "render_matrix",
    "settings_toml",
    "write_fault_log",
    "write_records",
]


def groups() -> tuple[tuple[str, ...], ...]:
    """The faults by their declared `group`, groups and members in registration order."""
    out: dict[str, list[str]] = {}
    for name, f in FAULTS.items():
        out.setdefault(f.group, []).append(name)
    return tuple(tuple(g) for g in out.values())


def apply(name: str, trajs: list[dict], updates: list[dict], seed: int = 0) -> tuple[Records, list[str]]:
    """Apply fault `name` to a deep copy of (trajs, updates): ((trajs, updates), touched ids).

    NoTarget, naming the fault, when the log has nothing it can break: the fault's own word, or
    what it failed on while looking (a trajectory without the turn, field or update it needs)."""
    if name not in FAULTS:
        raise KeyError(f"unknown fault {name!r}; see `rollout-audit faults --list`")
    ctx = Ctx(copy.deepcopy(trajs), copy.deepcopy(updates), seed)
    try:
        touched = FAULTS[name].func(ctx)
    except NoTarget as e:
        raise NoTarget(f"fault {name} finds no target: {e}") from None
    except (IndexError, KeyError, StopIteration, TypeError, ValueError) as e:
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise NoTarget(f"fault {name} finds no target: it failed looking for one ({why})") from e
    return (ctx.trajs, ctx.updates), touched


def read_records(path) -> Records:
    """Every trajectory and update record of a log, as dicts (for small logs: fixtures, tests)."""
    import pyarrow.parquet as pq

    from ..reading.io import discover

    disc = discover([path])
    if disc.broken:
        raise ValueError(f"cannot read {disc.broken[0][0]}: {disc.broken[0][1]}")
    out = []
    for kind in ("trajectories", "updates"):
        rows: list[dict] = []
        for f in disc.of_kind(kind):
            rows += pq.read_table(f.path).to_pylist()
        out.append(rows)
    return out[0], out[1]


def declared_components(path) -> dict[str, str]:
    """The reward components the trajectory files under `path` declare (file metadata)."""
    from ..contract import schema as S
    from ..reading.io import discover

    out: dict[str, str] = {}
    for f in discover([path]).of_kind("trajectories"):
        out.update(S.reward_components(f.schema.metadata))
    return out


def write_records(
    dst,
    trajs: list[dict],
    updates: list[dict],
    *,
    parts: int = 1,
    corrupt: bool = False,
    tokenizer=None,
    reward_components: dict[str, str] | None = None,
) -> None:
    """Write records as a log under `dst` (trajectories/…, updates/…), without validation so
    that broken records reach the file; `corrupt` truncates the first shard's footer; `tokenizer`
    and `reward_components` are the producer's declarations written into each trajectory file.
    A key of the trajectory records the contract does not define (a trainer's second per-token
    log-prob column, `compare_logprobs`) is written beside the contract columns as it is."""
    from pathlib import Path

    import pyarrow as pa

    from ..contract.schema import columns
    from ..reading.records import records_to_table
    from ..writing import RolloutWriter, write_table

    dst = Path(dst)
    known = {c.name for c in columns("trajectories")}
    size = -(-len(trajs) // parts)
    for i in range(parts):
        chunk = trajs[i * size : (i + 1) * size]
        if chunk:
            sub = dst / "trajectories" / (f"step={i}" if parts > 1 else "")
            path = sub / f"part-{i:04d}.parquet"
            extra = sorted({k for t in chunk for k in t} - known)
            if extra:
                table = records_to_table([{k: v for k, v in t.items() if k in known} for t in chunk])
                for name in extra:
                    table = table.append_column(name, pa.array([t.get(name) for t in chunk]))
                sub.mkdir(parents=True, exist_ok=True)
                write_table(
                    path,
                    table,
                    "trajectories",
                    validate=False,
                    tokenizer=tokenizer,
                    reward_components=reward_components,
                )
                continue
            with RolloutWriter(path, validate=False, tokenizer=tokenizer, reward_components=reward_components) as w:
                w.write(chunk)
    if updates:
        with RolloutWriter(dst / "updates" / "updates.parquet", kind="updates", validate=False) as w:
            w.write(updates)
    if corrupt:
        shard = sorted((dst / "trajectories").rglob("*.parquet"))[0]
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2])


def settings_toml(settings: dict) -> str:
    """A `[tool.rollout-audit]` table stating `settings`."""
    return "[tool.rollout-audit]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in sorted(settings.items()))


def write_fault_log(dst, f: Fault, trajs: list[dict], updates: list[dict], *, parts: int = 1, **declared) -> None:
    """The log fault `f` broke, written under `dst` with the producer's declarations (`declared`:
    `tokenizer`, `reward_components`) and, in its own pyproject.toml, how the broken run was
    produced (`f.config`), found there by a plain `check` of the log as a real trainer's would be.
    What the user alone states (`f.user_config`) is never written inside the log."""
    from pathlib import Path

    write_records(dst, trajs, updates, parts=parts, corrupt=f.file_level, **declared)
    if f.config:
        (Path(dst) / "pyproject.toml").write_text(settings_toml(f.config))


@dataclass
class MatrixRow:
    """What the audit found for one fault."""

    fault: str
    expected: frozenset[str]
    found: frozenset[str]  # error and warning codes found
    touched: list[str]
    named: bool  # every touched trajectory is named by an expected finding

    @property
    def missed(self) -> frozenset[str]:
        return self.expected - self.found

    @property
    def unexpected(self) -> frozenset[str]:
        return self.found - self.expected

    @property
    def ok(self) -> bool:
        return not self.missed and not self.unexpected and self.named

    def problem(self) -> str | None:
        """What is wrong with this row, naming the fault and every check involved; None when it is ok."""
        said = []
        if self.missed:
            said.append(f"fault {self.fault} is not caught by {', '.join(sorted(self.missed))}")
        for code in sorted(self.unexpected):
            said.append(
                f"check {code} fires on the log of fault {self.fault}, which expects only "
                f"{', '.join(sorted(self.expected))}: either {code} reports a false positive (fix the check) "
                f"or {self.fault} breaks more than it declares (fix the fault, or add {code} to its codes)"
            )
        if not self.missed and not self.named:
            said.append(f"fault {self.fault}: touched {self.touched} not named by an expected finding")
        return "; ".join(said) or None


def matrix_config(config: dict) -> Config:
    """The user's configuration a fault's log is audited with wherever faults are detected: the
    settings given (a broken log's `user_config`, or every setting of an audit made in code) with
    the checks in preview on, so that a preview check is held to its own fault and is seen when it
    fires on another fault's log (a false positive the matrix must stop)."""
    return Config.from_mapping({"preview": True, **config})


def detect(name: str, trajs: list[dict], updates: list[dict], workdir, *, seed: int = 0, parts: int = 1) -> MatrixRow:
    """Apply one fault, write the broken log under `workdir` (its own configuration inside it, as
    the fixture's), audit it with the user's settings the fault names, compare codes."""
    import polars as pl

    from ..api import audit

    f = FAULTS[name]
    (bt, bu), touched = apply(name, trajs, updates, seed)
    out = f"{workdir}/{name}"
    write_fault_log(out, f, bt, bu, parts=parts, reward_components=f.declares)
    rep = audit(out, config=matrix_config(f.user_config))
    serious = rep.findings.filter(pl.col("severity").is_in(["error", "warning"]))
    found = frozenset(serious["code"].to_list())
    hit = set(serious.filter(pl.col("code").is_in(list(f.codes)))["trajectory_id"].drop_nulls().to_list())
    return MatrixRow(name, f.codes, found, touched, set(touched) <= hit)


def render_matrix(rows: list[MatrixRow]) -> str:
    """A Markdown table: fault, expected codes, found codes, caught, false positives."""
    lines = [
        "| fault | expected | found (error/warning) | caught | trajectories named | false positives |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.fault} | {', '.join(sorted(r.expected))} | {', '.join(sorted(r.found)) or '-'} | "
            f"{'yes' if not r.missed else 'MISSED ' + ', '.join(sorted(r.missed))} | "
            f"{'yes' if r.named else 'no'} | {', '.join(sorted(r.unexpected)) or '-'} |"
        )
    caught = sum(not r.missed for r in rows)
    fp = sum(bool(r.unexpected) for r in rows)
    lines.append(f"\n{caught}/{len(rows)} faults caught, {fp} with false positives")
    return "\n".join(lines)
