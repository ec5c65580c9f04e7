"""One trajectory's transcript (`rollout-audit show`): decoded text coloured by provenance, trained
tokens underlined, trained non-policy tokens flagged, and the codes of the findings at their tokens."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import polars as pl
import pyarrow.parquet as pq
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ..contract.schema import POLICY, SOURCE_NAMES
from ..reading.log import Log
from .decode import Decoder, declared, from_declaration
from .report import MAX_CHARS, num, printable

_STYLE = {0: "magenta", 1: "cyan", 2: "green", 3: "yellow", 4: "bright_black"}
TRAINED = "underline"
WRONG = "bold white on red"  # a token in the loss that the policy did not sample
WRONG_MARK = "!"
INDENT = 2
_TOKEN_FIELDS = {"token_source": pl.Int8, "loss_mask": pl.Boolean, "token_turn": pl.Int32}


@dataclass
class Transcript:
    """What `show` prints: the trajectory's scalars, its tokens and turns, the file's metadata, and
    the findings of an audit of this trajectory (with their turn and position where known)."""

    scalars: dict
    tokens: pl.DataFrame
    turns: pl.DataFrame
    meta: Mapping[bytes, bytes] = field(default_factory=dict)
    findings: pl.DataFrame | None = None


def transcript(log: Log, trajectory_id: str, findings: pl.DataFrame | None = None) -> Transcript:
    """The trajectory's rows, its file's metadata and, of an audit's `findings` (those of the whole
    log, as `check` reports them), the ones that name this trajectory; KeyError when it is not in the log."""
    row = log.trajectories.filter(pl.col("trajectory_id") == trajectory_id).collect()
    if row.height == 0:
        raise KeyError(f"trajectory {trajectory_id!r} is not in the log")
    toks = log.tokens.filter(pl.col("trajectory_id") == trajectory_id).collect()
    toks = toks.with_columns(  # a list the log lacks (S001 says so) is shown as unknown, never a crash
        pl.lit(None, dtype).alias(name) for name, dtype in _TOKEN_FIELDS.items() if name not in toks.columns
    )
    turns = log.turns.filter(pl.col("trajectory_id") == trajectory_id).collect()
    scalars = {k: v for k, v in row.row(0, named=True).items() if not isinstance(v, list)}
    meta = pq.read_schema(scalars["file"]).metadata or {} if scalars.get("file") else {}
    mine = None
    if findings is not None:
        mine = findings.filter(pl.col("trajectory_id") == trajectory_id).select(
            "code", "severity", "turn", "position", "message"
        )
    return Transcript(scalars, toks, turns, meta, mine)


def decoder_for(t: Transcript, given: Decoder | None) -> tuple[Decoder | None, str]:
    """The decoder to use and a line saying where it comes from (or why the ids are shown)."""
    if given is not None:
        return given, f"decoded with {printable(given.name)}"
    d = from_declaration(t.meta)
    if d is not None:
        return d, f"decoded with the vocabulary the log declares ({printable(d.name)})"
    name = declared(t.meta).get("name") or t.scalars.get("tokenizer_id")
    if name:
        return None, f"token ids (the log names tokenizer {name!r}: pass --tokenizer DIR to decode)"
    return None, "token ids (pass --tokenizer DIR to decode)"


def render(t: Transcript, *, color: bool, width: int, decoder: Decoder | None = None, ids: bool = False) -> str:
    """The transcript as plain or ANSI text, `width` columns wide; wrapped token lines keep their indent.
    Log strings are rich Text (never parsed as markup) with control characters escaped."""
    from io import StringIO

    dec, source_line = decoder_for(t, decoder)
    buf = StringIO()
    con = Console(
        file=buf,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,  # every style here is one of the 16 basic colours
        width=width,
        highlight=False,
        emoji=False,
    )
    s = t.scalars
    con.print(
        Text.assemble(
            (_v(s.get("trajectory_id")), "bold"),
            f"  task {_v(s.get('task_id'))}  stop {_v(s.get('stop_reason'))}  reward {_num(s.get('reward'))}"
            + (f"  {_verdict(s.get('verifier_success'))}" if "verifier_success" in s else ""),
        )
    )
    con.print(Text(source_line, style="dim"))
    toks = t.tokens
    pieces = dec.pieces(toks["token_ids"].to_list()) if dec is not None else None
    marks = _marks(t.findings)
    con.print(_legend(toks, marks, color))
    _print_trajectory_findings(con, t.findings)
    info = {r["turn"]: r for r in t.turns.iter_rows(named=True)}
    idx = toks.with_row_index("_i")
    for (turn,), grp in idx.group_by("token_turn", maintain_order=True):
        con.print(_turn_header(turn, info.get(turn, {}), t.findings))
        line = _tokens(grp, pieces, marks, ids, color)
        con.print(Padding(line, (0, 0, 0, INDENT), expand=False))
        obs = info.get(turn, {}).get("observation_text")
        if obs:
            con.print(Padding(Text.assemble(("observation: ", "italic"), _v(obs)), (0, 0, 0, INDENT), expand=False))
    return "\n".join(_TRAILING.sub(r"\1", line) for line in buf.getvalue().rstrip().splitlines())


_TRAILING = re.compile(r" +((?:\x1b\[[0-9;]*m)*)$")  # the padding rich adds to wrapped lines, before any reset code


def _tokens(grp: pl.DataFrame, pieces: list[str] | None, marks: dict[int, list[str]], ids: bool, color: bool) -> Text:
    """One turn's tokens: provenance colour, underlined (`*` without colour) when trained, flagged with
    `!` when trained but not sampled by the policy."""
    line = Text()
    prev_src = None
    has_lp = "behavior_logprobs" in grp.columns
    for r in grp.iter_rows(named=True):
        src = r["token_source"]
        if src != prev_src:  # provenance stays readable without colour
            line.append(f"‹{SOURCE_NAMES.get(src, src)}› ", style="dim")
            prev_src = src
        tid = r["token_ids"]
        text = _piece(pieces[r["_i"]]) if pieces is not None else str(tid)
        if pieces is not None and ids:
            text += f"#{tid}"
        trained = bool(r["loss_mask"])
        style = _STYLE.get(src, "red") + (f" {TRAINED}" if trained else "")
        if trained and src != POLICY:
            style, text = WRONG, WRONG_MARK + text
        elif trained and not color:
            text += "*"
        line.append(text, style=style)
        lp = r.get("behavior_logprobs") if has_lp else None
        if ids and lp is not None:
            line.append(f"({num(lp, 3)})", style="dim")
        for code in marks.get(r["position"], []):
            line.append(f"⟨{code}⟩", style="bold red")
        line.append(" ")
    return line


def _piece(s: str) -> str:
    """A token's text shown as one word: inner whitespace kept visible, control characters escaped."""
    core = s.strip(" ")
    return printable(core) if core else "␣"


