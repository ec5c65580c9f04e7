"""`rollout-audit diff A B`: what changed between two logs (two runs, or two steps of one log):
findings per code that appeared, disappeared or changed count, and the statistics that moved
beyond noise (a two-sided z score over trajectories, groups or update uses)."""

from __future__ import annotations

import math

import polars as pl

from ..contract.errors import UsageError
from ..reading.io import one_line
from ..reading.log import Log
from ..reporting.report import Report, incomplete, num, printable

Z_NOISE = 3.0  # |z| above this is a move, not sampling noise


def _moments(values: pl.Expr) -> list[pl.Expr]:
    return [values.count().alias("n"), values.mean().alias("mean"), values.std().alias("std")]


def profile(log: Log) -> dict[str, dict]:
    """Each statistic `diff` compares, as n (its sample size), mean and std: means of 0/1 values
    for shares. Keys: 'trainable share', 'stop <reason>', 'reward | <reason>', 'policy lag',
    'degenerate groups'."""
    lf = log.trajectories
    names = lf.collect_schema().names()
    out: dict[str, dict] = {}
    share = pl.col("loss_mask").list.sum() / pl.col("token_ids").list.len()
    out["trainable share"] = (
        lf.select(_moments(share.filter(pl.col("token_ids").list.len() > 0))).collect().to_dicts()[0]
    )
    stop = pl.col("stop_reason").cast(pl.String).fill_null("(null)")
    t = lf.select(stop.alias("stop"), pl.col("reward").cast(pl.Float64)).collect()
    for why in t["stop"].unique().sort():
        hit = (t["stop"] == why).cast(pl.Float64)
        out[f"stop {why}"] = {"n": t.height, "mean": hit.mean(), "std": hit.std()}
        r = t.filter(pl.col("stop") == why)["reward"].drop_nulls()
        if r.len():
            out[f"reward | {why}"] = {"n": r.len(), "mean": r.mean(), "std": r.std()}
    key = "group_id" if "group_id" in names else "task_id"
    g = (
        lf.filter(pl.col("reward").is_not_null())
        .group_by(key)
        .agg((pl.col("reward").max() == pl.col("reward").min()).cast(pl.Float64).alias("d"))
        .select(_moments(pl.col("d")))
        .collect()
    )
    out["degenerate groups"] = g.to_dicts()[0]
    if log.updates is not None:
        made = log.turns.group_by("trajectory_id").agg(pl.col("policy_version").min().alias("v"))
        uses = log.updates.select("trainer_version", pl.col("trajectory_ids").alias("trajectory_id")).explode(
            "trajectory_id"
        )
        lag = uses.join(made, on="trajectory_id").select(_moments(pl.col("trainer_version") - pl.col("v")))
        out["policy lag"] = lag.collect().to_dicts()[0]
    return {k: v for k, v in out.items() if v["n"]}


def _z(a: dict, b: dict) -> float | None:
    """Welch's z of the difference of two means (a share is the mean of 0/1 values); None when
    either side has no spread to measure noise by and the means are equal."""
    if a is None or b is None or a["mean"] is None or b["mean"] is None:
        return None
    var = (a["std"] or 0.0) ** 2 / a["n"] + (b["std"] or 0.0) ** 2 / b["n"]
    delta = b["mean"] - a["mean"]
    if var == 0:
        return 0.0 if delta == 0 else math.copysign(math.inf, delta)
    return delta / math.sqrt(var)


def _zero_stops(mine: dict[str, dict], other: dict[str, dict]) -> dict[str, dict]:
    """`mine` with a share of 0 for each stop cause only `other` has (over all of mine's trajectories)."""
    n = next((v["n"] for k, v in mine.items() if k.startswith("stop ")), 0)
    extra = {k: {"n": n, "mean": 0.0, "std": 0.0} for k in other if k.startswith("stop ") and k not in mine}
    return {**mine, **extra} if n else mine


def compare_stats(a: dict[str, dict], b: dict[str, dict], z_noise: float = Z_NOISE) -> list[dict]:
    """One row per statistic on either side: its value in A and in B, the z score, and `moved`."""
    a, b = _zero_stops(a, b), _zero_stops(b, a)
    rows = []
    for k in sorted(set(a) | set(b)):
        za = _z(a.get(k), b.get(k))  # type: ignore[arg-type]
        rows.append(
            {
                "stat": k,
                "a": a[k]["mean"] if k in a else None,
                "b": b[k]["mean"] if k in b else None,
                "n_a": a[k]["n"] if k in a else 0,
                "n_b": b[k]["n"] if k in b else 0,
                "z": None if za is None or math.isinf(za) else round(za, 2),
                "moved": za is None and (k in a) != (k in b) or (za is not None and abs(za) > z_noise),
            }
        )
    return rows


