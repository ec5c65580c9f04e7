"""What a team decided to live with, applied to a finished report: tolerated rates per code
(Great Expectations' `mostly`) and a baseline of accepted findings (mypy's and ruff's manner).

Both return a new Report whose findings, counts and exit code say what remains; what was
tolerated or baselined is stated in `summary["tolerated"]` and `summary["baseline"]`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa

from .. import __version__
from ..checks import all_rules
from ..contract.config import Config, read_bounded
from ..contract.errors import ConfigError, UsageError
from ..contract.registry import SEVERITY_ORDER
from ..reading.io import Discovery
from ..reading.log import Log
from ..reporting.outputs import write_atomic
from ..running.report import Report, sort_findings

BASELINE_FORMAT = 1
SAMPLE_IDS = 16  # trajectory ids a baseline keeps to recognise its log
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
KEY = ("code", "trajectory_id", "turn", "position", "where", "digest")
# A baseline file larger than this is refused unread (its path may come from a configuration file:
# a device or a huge file never fills memory); about 400,000 recorded findings fit
MAX_BASELINE_BYTES = int(os.environ.get("ROLLOUT_AUDIT_MAX_BASELINE_BYTES", str(64 << 20)))


class BaselineError(UsageError):
    """The baseline cannot be used with this audit (exit 2): another tool version, another log, unreadable."""


def _with_findings(rep: Report, findings: pl.DataFrame, **summary) -> Report:
    """`rep` with other findings, its counts recomputed, and `summary` entries added."""
    per_code = findings.group_by("code").len().sort("code").to_dicts()
    s = {
        **rep.summary,
        "counts": {d["code"]: d["len"] for d in per_code},
        "by_severity": {k: int((findings["severity"] == k).sum()) for k in SEVERITY_ORDER},
        **summary,
    }
    return dataclasses.replace(rep, findings=findings, summary=s)


# ---------------------------------------------------------------- tolerated rates


def check_tolerated(shares: dict[str, float], source: str = "") -> None:
    """Every code named in `tolerated_share` must be a check's code; an error names the configuration
    (`source`) that set it."""
    known = all_rules()
    for code in shares:
        if code not in known:
            raise UsageError(
                f"{source + ': ' if source else ''}tolerated_share: unknown check code {code!r}; "
                "see `rollout-audit explain --list`"
            )


def apply_tolerated(rep: Report, shares: dict[str, float], source: str = "") -> Report:
    """Error findings of a code in `shares` become warnings when the trajectories they name are at
    most that share of the trajectories read; the share, the limit and the outcome are recorded."""
    check_tolerated(shares, source)
    if not shares or rep.findings.is_empty():
        return rep
    rows = rep.summary.get("rows_read") or 0
    per = (
        rep.findings.filter(pl.col("code").is_in(list(shares)))
        .group_by("code")
        .agg(
            pl.col("trajectory_id").drop_nulls().n_unique().alias("n"), (pl.col("severity") == "error").any().alias("e")
        )
        .sort("code")
    )
    seen: dict[str, dict] = {}
    within: list[str] = []
    for code, n, has_error in per.iter_rows():
        share = n / rows if rows else 1.0
        ok = bool(rows) and share <= shares[code]
        seen[code] = {"trajectories": n, "of": rows, "share": share, "limit": shares[code], "within": ok}
        if ok and has_error:
            within.append(code)
    findings = sort_findings(
        rep.findings.with_columns(
            pl.when(pl.col("code").is_in(within) & (pl.col("severity") == "error"))
            .then(pl.lit("warning"))
            .otherwise(pl.col("severity"))
            .alias("severity")
        )
    )
    return _with_findings(rep, findings, tolerated=seen)


# ---------------------------------------------------------------- baselines


def _keys(findings: pl.DataFrame) -> pl.DataFrame:
    """The stable key of each finding: code, trajectory, turn, position, the file's name when no
    trajectory is named, and a digest of the numbers in the message (a changed count is new)."""
    nums = findings["message"].str.extract_all(_NUMBER).list.join(",").to_list()
    digest = [hashlib.blake2b(n.encode(), digest_size=6).hexdigest() for n in nums]
    where = pl.when(pl.col("trajectory_id").is_null()).then(pl.col("file").str.split("/").list.last()).otherwise(None)
    return findings.select(
        "code", "trajectory_id", "turn", "position", where.alias("where"), pl.Series("digest", digest, pl.String)
    )


def sample_ids(ids: pl.Series) -> list[str]:
    """The log's fingerprint: its smallest trajectory ids (they stay when the log grows)."""
    return ids.drop_nulls().unique().sort().head(SAMPLE_IDS).to_list()


def write_baseline(path: str | Path, rep: Report, ids: pl.Series) -> int:
    """Record `rep`'s findings in `path` (JSON); the number recorded."""
    counted = _keys(rep.findings).group_by(list(KEY), maintain_order=True).len("count")
    doc = {
        "rollout_audit_baseline": BASELINE_FORMAT,
        "tool_version": __version__,
        "log": {"sample_trajectory_ids": sample_ids(ids), "trajectories": int(ids.len())},
        "findings": counted.to_dicts(),
    }
    write_atomic(path, json.dumps(doc, indent=1) + "\n")  # never through a link, never into a FIFO
    return rep.findings.height


