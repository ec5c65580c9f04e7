"""One trajectory's transcript, token by token, coloured by provenance (`rollout-audit show`)."""

from __future__ import annotations

import polars as pl

from .log import Log
from .schema import SOURCE_NAMES

_STYLE = {0: "magenta", 1: "cyan", 2: "green", 3: "yellow", 4: "bright_black"}


def transcript(log: Log, trajectory_id: str) -> tuple[dict, pl.DataFrame, pl.DataFrame]:
    """(scalar fields, tokens, turns) of one trajectory; KeyError when it is not in the log."""
    row = log.trajectories.filter(pl.col("trajectory_id") == trajectory_id).collect()
    if row.height == 0:
        raise KeyError(f"trajectory {trajectory_id!r} is not in the log")
    toks = log.tokens.filter(pl.col("trajectory_id") == trajectory_id).collect()
    turns = log.turns.filter(pl.col("trajectory_id") == trajectory_id).collect()
    scalars = {k: v for k, v in row.row(0, named=True).items() if not isinstance(v, list)}
    return scalars, toks, turns


def render(scalars: dict, toks: pl.DataFrame, turns: pl.DataFrame, color: bool) -> str:
    """Plain or ANSI-coloured text: a header, then per turn its tokens with mask and log-prob."""
    from io import StringIO

    from rich.console import Console

    buf = StringIO()
    con = Console(file=buf, force_terminal=color, no_color=not color, width=110, highlight=False)
    con.print(
        f"[bold]{scalars.get('trajectory_id')}[/] task {scalars.get('task_id')} "
        f"stop {scalars.get('stop_reason')} reward {scalars.get('reward')}"
    )
    con.print(
        "legend: "
        + "  ".join(f"[{_STYLE[k]}]{v}[/]" for k, v in SOURCE_NAMES.items())
        + "   * = in the loss, lp = behaviour log-prob"
    )
    info = {r["turn"]: r for r in turns.iter_rows(named=True)}
    for (turn,), grp in toks.group_by("token_turn", maintain_order=True):
        t = info.get(turn, {})
        head = f"turn {turn}" if turn >= 0 else "prompt"
        if t:
            head += (
                f"  v{t.get('policy_version')} action {t.get('parsed_action') or t.get('action_text')} "
                f"logprob {t.get('logprob')} reward {t.get('reward')}"
            )
        con.print(f"[bold]{head}[/]")
        parts = []
        for r in grp.iter_rows(named=True):
            s = r["token_source"]
            star = "*" if r["loss_mask"] else ""
            lp = f"({r['behavior_logprobs']:.3f})" if r["behavior_logprobs"] is not None else ""
            parts.append(f"[{_STYLE.get(s, 'red')}]{r['token_ids']}{star}{lp}[/]")
        con.print("  " + " ".join(parts))
    return buf.getvalue().rstrip()
