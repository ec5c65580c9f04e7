"""One trajectory's transcript, token by token, coloured by provenance (`rollout-audit show`)."""

from __future__ import annotations

import polars as pl

from .log import Log
from .report import MAX_CHARS, printable
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
    """Plain or ANSI-coloured text: a header, then per turn its tokens with mask and log-prob.
    Log strings are printed as text (never as rich markup) with control characters escaped."""
    from io import StringIO

    from rich.console import Console
    from rich.text import Text

    buf = StringIO()
    con = Console(file=buf, force_terminal=color, no_color=not color, width=110, highlight=False)
    con.print(
        Text.assemble(
            (_v(scalars.get("trajectory_id")), "bold"),
            f" task {_v(scalars.get('task_id'))} stop {_v(scalars.get('stop_reason'))} "
            f"reward {_v(scalars.get('reward'))}",
        )
    )
    legend = [("legend: ", "")] + [(f"{v}  ", _STYLE[k]) for k, v in SOURCE_NAMES.items()]
    con.print(Text.assemble(*legend, " * = in the loss, lp = behaviour log-prob"))
    info = {r["turn"]: r for r in turns.iter_rows(named=True)}
    for (turn,), grp in toks.group_by("token_turn", maintain_order=True):
        t = info.get(turn, {})
        head = f"turn {turn}" if turn is not None and turn >= 0 else "prompt"
        if t:
            head += (
                f"  v{_v(t.get('policy_version'))} action {_v(t.get('parsed_action') or t.get('action_text'))} "
                f"logprob {_v(t.get('logprob'))} reward {_v(t.get('reward'))}"
            )
        con.print(Text(head, style="bold"))
        line = Text("  ")
        for r in grp.iter_rows(named=True):
            star = "*" if r["loss_mask"] else ""
            val = r.get("behavior_logprobs")  # absent when the framework does not record it
            lp = f"({val:.3f})" if val is not None else ""
            line.append(f"{r['token_ids']}{star}{lp} ", style=_STYLE.get(r["token_source"], "red"))
        con.print(line)
    return buf.getvalue().rstrip()


def _v(value: object) -> str:
    """A log value for the transcript: control characters escaped, long values cut."""
    s = printable(value)
    return s if len(s) <= MAX_CHARS else f"{s[:MAX_CHARS]}… ({len(s)} characters)"
