"""One audit, whatever asked for it. Every entry point (`check`, `report`, `watch`, `filter`, `diff`,
`show`, `convert`, `audit()`, `assert_clean`, the pytest fixture, the TRL guard) states a `Request`
and gets an `Audited` back; the entry point only parses its options and renders.

An audit, in order:
1. the configuration: the user's settings (a `--config` file, a Config made in code, or the
   nearest pyproject.toml of the log) layered over the keys the log came with (how the run was
   produced) and the trainer settings a converted dump derived;
2. the source: files found under the paths, a trainer's dump converted by its adapter (its tables
   audited in memory, where the adapter built them), or in-memory tables;
3. the checks, on the executor the options name;
4. the findings of a converted dump relabelled to the dump's records;
5. the verdict settled: tolerated shares, then the baseline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ..adapters.convert import Converted, convert
from ..contract.config import Config, find_config, log_config
from ..contract.errors import ConfigError
from ..reading import storage
from ..reading.io import Discovery, discover
from ..reading.log import Log
from ..running.engine import memory_discovery, run_audit
from ..running.options import Options
from ..running.report import Report
from .dumps import in_memory, merged_trainer_settings, relabel
from .verdict import (
    Tokens,
    apply_tolerated,
    settle,
    table_ids,
    table_tokens,
    trajectory_ids,
    trajectory_tokens,
)

__all__ = ["Audited", "Request", "configure", "run"]


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
    each step of the directory it follows). `calls`: with `framework`, recordings of the engine calls
    (`rollout-audit capture`) joined to the dump's rows by their token prefix (`--calls`)."""

    source: Any
    updates: Any = None
    framework: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    calls: tuple[str | os.PathLike, ...] = ()
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
    out._log_file = top.log_file or base.log_file
    return out.with_source(f"{top.source}, over {base.source}")


def run(request: Request) -> Audited:
    """Run the audit `request` asks for, settle its verdict, and return both reports."""
    cfg, config_file = configure(request)
    storage.set_timeouts(cfg.storage_connect_timeout, cfg.storage_request_timeout)
    opts = request.options
    conv: Converted | None = None
    if request.calls and not request.framework:
        raise ConfigError("--calls joins recorded engine calls to a trainer's dump: give the dump's --from")
    if request.framework:
        paths = request.paths
        if not paths:
            raise TypeError("a framework's dump is read from paths")
        conv = convert(request.framework, paths, request.context, request.calls)
        cfg = merged_trainer_settings(cfg, conv)
        checked = relabel(_checked(in_memory(conv), cfg, opts), conv)
        table = conv.trajectories

        def ids() -> pl.Series:
            return table_ids(table)

        tokens = table_tokens(table)
    else:
        disc = _discovery(request)
        checked = _checked(disc, cfg, opts)

        def ids() -> pl.Series:
            return trajectory_ids(disc)

        tokens = trajectory_tokens(disc)

    if request.use_baseline:
        report = settle(checked, cfg, config_file, ids, _path(request.baseline), tokens)
    else:
        report = apply_tolerated(checked, cfg.tolerated_share, cfg.source)
    return Audited(report, checked, cfg, config_file, ids, conv, tokens)


def _checked(disc: Discovery, cfg: Config, opts: Options) -> Report:
    """The checks of the log `disc` finds (a log read from paths, in memory, or a converted dump),
    once the penalty its own configuration states is bounded by what it records."""
    bound_penalty(cfg, disc)
    return run_audit(disc, cfg, opts)


def bound_penalty(cfg: Config, disc: Discovery) -> None:
    """A `truncation_penalty` the log's own configuration states (a file inside the audited log or
    dump folder) must lie within the rewards the log records for episodes that were not truncated,
    and below the best of them when they differ: a penalty of 1e9, or one that pays a cut episode
    like the best outcome, only switches T307 off. When every episode was cut nothing bounds it and
    it is refused too: it would be the only bound T307 has, and the log would set it on its own word.
    ConfigError naming the file, the key, the value and the range; nothing to bound when the rewards
    cannot be read (T307 then has nothing to compare either). The user's own penalty is believed."""
    if "truncation_penalty" not in cfg.log_keys or cfg.truncation_penalty is None or not disc.of_kind("trajectories"):
        return
    try:
        t = Log(disc).trajectories
        r = pl.col("reward").cast(pl.Float64)
        lo, hi, n = (
            t.filter(r.is_finite())
            .select(
                r.filter(~pl.col("truncated").fill_null(False)).min().alias("lo"),
                r.filter(~pl.col("truncated").fill_null(False)).max().alias("hi"),
                pl.len().alias("n"),
            )
            .collect()
            .row(0)
        )
    except Exception:  # noqa: BLE001 - no readable rewards: T307 then has nothing to compare either
        return
    p = cfg.truncation_penalty
    where = f"{cfg.log_file or cfg.source}: truncation_penalty = {p!r}"
    mine = "set it with --config FILE if it is your trainer's"
    if lo is None:
        if not n:
            return  # no reward recorded: T307 compares none
        raise ConfigError(
            f"{where}: refused in a configuration inside the audited log, whose episodes were all truncated "
            f"(no reward of an episode that was not truncated bounds the penalty); {mine}"
        )
    if p <= hi and (p < hi or lo == hi):
        return
    raise ConfigError(
        f"{where} lies outside the rewards the log records for episodes that were not truncated "
        f"([{lo!r}, {hi!r}]: a penalty pays less than the best of them); a configuration inside the log "
        f"may state only values a real trainer has: {mine}"
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
