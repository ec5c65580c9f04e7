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

import numpy as np
import polars as pl
import pyarrow as pa

from ..checks import all_rules
from ..contract.config import Config, read_bounded
from ..contract.errors import ConfigError, UsageError
from ..contract.registry import SEVERITY_ORDER
from ..contract.version import __version__
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
    """The log's sample: its smallest trajectory ids (they stay when the log grows)."""
    return ids.drop_nulls().unique().sort().head(SAMPLE_IDS).to_list()


Tokens = Callable[[list[str]], pl.DataFrame]  # the rows (trajectory_id, token_ids) of these ids


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def content_digests(rows: pl.DataFrame) -> dict[str, str]:
    """A digest of each trajectory id's token ids in `rows` (trajectory_id, token_ids): every token
    mixed with its position, summed over its trajectory, the trajectory's digest mixed with its
    length (a null list apart from an empty one) and summed over the rows of one id, so that
    neither the order of files nor of rows changes it. Vectorised; stable across machines and
    library versions (it is written into baselines)."""
    ids = rows["trajectory_id"].cast(pl.String, strict=False)
    rows, ids = rows.filter(ids.is_not_null()), ids.drop_nulls()
    if rows.is_empty():
        return {}
    try:
        toks = rows["token_ids"].cast(pl.List(pl.Int64), strict=False)
    except pl.exceptions.PolarsError:  # not a list of numbers at all: the same digest as no token ids
        toks = pl.Series("token_ids", [None] * rows.height, pl.List(pl.Int64))
    n = len(toks)
    flat = (
        pl.DataFrame({"_r": np.arange(n, dtype=np.int64), "t": toks})
        .select("_r", pl.col("t").list.eval(pl.element().fill_null(-1)))
        .explode("t")
        .drop_nulls("t")  # what an empty or null list leaves (null tokens were made -1)
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over("_r").alias("p"))
    )
    with np.errstate(over="ignore"):
        tok = flat["t"].to_numpy().astype(np.int64).view(np.uint64)
        h = _mix(tok ^ _mix(flat["p"].to_numpy().astype(np.uint64)))
        per_row = np.zeros(n, dtype=np.uint64)
        np.add.at(per_row, flat["_r"].to_numpy(), h)
        length = toks.list.len().fill_null(-1).to_numpy().astype(np.int64).view(np.uint64)
        per_row = _mix(per_row ^ _mix(length + np.uint64(1)))
        keys, group = np.unique(ids.to_numpy().astype(object), return_inverse=True)
        per_id = np.zeros(len(keys), dtype=np.uint64)
        np.add.at(per_id, group, per_row)
    return {str(k): f"{int(v):016x}" for k, v in zip(keys, per_id)}


def fingerprint(ids: pl.Series, tokens: Tokens | None) -> dict:
    """What a baseline recognises its log by: the sample of its trajectory ids, the digest of
    each one's token ids (`content_digests`; none without `tokens`), and how many it held."""
    sample = sample_ids(ids)
    doc: dict = {"sample_trajectory_ids": sample, "trajectories": int(ids.len())}
    if tokens is not None:
        got = content_digests(tokens(sample)) if sample else {}
        doc["sample_token_digests"] = [got.get(i) for i in sample]
    return doc


def write_baseline(path: str | Path, rep: Report, ids: pl.Series, tokens: Tokens | None = None) -> int:
    """Record `rep`'s findings in `path` (JSON), with the fingerprint of the log (`ids` and the
    token ids `tokens` gives for its sample); the number recorded."""
    counted = _keys(rep.findings).group_by(list(KEY), maintain_order=True).len("count")
    doc = {
        "rollout_audit_baseline": BASELINE_FORMAT,
        "tool_version": __version__,
        "log": fingerprint(ids, tokens),
        "findings": counted.to_dicts(),
    }
    write_atomic(path, json.dumps(doc, indent=1) + "\n")  # never through a link, never into a FIFO
    return rep.findings.height