def _marks(findings: pl.DataFrame | None) -> dict[int, list[str]]:
    """position -> codes of the findings located at that token."""
    if findings is None or findings.is_empty():
        return {}
    at = findings.filter(pl.col("position").is_not_null()).group_by("position").agg(pl.col("code").unique().sort())
    return {int(p): codes for p, codes in at.iter_rows()}


def _legend(toks: pl.DataFrame, marks: dict[int, list[str]], color: bool) -> Text:
    """Only the marks that appear in this transcript."""
    present = set(toks["token_source"].unique().to_list())
    parts: list[str | tuple[str, str]] = ["legend: "]
    if color:
        parts += [(f"{SOURCE_NAMES[k]}  ", _STYLE[k]) for k in SOURCE_NAMES if k in present]
    trained = toks.filter(pl.col("loss_mask").fill_null(False))
    if trained.height:
        parts += (
            [("underlined", TRAINED), " = in the loss  "] if color else ["‹source› starts a span, * = in the loss  "]
        )
    if (trained["token_source"] != POLICY).any():
        parts += [(f"{WRONG_MARK}token", WRONG), " = in the loss but not sampled by the policy  "]
    if marks:
        parts += [("⟨CODE⟩", "bold red"), " = a finding at this token (rollout-audit explain CODE)"]
    return Text.assemble(*parts)


def _turn_header(turn: int | None, t: dict, findings: pl.DataFrame | None) -> Table:
    """`turn 3  v2  action …  logprob -1.234  reward 0.1  [codes]`, numbers to 4 significant digits."""
    label = Text(f"turn {turn}" if turn is not None and turn >= 0 else "prompt", style="bold")
    rest = Text()
    if t:
        rest.append(
            f"v{_v(t.get('policy_version'))}  action {_v(t.get('parsed_action') or t.get('action_text'))}"
            f"  logprob {_num(t.get('logprob'))}  reward {_num(t.get('reward'))}"
        )
    if findings is not None and turn is not None:
        codes = findings.filter((pl.col("turn") == turn) & pl.col("position").is_null())["code"].unique().sort()
        if codes.len():
            rest.append("  " + " ".join(f"⟨{c}⟩" for c in codes), style="bold red")
    grid = Table.grid(padding=(0, 2))  # a long header wraps under its own start, not under "turn"
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(label, rest)
    return grid


def _print_trajectory_findings(con: Console, findings: pl.DataFrame | None) -> None:
    """Findings about this trajectory as a whole (neither turn nor token), one line each."""
    if findings is None:
        return
    whole = findings.filter(pl.col("turn").is_null() & pl.col("position").is_null())
    for r in whole.head(10).iter_rows(named=True):
        con.print(Text.assemble((f"⟨{r['code']}⟩ ", "bold red"), _v(r["message"])))


def _num(v: object) -> str:
    """A number as every output writes one (log-probs, rewards); other values as text."""
    if isinstance(v, float):
        return num(v, 4)
    return _v(v)


def _v(value: object) -> str:
    """A log value for the transcript: control characters escaped, long values cut."""
    s = printable(value)
    return s if len(s) <= MAX_CHARS else f"{s[:MAX_CHARS]}… ({len(s)} characters)"


def _verdict(success: object) -> str:
    """The verifier's verdict in words (`verifier_success`)."""
    return {True: "verified success", False: "verified failure", None: "not verified"}.get(
        success if isinstance(success, bool) or success is None else None, f"verifier {_v(success)}"
    )
