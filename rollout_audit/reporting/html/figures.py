"""The report's plots, one per place where catalogued faults show: trainable share and log-probs by
token source (M1xx, L2xx), recorded vs recomputed denominators and advantages (U601, U603), policy
lag (P503), reward vs verifier success per task (R4xx), stop causes per policy version (T3xx)."""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from ..report import Report, num, printable
from .svg import FAULT, HELD, NEUTRAL, PALETTE, REWARD_FAILURE, REWARD_SUCCESS, bars, boxes, dots, scatter, stacked

MAX_BARS = 12


def figures(rep: Report, stats: dict) -> list[str]:
    """Every figure in order; a figure without data says why instead of disappearing."""
    dist = stats.get("distributions", {})
    checks = rep.summary.get("statistics", {}) or {}
    makers: list[tuple[str, Callable[[], str]]] = [
        ("trainable share by token source", lambda: _trainable(dist.get("by_source", []))),
        ("behaviour log-prob by token source", lambda: _logprobs(dist.get("by_source", []))),
        ("loss denominator per update", lambda: _recomputed(rep, checks, "U601", "loss denominator per update")),
        ("advantage per batch member", lambda: _recomputed(rep, checks, "U603", "advantage per batch member")),
        ("policy lag of trained trajectories", lambda: _lag(rep, checks)),
        ("reward vs verifier success per task", lambda: _tasks(dist.get("tasks", []))),
        ("stop causes per policy version", lambda: _stops(dist.get("stops_by_version", []))),
    ]
    return [fig() or _missing(title, "no data in this log") for title, fig in makers]


def _missing(title: str, why: str) -> str:
    return f'<figure class="plot missing"><strong>{escape(title)}</strong><p class="note">{escape(why)}</p></figure>'


def _trainable(rows: list[dict]) -> str:
    """Share of each source's tokens in the loss: only policy tokens belong there."""
    items = [
        (
            r["source"],
            r["trainable"] / r["tokens"] if r["tokens"] else 0.0,
            HELD if r["source"] == "policy" else (FAULT if r["trainable"] else NEUTRAL),
        )
        for r in rows
    ]
    counts = {r["source"]: (r["trainable"], r["tokens"]) for r in rows}
    return bars(
        "trainable share by token source",
        items,
        fmt=lambda v: f"{v:.1%}",
        note="in the loss / all tokens of that source: "
        + "; ".join(f"{k} {a} of {b}" for k, (a, b) in counts.items())
        + ".",
        legend=[
            ("box", HELD, "policy"),
            ("box", NEUTRAL, "other source, not trained"),
            ("box", FAULT, "other source trained on (M101)"),
        ],
    )


def _logprobs(rows: list[dict]) -> str:
    """Recorded behaviour log-prob quantiles per source (box 25–75 %, thick 5–95 %, whiskers min–max)."""
    box_rows = []
    for r in rows:
        q = {k: r.get(k) for k in ("min", "q05", "q25", "q50", "q75", "q95", "max", "n")}
        q["colour"] = HELD if r["source"] == "policy" else NEUTRAL
        if r.get("positive"):
            q["colour"] = FAULT
        box_rows.append((r["source"], q))
    recorded = "; ".join(f"{r['source']} {r.get('n', 0)} recorded, {r.get('positive', 0)} > 0" for r in rows)
    return boxes(
        "behaviour log-prob by token source",
        box_rows,
        note=f"{recorded}. A log-prob must be ≤ 0 and belong to policy tokens only.",
        zero="0: no log-prob lies above it",
        legend=[("box", HELD, "policy"), ("box", NEUTRAL, "other source"), ("box", FAULT, "a log-prob > 0")],
    )


def _recomputed(rep: Report, checks: dict, code: str, title: str) -> str:
    """Recorded against recomputed values, as the check `code` recomputed them."""
    if code in rep.not_run:
        return _missing(title, f"{code} not run: {printable(rep.not_run[code])}")
    pts = checks.get(code) or []
    if not isinstance(pts, list):
        return ""
    what = "loss_denominator" if code == "U601" else "advantage"
    return scatter(
        f"{title} ({code})",
        [(p.get("expected"), p.get("recorded")) for p in pts if isinstance(p, dict)],
        f"recomputed {what}",
        f"recorded {what}",
        note=f"Up to 200 evenly spaced points; {code} lists every mismatch.",
    )


def _lag(rep: Report, checks: dict) -> str:
    """Histogram of trainer_version − oldest policy_version over the trajectories each update trains on."""
    p = checks.get("P503") or {}
    hist = p.get("lag_histogram") if isinstance(p, dict) else None
    if not hist:
        why = rep.not_run.get("P503", "no update records")
        return _missing("policy lag of trained trajectories", printable(why))
    lags = sorted((int(k), int(v)) for k, v in hist.items())
    if len(lags) > MAX_BARS:  # keep the first lags, pool the long tail
        head, tail = lags[: MAX_BARS - 1], lags[MAX_BARS - 1 :]
        items = [(f"lag {k}", float(v), _lag_colour(k)) for k, v in head]
        items.append((f"lag {tail[0][0]}–{tail[-1][0]}", float(sum(v for _, v in tail)), _lag_colour(tail[0][0])))
    else:
        items = [(f"lag {k}", float(v), _lag_colour(k)) for k, v in lags]
    note = printable(p.get("note", "")) if isinstance(p, dict) else ""
    return bars(
        "policy lag of trained trajectories (P503)",
        items,
        note=f"trajectory uses by updates; max lag {num(p.get('max_lag'))}. {note}".strip(),
        legend=[
            ("box", PALETTE[0], "trajectory uses"),
            ("box", FAULT, "negative lag: weights newer than the trainer's"),
        ],
    )


def _lag_colour(k: int) -> str:
    return FAULT if k < 0 else PALETTE[0]


def _tasks(rows: list[dict]) -> str:
    """Mean reward of successful and failed episodes per task: a failure paid more than a success is a fault."""
    data = [
        (
            f"{r['task']} (n={r['episodes']})",
            {"reward | success": r.get("reward_success"), "reward | failure": r.get("reward_failure")},
            _gt(r.get("reward_failure"), r.get("reward_success")),
        )
        for r in rows
    ]
    inverted = [r["task"] for r in rows if _gt(r.get("reward_failure"), r.get("reward_success"))]
    note = f"failures paid more than successes in: {', '.join(map(printable, inverted))}" if inverted else ""
    return dots(
        "reward vs verifier success per task",
        data,
        {"reward | success": REWARD_SUCCESS, "reward | failure": REWARD_FAILURE},
        note=note or "Successes are paid more than failures in every task.",
        flagged="task whose failures are paid more",
    )


def _gt(a: object, b: object) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > b


def _stops(rows: list[dict]) -> str:
    """Share of each stop cause among the episodes finished by each (binned) policy version."""
    return stacked(
        "stop causes per policy version",
        [(r["versions"], r["stops"]) for r in rows],
        note="Episodes by the policy version of their last turn; versions binned when there are many.",
    )