def _check_log(path: str | Path, log: object, ids: pl.Series, tokens: Tokens | None) -> None:
    """BaselineError unless the baseline's fingerprint `log` recognises this log: at least half of
    its sample ids are in `ids` and, when `tokens` reads the log's token ids, at least half of
    them hold the token ids they held when it was written (another log whose ids coincide is refused)."""
    listed = log.get("sample_trajectory_ids") if isinstance(log, dict) else None
    digests = log.get("sample_token_digests") if isinstance(log, dict) else None
    sample = [x for x in listed if isinstance(x, str)] if isinstance(listed, list) else []
    present = int(pl.Series(sample, dtype=pl.String).is_in(ids.drop_nulls().implode()).sum()) if sample else 0
    if sample and 2 * present < len(sample):
        raise BaselineError(
            f"baseline {path}: written for another log ({present} of the {len(sample)} trajectory ids it "
            f"recognises its log by are in this one, e.g. {sample[0]!r}); write one for this log with --write-baseline"
        )
    if tokens is None or not sample:
        return
    if not isinstance(digests, list) or len(digests) != len(listed or []):
        raise BaselineError(
            f"baseline {path}: log: sample_token_digests: expected one digest per sample trajectory id "
            "(the fingerprint of its log's content); write it again with --write-baseline"
        )
    recorded = {i: d for i, d in zip(listed or [], digests) if isinstance(i, str)}
    now = content_digests(tokens(sample))
    matched = sum(1 for i in sample if recorded.get(i) is not None and now.get(i) == recorded.get(i))
    if 2 * matched < len(sample):
        raise BaselineError(
            f"baseline {path}: written for another log ({present} of the {len(sample)} trajectory ids it "
            f"recognises its log by are in this one, but the token ids of only {matched} are those it recorded); "
            "write one for this log with --write-baseline"
        )


def read_baseline(path: str | Path, ids: pl.Series, tokens: Tokens | None = None) -> pl.DataFrame:
    """The baselined findings (KEY and count) of `path`, after checking it was written by this
    version of the tool for this log (`_check_log`)."""
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
    _check_log(path, doc.get("log"), ids, tokens)
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


def apply_baseline(rep: Report, path: str | Path, ids: pl.Series, tokens: Tokens | None = None) -> Report:
    """`rep` without the findings recorded in the baseline at `path` (as many of each key as it
    recorded); `summary["baseline"]` says how many were seen, how many are gone and how many are new."""
    base = read_baseline(path, ids, tokens)
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


def _sample_rows(frame: pl.LazyFrame, sample: list[str]) -> pl.DataFrame:
    """The rows (trajectory_id, token_ids) of `frame` whose id is in `sample`; null token ids when
    the log records none."""
    names = frame.collect_schema().names()
    toks = pl.col("token_ids") if "token_ids" in names else pl.lit(None, pl.List(pl.Int64)).alias("token_ids")
    tid = pl.col("trajectory_id").cast(pl.String)
    return frame.filter(tid.is_in(pl.Series(sample, dtype=pl.String).implode())).select(tid, toks).collect()


def table_tokens(table: pa.Table) -> Tokens:
    """The sample's token ids of an in-memory trajectory table."""

    def rows(sample: list[str]) -> pl.DataFrame:
        keep = [c for c in ("trajectory_id", "token_ids") if c in table.column_names]
        try:
            frame = (
                pl.from_arrow(table.select(keep)) if "trajectory_id" in keep else pl.DataFrame({"trajectory_id": []})
            )
            assert isinstance(frame, pl.DataFrame)
            return _sample_rows(frame.lazy(), sample)
        except (pl.exceptions.PolarsError, pa.ArrowException) as e:  # token ids of a type polars cannot take
            raise BaselineError(f"the converted log's token ids cannot be read to match a baseline ({e})") from None

    return rows


def trajectory_tokens(disc: Discovery) -> Tokens:
    """The sample's token ids of the log `disc` discovered (only the rows of the sample's ids)."""

    def rows(sample: list[str]) -> pl.DataFrame:
        tables = [f.table for f in disc.of_kind("trajectories") if f.table is not None]
        if tables:
            return pl.concat([table_tokens(t)(sample) for t in tables], how="vertical_relaxed")
        try:
            return _sample_rows(Log(disc).trajectories, sample)
        except (pl.exceptions.PolarsError, UsageError, OSError, KeyError) as e:  # token ids unreadable
            where = disc.files[0].path if disc.files else "the log"
            raise BaselineError(f"{where}: its token ids cannot be read to match a baseline ({e})") from None

    return rows


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
    tokens: Tokens | None = None,
) -> Report:
    """The report of one log after the tolerated rates of `cfg` and its baseline (`baseline`, else
    `baseline = "…"` of `cfg`, found from `config_file`); `ids()` gives the log's trajectory ids
    when a baseline applies, `tokens` the token ids of its sample (the log's fingerprint). `rollout-audit check` and the library's `audit` both end here."""
    rep = apply_tolerated(rep, cfg.tolerated_share, cfg.source)
    where = Path(baseline) if baseline else configured_baseline(cfg, config_file)
    if where is None or rep.unusable is not None:
        return rep
    if not where.is_file():
        said = "" if baseline else f" (baseline = {cfg.baseline!r} in {cfg.source})"
        if where.exists():
            raise BaselineError(f"baseline {where}: not a regular file{said}")
        raise BaselineError(f"baseline {where}: no such file{said} (write one with `check --write-baseline {where}`)")
    return apply_baseline(rep, where, ids(), tokens)