def read_baseline(path: str | Path, ids: pl.Series) -> pl.DataFrame:
    """The baselined findings (KEY and count) of `path`, after checking it was written by this
    version of the tool for this log (at least half of its sample ids are in `ids`)."""
    try:
        doc = json.loads(read_bounded(path, MAX_BASELINE_BYTES, "ROLLOUT_AUDIT_MAX_BASELINE_BYTES"))
    except ConfigError as e:  # not a regular file, too large, unreadable: the message names the file
        raise BaselineError(f"baseline {e}") from None
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deeply
        raise BaselineError(f"baseline {path}: cannot read: {e}") from None
    if not isinstance(doc, dict) or doc.get("rollout_audit_baseline") != BASELINE_FORMAT:
        raise BaselineError(f"baseline {path}: not a rollout-audit baseline (format {BASELINE_FORMAT})")
    if doc.get("tool_version") != __version__:
        raise BaselineError(
            f"baseline {path}: written by rollout-audit {doc.get('tool_version')}, this is {__version__}; "
            "findings and their messages may differ between versions: write it again with --write-baseline"
        )
    log = doc.get("log")
    listed = log.get("sample_trajectory_ids") if isinstance(log, dict) else None
    sample = [x for x in listed if isinstance(x, str)] if isinstance(listed, list) else []
    present = int(pl.Series(sample, dtype=pl.String).is_in(ids.drop_nulls().implode()).sum()) if sample else 0
    if sample and 2 * present < len(sample):
        raise BaselineError(
            f"baseline {path}: written for another log ({present} of the {len(sample)} trajectory ids it "
            f"recognises its log by are in this one, e.g. {sample[0]!r}); write one for this log with --write-baseline"
        )
    findings = doc.get("findings", [])
    if not isinstance(findings, list) or not all(isinstance(x, dict) for x in findings):
        raise BaselineError(f"baseline {path}: findings: expected a list of objects, got {type(findings).__name__}")
    try:
        rows = pl.DataFrame(
            findings,
            schema={
                "code": pl.String,
                "trajectory_id": pl.String,
                "turn": pl.Int64,
                "position": pl.Int64,
                "where": pl.String,
                "digest": pl.String,
                "count": pl.Int64,
            },
            strict=False,
        )
    except (TypeError, ValueError, pl.exceptions.PolarsError) as e:
        raise BaselineError(f"baseline {path}: findings unreadable: {e}") from None
    return rows.group_by(list(KEY)).agg(pl.col("count").sum())


def apply_baseline(rep: Report, path: str | Path, ids: pl.Series) -> Report:
    """`rep` without the findings recorded in the baseline at `path` (as many of each key as it
    recorded); `summary["baseline"]` says how many were seen, how many are gone and how many are new."""
    base = read_baseline(path, ids)
    keyed = _keys(rep.findings).with_columns(pl.int_range(pl.len()).over(list(KEY)).alias("_k"))
    joined = keyed.join(base, on=list(KEY), how="left", nulls_equal=True)
    known = (joined["_k"] < joined["count"].fill_null(0)).to_numpy()
    kept = rep.findings.filter(pl.Series(~known))
    seen = int(known.sum())
    recorded = int(base["count"].sum()) if base.height else 0
    info = {"file": str(path), "recorded": recorded, "seen": seen, "gone": recorded - seen, "new": kept.height}
    return _with_findings(rep, kept, baseline=info)


# ---------------------------------------------------------------- one log's settled report


def table_ids(table: pa.Table) -> pl.Series:
    """The trajectory ids of an in-memory trajectory table (none when it has no such column)."""
    ids = table.column("trajectory_id").to_pylist() if "trajectory_id" in table.column_names else []
    return pl.Series("trajectory_id", ids, pl.String)


def trajectory_ids(disc: Discovery) -> pl.Series:
    """The trajectory ids of the log `disc` discovered: its in-memory tables, else its files."""
    tables = [f.table for f in disc.of_kind("trajectories") if f.table is not None]
    if tables:
        return pl.concat([table_ids(t) for t in tables])
    try:
        return Log(disc).trajectories.select(pl.col("trajectory_id").cast(pl.String)).collect()["trajectory_id"]
    except (pl.exceptions.PolarsError, UsageError, OSError, KeyError) as e:  # ids not UTF-8, of another type, absent
        where = disc.files[0].path if disc.files else "the log"
        raise BaselineError(f"{where}: its trajectory ids cannot be read to match a baseline ({e})") from None


def configured_baseline(cfg: Config, config_file: str | None) -> Path | None:
    """`baseline = "…"` of the configuration, a relative path read from the directory of the
    file it came from (a Config made in code: from the working directory)."""
    if cfg.baseline is None:
        return None
    p = Path(cfg.baseline)
    return p if p.is_absolute() or config_file is None else Path(config_file).parent / p


def settle(
    rep: Report,
    cfg: Config,
    config_file: str | None,
    ids: Callable[[], pl.Series],
    baseline: str | Path | None = None,
) -> Report:
    """The report of one log after the tolerated rates of `cfg` and its baseline (`baseline`, else
    `baseline = "…"` of `cfg`, found from `config_file`); `ids()` gives the log's trajectory ids
    when a baseline applies. `rollout-audit check` and the library's `audit` both end here."""
    rep = apply_tolerated(rep, cfg.tolerated_share, cfg.source)
    where = Path(baseline) if baseline else configured_baseline(cfg, config_file)
    if where is None or rep.unusable is not None:
        return rep
    if not where.is_file():
        said = "" if baseline else f" (baseline = {cfg.baseline!r} in {cfg.source})"
        if where.exists():
            raise BaselineError(f"baseline {where}: not a regular file{said}")
        raise BaselineError(f"baseline {where}: no such file{said} (write one with `check --write-baseline {where}`)")
    return apply_baseline(rep, where, ids())