# what makes two findings the same finding in two logs: its check, its trajectory, where in it,
# and (a finding on no trajectory) the name of its file
IDENTITY = ("code", "trajectory_id", "turn", "position", "where")


def _identities(r: Report) -> pl.DataFrame:
    f = r.findings
    where = pl.when(pl.col("trajectory_id").is_null()).then(pl.col("file").str.split("/").list.last())
    return f.select(
        "code",
        "severity",
        pl.col("trajectory_id").cast(pl.String),
        pl.col("turn").cast(pl.Int64),
        pl.col("position").cast(pl.Int64),
        where.cast(pl.String).alias("where"),
        pl.col("file").cast(pl.String),
        pl.col("message").cast(pl.String),
    ).with_columns(pl.int_range(pl.len()).over(IDENTITY).alias("_nth"))


def compare_findings(a: Report, b: Report) -> dict[str, list[dict]]:
    """Findings compared by identity (code, trajectory, turn, position; the file's name for a
    finding on no trajectory): the findings new in B and those gone from A, and per code:
    appeared (only in B), disappeared (only in A), changed (findings new or gone, whatever the
    counts: one gone here and one new there is a change)."""
    ia, ib = _identities(a), _identities(b)
    key = [*IDENTITY, "_nth"]  # the k-th finding of one identity matches the k-th on the other side
    new = ib.join(ia.select(key), on=key, how="anti", nulls_equal=True).drop("_nth")
    gone = ia.join(ib.select(key), on=key, how="anti", nulls_equal=True).drop("_nth")

    def per_code(f: pl.DataFrame, name: str) -> pl.DataFrame:
        return f.group_by("code").agg(pl.len().alias(name), pl.col("severity").first().alias(f"sev_{name}"))

    j = (
        per_code(ia, "a")
        .join(per_code(ib, "b"), on="code", how="full", coalesce=True)
        .join(per_code(new, "new"), on="code", how="left")
        .join(per_code(gone, "gone"), on="code", how="left")
        .sort("code")
    )
    out: dict[str, list[dict]] = {"appeared": [], "disappeared": [], "changed": []}
    for r in j.iter_rows(named=True):
        row = {
            "code": r["code"],
            "severity": r["sev_b"] or r["sev_a"],
            "a": r["a"] or 0,
            "b": r["b"] or 0,
            "new": r["new"] or 0,
            "gone": r["gone"] or 0,
        }
        if r["a"] is None:
            out["appeared"].append(row)
        elif r["b"] is None:
            out["disappeared"].append(row)
        elif row["new"] or row["gone"]:
            out["changed"].append(row)
    cols = ["code", "severity", "trajectory_id", "turn", "position", "file", "message"]
    out["new_findings"] = new.select(cols).to_dicts()
    out["gone_findings"] = gone.select(cols).to_dicts()
    return out


def compare_coverage(a: Report, b: Report) -> dict[str, list[dict]]:
    """Checks that ran in full on A and not on B (lost: B was not verified as A was), with B's
    reason, and the reverse (gained)."""

    def state(r: Report, code: str) -> str:
        if code in r.not_run:
            return f"not run: {r.not_run[code]}"
        if code in r.partial:
            return f"partially run: {r.partial[code]}"
        if code in r.summary.get("checks_crashed", []):
            return "crashed"
        return "not run"

    full_a = set(a.summary["checks_run"]) - set(a.partial)
    full_b = set(b.summary["checks_run"]) - set(b.partial)
    lost = [{"code": c, "on_b": state(b, c)} for c in sorted(full_a - full_b)]
    gained = [{"code": c, "on_a": state(a, c)} for c in sorted(full_b - full_a)]
    return {"lost": lost, "gained": gained}


def _profile(paths: list, notes: list[str]) -> dict[str, dict]:
    """`profile` of the log at `paths`; a log whose columns do not allow it gives no statistics,
    and a note why (the audit reports what is wrong with it)."""
    from ..reading.log import scan

    try:
        return profile(scan(paths))
    except (pl.exceptions.PolarsError, UsageError, OSError, ValueError, TypeError) as e:
        notes.append(f"{', '.join(map(str, paths))}: statistics not computed ({one_line(e)})")
        return {}


