"""One audit, whatever asked for it. Every entry point (`check`, `report`, `watch`, `filter`, `diff`,
`show`, `convert`, `audit()`, `assert_clean`, the pytest fixture, the TRL guard) states a `Request`
and gets an `Audited` back; the entry point only parses its options and renders.

An audit, in order:
1. the configuration: the user's settings (a `--config` file, a Config made in code, or the
   nearest pyproject.toml of the log) layered over the keys the log came with (how the run was
   produced) and the trainer policy a converted dump derived;
2. the source: files found under the paths, a trainer's dump converted by its adapter and written
   as a private temporary log, or in-memory tables;
3. the checks, on the executor the options name;
4. the findings of a converted dump relabelled to the dump's records;
5. the verdict settled: tolerated shares, then the baseline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from .adapters.convert import Converted, convert
from .contract.config import LOG_CONTEXT, Config, find_config, log_config
from .contract.errors import ConfigError
from .contract.schema import IDENTITY, USER_WAIVED, not_recorded
from .reading import storage
from .reading.io import Discovery, discover
from .reading.log import Log
from .running.engine import memory_discovery, run_audit
from .running.options import Options
from .running.report import Report
from .workflow.policy import (
    Tokens,
    apply_tolerated,
    settle,
    table_ids,
    table_tokens,
    trajectory_ids,
    trajectory_tokens,
)

__all__ = ["Audited", "Request", "as_log", "configure", "relabel", "run"]


@dataclass(frozen=True, kw_only=True)
class Request:
    """What one audit is asked to do. `source`: paths (audited together as one log), a scanned
    `Log`, or in-memory trajectory records or tables (with `updates`). `framework`: the paths are
    that trainer's dump, converted first, with `context` for what it does not record.
    `config_file`: the user's configuration file (`--config`); `config`: a Config made in code
    (replaces the user's file, still over the log's own keys). `replay`: trajectories to replay
    (`--replay N`). `preview`: also run the checks in preview (`--preview`). `baseline`: a baseline file (replaces the configuration's); `use_baseline=False`
    settles with tolerated shares only (`diff` compares two logs, each with no baseline of its own).
    `log_root`: the directory the log lives in, when the paths are parts of it (`watch` audits
    each step of the directory it follows)."""

    source: Any
    updates: Any = None
    framework: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    config_file: str | os.PathLike | None = None
    config: Config | None = None
    replay: int | None = None
    preview: bool = False
    options: Options = field(default_factory=Options)
    baseline: str | os.PathLike | None = None
    use_baseline: bool = True
    log_root: str | os.PathLike | None = None  # a directory the log lies in, all of it inside the trust boundary

    @property
    def paths(self) -> list[str] | None:
        """The source as a list of paths, or None when it is not a path or a list of paths."""
        s = self.source
        if isinstance(s, (str, os.PathLike)):
            return [os.fspath(s)]
        if isinstance(s, (list, tuple)) and s and all(isinstance(x, (str, os.PathLike)) for x in s):
            return [os.fspath(x) for x in s]
        return None


@dataclass
class Audited:
    """One log's audit: the report as the checks left it (`checked`), the report after the
    verdict was settled (`report`), the configuration it ran under and the file it came from,
    the log's trajectory ids (read only when asked), and the conversion of a dump."""

    report: Report
    checked: Report
    cfg: Config
    config_file: str | None
    ids: Callable[[], pl.Series]
    converted: Converted | None = None
    tokens: Tokens | None = None  # the token ids of the trajectories a baseline samples (its fingerprint)


def configure(request: Request) -> tuple[Config, str | None]:
    """The configuration of the request and the file the user's part came from (None: code or
    defaults). The user's settings are layered over the keys the log came with (a configuration
    inside the log, which may state only how the run was produced), so that `--config` adds to
    what the log says of its run instead of dropping it."""
    paths = [os.fspath(storage.local_path(p)) for p in request.paths or []] or None  # file:// is its path
    root = None if request.log_root is None else os.fspath(storage.local_path(request.log_root))
    start = paths[0] if paths else root  # found from the audited path; trusted by the log's root too
    audited = [*(paths or []), *([root] if root is not None else [])]
    if request.config is not None:
        user, user_file = request.config, None
    elif paths is None:
        user, user_file = Config().with_source("defaults"), None
    else:
        user, user_file = find_config(_path(request.config_file), start=start, audited=audited)
    cfg = user
    if start is not None and (request.config is not None or request.config_file is not None):
        own = log_config(start, audited)  # the log's own "how it was produced" keys, found beside the log
        if own is not None:
            cfg = layered(own, user)
    asked = {k: v for k, v in (("replay", request.replay), ("preview", request.preview or None)) if v is not None}
    if asked:
        cfg = cfg.model_copy(update=asked).with_source(cfg.source)
    return cfg, user_file


def layered(base: Config, top: Config) -> Config:
    """`top` over `base`: every key `top` sets replaces `base`'s; the source names both."""
    update = {k: getattr(top, k) for k in top.model_fields_set}
    out = base.model_copy(update=update)
    out._log_keys = (base.log_keys - top.model_fields_set) | top.log_keys
    return out.with_source(f"{top.source}, over {base.source}")


def run(request: Request) -> Audited:
    """Run the audit `request` asks for, settle its verdict, and return both reports."""
    cfg, config_file = configure(request)
    storage.set_timeouts(cfg.storage_connect_timeout, cfg.storage_request_timeout)
    opts = request.options
    conv: Converted | None = None
    if request.framework:
        paths = request.paths
        if not paths:
            raise TypeError("a framework's dump is read from paths")
        conv = convert(request.framework, paths, request.context)
        cfg = with_policy(cfg, conv)
        with as_log(conv) as root:
            checked = relabel(run_audit(discover([root]), cfg, opts), conv, root)
        table = conv.trajectories

        def ids() -> pl.Series:
            return table_ids(table)

        tokens = table_tokens(table)
    else:
        disc = _discovery(request)
        bound_penalty(cfg, disc)
        checked = run_audit(disc, cfg, opts)

        def ids() -> pl.Series:
            return trajectory_ids(disc)

        tokens = trajectory_tokens(disc)

    if request.use_baseline:
        report = settle(checked, cfg, config_file, ids, _path(request.baseline), tokens)
    else:
        report = apply_tolerated(checked, cfg.tolerated_share, cfg.source)
    return Audited(report, checked, cfg, config_file, ids, conv, tokens)


def bound_penalty(cfg: Config, disc: Discovery) -> None:
    """A `truncation_penalty` the log's own configuration states must lie within the rewards the log
    records for episodes that were not truncated, and below the best of them when they differ: a
    penalty of 1e9, or one that pays a cut episode like the best outcome, only switches T307 off.
    ConfigError naming the value and the range; nothing to bound when the rewards cannot be read."""
    if "truncation_penalty" not in cfg.log_keys or cfg.truncation_penalty is None or not disc.of_kind("trajectories"):
        return
    try:
        t = Log(disc).trajectories
        r = pl.col("reward").cast(pl.Float64)
        lo, hi = (
            t.filter(~pl.col("truncated").fill_null(False) & r.is_finite())
            .select(r.min().alias("lo"), r.max().alias("hi"))
            .collect()
            .row(0)
        )
    except Exception:  # noqa: BLE001 - no readable rewards: T307 then has nothing to compare either
        return
    p = cfg.truncation_penalty
    if lo is None or (p <= hi and (p < hi or lo == hi)):
        return
    raise ConfigError(
        f"{cfg.source}: truncation_penalty = {p!r} lies outside the rewards the log records for episodes "
        f"that were not truncated ([{lo!r}, {hi!r}]: a penalty pays less than the best of them); a "
        "configuration inside the log may state only values a real trainer has: set it with --config FILE"
    )


def _path(p: str | os.PathLike | None) -> str | None:
    return None if p is None else os.fspath(p)


def _discovery(request: Request) -> Discovery:
    if isinstance(request.source, Log):
        return request.source.discovery
    paths = request.paths
    if paths is not None:
        return discover(paths)
    return memory_discovery(request.source, request.updates)


def with_policy(cfg: Config, conv: Converted) -> Config:
    """`cfg` with the settings of the trainer policy a conversion derived, for every key the
    configuration does not set; each such key is named in the source."""
    update = {k: v for k, v in conv.settings.items() if k not in cfg.model_fields_set}
    if update:
        said = ", ".join(f"{k} = {json.dumps(v)}" for k, v in update.items())
        cfg = cfg.model_copy(update=update).with_source(f"{cfg.source}; from the trainer's policy: {said}")
    if adapter_waives_denominators(conv) and "denominator_not_recorded" not in cfg.model_fields_set:
        cfg = cfg.model_copy(update={"denominator_not_recorded": True}).with_source(
            f"{cfg.source}; from the adapter: denominator_not_recorded = true"
        )
    return cfg


def adapter_waives_denominators(conv: Converted) -> bool:
    """The adapter declared that its framework records neither the loss reduction nor its
    denominator (rLLM; verl's step-level hook): its own word, on the tables it built in memory,
    which the audit of the conversion takes as the user's (a log's file metadata alone never is)."""
    if conv.updates is None:
        return False
    said = not_recorded(conv.updates.schema.metadata, user_waived=True)
    return USER_WAIVED <= {k.removeprefix("updates.") for k in said}


def policy_table(conv: Converted) -> str:
    """The trainer policy keys a conversion derived, as a `[tool.rollout-audit]` table that a
    converted log carries as its own configuration (all of them are "how the run was produced")."""
    keys = {k: v for k, v in conv.settings.items() if k in LOG_CONTEXT}
    lines = [f"# {conv.policy}" if conv.policy else "# the trainer's policy, as its adapter derived it"]
    lines.append("[tool.rollout-audit]")
    lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    if adapter_waives_denominators(conv):  # a log cannot waive its own denominators: the user says it
        lines.append(
            "# the trainer records no loss reduction nor denominator: audit this log with "
            "denominator_not_recorded = true in your own configuration (--config FILE)"
        )
    return "\n".join(lines) + "\n"


@contextmanager
def as_log(conv: Converted) -> Iterator[str]:
    """The converted tables written as a contract log in a private temporary directory, removed on
    exit whatever happens; yields its path."""
    from .adapters.convert import write_table

    root = Path(tempfile.mkdtemp(prefix="rollout-audit-from-"))
    try:
        for kind, table in zip(("trajectories", "updates"), conv.tables()):
            if table is not None and table.num_rows:
                (root / kind).mkdir()
                write_table(root / kind / "part-0000.parquet", table, kind, validate=False)
        yield str(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def relabel(rep: Report, conv: Converted, root: str) -> Report:
    """`rep` of the log `as_log` wrote, with each finding naming the dump record of its trajectory
    (or the dump files, for a finding on no trajectory) instead of the temporary files."""
    dump = ", ".join(conv.sources)
    ids = conv.trajectories.column("trajectory_id").to_pylist() if conv.trajectories.num_rows else []
    where = pl.DataFrame(
        {"trajectory_id": [None if i is None else str(i) for i in ids], "_origin": conv.origins},
        schema={"trajectory_id": pl.String, "_origin": pl.String},
    ).unique("trajectory_id", keep="first")
    f = rep.findings
    inside = pl.col("file").str.starts_with(root)
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
        .with_columns(pl.col("message").str.replace_all(re.escape(root) + r"[^,)\s]*", dump))  # a temp file: the dump
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
    if conv.policy:
        rep.summary["trainer_policy"] = conv.policy
        rep.summary["trainer_policy_settings"] = dict(conv.settings)
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
