"""What an audit of a trainer's dump adds around the checks: the trainer's settings merged into the
configuration, the trainer settings as a table a converted log carries, the converted tables as a log
held in memory, and the findings of that log relabelled to the dump's own records."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import polars as pl

from ..contract.config import LOG_CONTEXT, Config
from ..contract.schema import IDENTITY, USER_WAIVED, not_recorded, waivable_names
from ..reading.io import Discovery
from ..reading.read import MEMORY
from ..running.engine import memory_discovery
from ..running.report import Report

if TYPE_CHECKING:
    from ..adapters.convert import Converted


def merged_trainer_settings(cfg: Config, conv: Converted) -> Config:
    """`cfg` with the audit settings the trainer settings of a conversion imply, for every key the
    configuration does not set; each such key is named in the source."""
    update = {k: v for k, v in conv.settings.items() if k not in cfg.model_fields_set}
    if update:
        said = ", ".join(f"{k} = {json.dumps(v)}" for k, v in update.items())
        cfg = cfg.model_copy(update=update).with_source(f"{cfg.source}; from the trainer's settings: {said}")
    if adapter_waives_denominators(conv) and "denominator_not_recorded" not in cfg.model_fields_set:
        cfg = cfg.model_copy(update={"denominator_not_recorded": True}).with_source(
            f"{cfg.source}; from the adapter: denominator_not_recorded = true"
        )
    more = [c for c in adapter_waives(conv) if c not in cfg.not_recorded]
    if more:
        cfg = cfg.model_copy(update={"not_recorded": [*cfg.not_recorded, *more]}).with_source(
            f"{cfg.source}; from the adapter: not_recorded = {json.dumps(more)}"
        )
    return cfg


def adapter_waives(conv: Converted) -> list[str]:
    """The required columns (other than the loss denominators, see `adapter_waives_denominators`)
    the adapter declared its framework does not record, on the tables it built in memory: its own
    word, which the audit of the conversion takes as the user's (the written log's file metadata
    alone never is)."""
    out: list[str] = []
    for table in conv.tables():
        if table is not None:
            said = not_recorded(table.schema.metadata, waivable_names())
            out += [b for k in said if (b := k.removeprefix("updates.")) in waivable_names() - USER_WAIVED]
    return sorted(set(out))


def adapter_waives_denominators(conv: Converted) -> bool:
    """The adapter declared that its framework records neither the loss reduction nor its
    denominator (rLLM; verl's step-level hook): its own word, on the tables it built in memory,
    which the audit of the conversion takes as the user's (a log's file metadata alone never is)."""
    if conv.updates is None:
        return False
    said = not_recorded(conv.updates.schema.metadata, waivable_names())
    return USER_WAIVED <= {k.removeprefix("updates.") for k in said}


def trainer_settings_table(conv: Converted) -> str:
    """The trainer settings keys a conversion derived, as a `[tool.rollout-audit]` table that a
    converted log carries as its own configuration (all of them are "how the run was produced")."""
    keys = {k: v for k, v in conv.settings.items() if k in LOG_CONTEXT}
    lines = [f"# {conv.settings_said}" if conv.settings_said else "# the trainer's settings, as its adapter derived it"]
    lines.append("[tool.rollout-audit]")
    lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    if adapter_waives(conv):  # a log cannot waive its own columns: the user says it
        lines.append(
            "# the trainer does not record some required columns: audit this log with "
            f"not_recorded = {json.dumps(adapter_waives(conv))} in your own configuration (--config FILE)"
        )
    if adapter_waives_denominators(conv):  # a log cannot waive its own denominators: the user says it
        lines.append(
            "# the trainer records no loss reduction nor denominator: audit this log with "
            "denominator_not_recorded = true in your own configuration (--config FILE)"
        )
    return "\n".join(lines) + "\n"


def in_memory(conv: Converted) -> Discovery:
    """The converted tables as the files of a log held in memory, audited where the adapter built them.

    No temporary log is written: every executor reads an in-memory table (Ray's too, through its
    object store), replay reads its rows from memory, and the adapter's own declarations on the tables
    (`rollout_log.not_recorded`) are believed for a table held in memory as the session takes them
    for the user's word (`merged_trainer_settings`); the findings name the dump's records (`relabel`).
    A table without rows is left out, as a log without those files."""
    return memory_discovery(*(t if t is not None and t.num_rows else None for t in conv.tables()))


def relabel(rep: Report, conv: Converted) -> Report:
    """`rep` of the log `in_memory` holds, with each finding naming the dump record of its trajectory
    (or the dump files, for a finding on no trajectory) instead of the in-memory tables."""
    root = MEMORY
    dump = ", ".join(conv.sources)
    ids = conv.trajectories.column("trajectory_id").to_pylist() if conv.trajectories.num_rows else []
    where = pl.DataFrame(
        {"trajectory_id": [None if i is None else str(i) for i in ids], "_origin": conv.origins},
        schema={"trajectory_id": pl.String, "_origin": pl.String},
    ).unique("trajectory_id", keep="first")
    f = rep.findings
    inside = pl.col("file") == root
    named = (
        f.join(where, on="trajectory_id", how="left", nulls_equal=False)
        if f.height
        else f.with_columns(pl.lit(None, pl.String).alias("_origin"))
    )
    rep.findings = _context_hint(
        named.with_columns(
            pl.when(inside).then(pl.coalesce("_origin", pl.lit(dump))).otherwise(pl.col("file")).alias("file")
        )
        .drop("_origin")
        .with_columns(pl.col("message").str.replace_all(root, dump, literal=True))  # the tables: the dump
    )

    def text(s: Any) -> Any:
        return s.replace(root, dump) if isinstance(s, str) else s

    rep.not_run = {k: text(v) for k, v in rep.not_run.items()}
    rep.partial = {k: text(v) for k, v in rep.partial.items()}
    rep.unfulfilled = {k: text(v) for k, v in rep.unfulfilled.items()}
    rep.crashes = [{k: text(v) for k, v in c.items()} for c in rep.crashes]
    if rep.unusable is not None:
        rep.unusable = text(rep.unusable)
    rep.summary["dump_files"] = len(conv.files)  # how much of the dump was read, and what was not
    if conv.skipped:
        rep.summary["dump_files_not_read"] = list(conv.skipped)
    if conv.incomplete:  # sessions the recorder did not record whole: not audited, so never "ok"
        rep.unfulfilled["capture"] = text(conv.incomplete)
    if conv.settings_said:
        rep.summary["trainer_settings_said"] = conv.settings_said
        rep.summary["trainer_settings"] = dict(conv.settings)
    return rep


def _context_hint(findings: pl.DataFrame) -> pl.DataFrame:
    """E801 on a dump names the `--context KEY=VALUE` that supplies each identity it found missing:
    a trainer's dump seldom records them, and the context is how the audit is told."""
    if findings.is_empty():
        return findings
    said = [
        pl.when(pl.col("message").str.contains(key, literal=True)).then(pl.lit(f"--context {key}=..."))
        for key in IDENTITY
    ]
    hint = pl.concat_str(said, separator=" ", ignore_nulls=True)
    return findings.with_columns(
        pl.when((pl.col("code") == "E801") & (hint != ""))
        .then(pl.concat_str([pl.col("message"), pl.lit("; pass "), hint]))
        .otherwise(pl.col("message"))
        .alias("message")
    )