def diff(
    a_path: list,
    b_path: list,
    rep_a: Report,
    rep_b: Report,
    z_noise: float = Z_NOISE,
    allow_lost_coverage: bool = False,
) -> dict:
    """The whole comparison, as the JSON output gives it. `exit_code`: 2 when either audit was
    incomplete, 1 when error findings are new in B or (unless `allow_lost_coverage`) a check that
    ran on A did not run on B, else 0."""
    f = compare_findings(rep_a, rep_b)
    new_errors = sum(1 for x in f["new_findings"] if x["severity"] == "error")
    cov = compare_coverage(rep_a, rep_b)
    notes: list[str] = []
    stats = compare_stats(_profile(a_path, notes), _profile(b_path, notes), z_noise)
    verdicts = {"a": rep_a.exit_code(), "b": rep_b.exit_code()}
    incomplete_sides = [side for side, r in (("a", rep_a), ("b", rep_b)) if incomplete(r)]
    code = 2 if incomplete_sides else 1 if new_errors or (cov["lost"] and not allow_lost_coverage) else 0
    return {
        "a": [str(p) for p in a_path],
        "b": [str(p) for p in b_path],
        "findings": f,
        "new_errors": new_errors,
        "coverage": cov,
        "lost_coverage_fails": not allow_lost_coverage,
        "z_noise": z_noise,
        "stats": stats,
        "stats_notes": notes,
        "verdicts": verdicts,
        "incomplete": {side: incomplete(r) for side, r in (("a", rep_a), ("b", rep_b)) if incomplete(r)},
        "exit_code": code,
    }


def _fmt(x: float | None) -> str:
    return "-" if x is None else num(x)


def render_diff(d: dict, every: bool = False, limit: int = 20) -> str:
    """Text: the findings new and gone by identity (at most `limit` of each listed), the coverage
    lost and gained, the statistics that moved (all with `every`), then a verdict line. Every
    string from a log is shown printable."""
    p = printable
    lines = [f"A: {', '.join(map(p, d['a']))}", f"B: {', '.join(map(p, d['b']))}"]
    f = d["findings"]
    for kind in ("appeared", "disappeared", "changed"):
        for r in f[kind]:
            lines.append(
                f"{kind:<11} {p(r['code'])} [{p(r['severity'])}] {r['a']} -> {r['b']} ({r['new']} new, {r['gone']} gone)"
            )
    for label, rows in (("new", f["new_findings"]), ("gone", f["gone_findings"])):
        for r in rows[:limit]:
            where = p(r["trajectory_id"]) if r["trajectory_id"] is not None else p(r["file"])
            at = "".join(f" {k} {r[k]}" for k in ("turn", "position") if r[k] is not None)
            lines.append(f"  {label:<5} {p(r['code'])} {where}{at}: {p(r['message'])}")
        if len(rows) > limit:
            lines.append(f"  {label:<5} ... and {len(rows) - limit} more (--format json lists all)")
    lost = d["coverage"]["lost"]
    for r in lost[:limit]:
        lines.append(f"lost        {p(r['code'])}: ran on A, on B {p(r['on_b'])}")
    if len(lost) > limit:
        lines.append(f"lost        ... and {len(lost) - limit} more: {', '.join(p(r['code']) for r in lost[limit:])}")
    for r in d["coverage"]["gained"]:
        lines.append(f"gained      {p(r['code'])}: ran on B, on A {p(r['on_a'])}")
    for side, why in d["incomplete"].items():
        for w in why:
            lines.append(f"incomplete  {side.upper()}: {p(w)}")
    for note in d["stats_notes"]:
        lines.append(f"note        {p(note)}")
    moved = [s for s in d["stats"] if s["moved"] or every]
    for s in moved:
        z = "" if s["z"] is None else f" (z {s['z']:+.1f})"
        tag = "moved" if s["moved"] else "held"
        lines.append(f"{tag:<11} {p(s['stat'])}: {_fmt(s['a'])} -> {_fmt(s['b'])}{z}")
    n_changed = sum(len(f[k]) for k in ("appeared", "disappeared", "changed"))
    n_moved = sum(s["moved"] for s in d["stats"])
    n_lost = len(d["coverage"]["lost"])
    verdict = {0: "ok", 1: "FAIL", 2: "INCOMPLETE"}[d["exit_code"]]
    lines.append(
        f"{verdict}: {d['new_errors']} new error finding{'s' if d['new_errors'] != 1 else ''}; "
        f"{n_lost} check{'s' if n_lost != 1 else ''} that ran on A not run on B"
        f"{'' if d['lost_coverage_fails'] or not n_lost else ' (allowed)'}; "
        f"{n_changed} code{'s' if n_changed != 1 else ''} changed; {n_moved} of {len(d['stats'])} statistics "
        f"moved beyond noise (|z| > {d['z_noise']:g})"
    )
    return "\n".join(lines)
