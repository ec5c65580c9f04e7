"""The `rollout-audit` command line. Exit codes: 0 clean, 1 error findings, 2 unusable input."""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

import click

from .contract.errors import RolloutAuditError, UsageError

FORMATS = ("text", "concise", "json", "github", "junit")


def _codes(values: tuple[str, ...]) -> list[str]:
    """Comma-separated codes; an empty one (`--ignore ""`, `M,,L`) would match every check: refused."""
    codes = [c.strip().upper() for v in values for c in v.split(",")]
    if any(not c for c in codes):
        _fail("an empty check code or prefix matches every check; remove it")
    return codes


def _known_codes(values: tuple[str, ...]) -> list[str]:
    """`_codes`, each one a check's code or a prefix of one."""
    from .checks import all_rules

    codes = _codes(values)
    known = all_rules()
    for c in codes:
        if not any(k.startswith(c) for k in known):
            _fail(f"unknown check code or prefix {c!r}; see `rollout-audit explain --list`")
    return codes


def _fail(msg: str) -> NoReturn:
    click.echo(f"rollout-audit: error: {msg}", err=True)
    sys.exit(2)


class _Group(click.Group):
    """Turn click's usage errors into exit code 2 (its default) and anything unexpected into a
    one-line message instead of a traceback; every error in one style, `rollout-audit: error: …`."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.Abort:
            click.echo("rollout-audit: error: aborted", err=True)
            sys.exit(1)
        except click.ClickException as e:
            if isinstance(e, click.UsageError) and e.ctx is not None:
                click.echo(f"{e.ctx.get_usage()}\nTry '{e.ctx.command_path} -h' for help.", err=True)
            click.echo(f"rollout-audit: error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        sys.exit(code if isinstance(code, int) else 0)

    def format_commands(self, ctx, formatter) -> None:
        """Each command with the whole first sentence of its help, never cut at 45 characters."""
        rows = [(n, c.get_short_help_str(limit=200)) for n, c in self.commands.items() if not c.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort, SystemExit, KeyboardInterrupt):
            raise
        except BrokenPipeError:  # output piped into `head`: not an error
            sys.stderr.close()
            sys.exit(0)
        except BaseException as e:  # noqa: BLE001 - native panics too: a message, never a traceback
            if isinstance(e, RolloutAuditError):  # a message for the user: one line
                _fail(_first_line(e))
            if isinstance(e, OSError):  # the system refused a path (absent, unreadable, full): its message names it
                _fail(_first_line(e))
            _fail(f"internal error: {type(e).__name__}: {_first_line(e)} (please report this)")


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rollout-audit")
def main() -> None:
    """Audit rollout logs of RL-trained LLM agents before training: recompute what a log claims
    (masks, log-probs, rewards, loss denominators, policy versions) and report each disagreement
    with a stable check code, its file, trajectory, turn and token position.

    \b
    Examples:
      rollout-audit check logs/                  audit one log (a directory of Parquet files)
      rollout-audit check run1/ run2/            two logs, each audited on its own (--merge: as one)
      rollout-audit check logs/ --format concise one finding per line, for grep and editors
      rollout-audit check logs/ --select M,L201 --ignore R409 --strict
      rollout-audit explain U602                 the rule, the lesson, what to fix
      rollout-audit explain M                    the checks of one family
      rollout-audit demo                         train the reference agent, audit its log

    \b
    Exit codes (check, report):
      0  every selected check that had its inputs ran and held
      1  findings that block training (errors; warnings too with --strict)
      2  the audit could not be completed: a check crashed, no usable input,
         bad configuration or usage
    """


@main.command()
@click.argument("paths", nargs=-1, required=False, type=click.Path())
@click.option("--select", multiple=True, help="Codes or prefixes to run (e.g. M,L201). Default: all.")
@click.option("--ignore", multiple=True, help="Codes or prefixes to skip.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="TOML file with a [tool.rollout-audit] table (default: nearest pyproject.toml).",
)
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option(
    "--preview", is_flag=True, help="Also run the checks in preview (new, not yet stable; `explain --list` marks them)."
)
@click.option("--show-all", is_flag=True, help="Text format: show every finding, not a sample per code.")
@click.option("-q", "--quiet", is_flag=True, help="Text and concise formats: the findings only; nothing when clean.")
@click.option(
    "--color/--no-color",
    default=None,
    help="Colour the text format (default: when stdout is a terminal and NO_COLOR is unset).",
)
@click.option("--show-not-run", is_flag=True, help="Text format: each check not run with its reason, one per line.")
@click.option(
    "--merge",
    is_flag=True,
    help="Audit all PATHS as one log (partitions of one log); by default each PATH is a log of its own.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the report to this file instead of stdout.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Batches checked at once (2: ~13% faster on 2 cores, one more batch in memory; benchmarks/README.md).",
)
@click.option("--show-settings", is_flag=True, help="Print the configuration in use and where it came from, then exit.")
@click.option(
    "--from",
    "framework",
    default=None,
    help="PATHS are a trainer's dump (JSON Lines or Parquet records) to convert in memory first: "
    "verl, skyrl, slime, rllm, verifiers or openai.",
)
@click.option(
    "--context", "context", multiple=True, metavar="KEY=VALUE", help="With --from: what the trainer does not record."
)
@click.option(
    "--replay",
    "replay",
    type=click.IntRange(0),
    default=None,
    help="Replay N trajectories stratified by policy version (L205-L207, L209; needs a configured replayer).",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="local",
    default=None,
    metavar="[ADDRESS]",
    help="Run on a Ray cluster: ADDRESS, or alone (put it after PATHS) for a local cluster of --workers CPUs "
    "(needs the distributed extra).",
)
@click.option(
    "--baseline",
    "baseline",
    type=click.Path(dir_okay=False),
    default=None,
    help="Fail only on findings not recorded in this baseline file (default: `baseline` of the configuration).",
)
@click.option(
    "--write-baseline",
    "write_baseline",
    type=click.Path(dir_okay=False),
    default=None,
    help="Record today's findings in this file (for --baseline) and exit 0.",
)
def check(
    paths,
    select,
    ignore,
    fmt,
    config_path,
    strict,
    show_all,
    quiet,
    color,
    merge,
    output,
    workers,
    show_settings,
    replay,
    framework,
    context,
    ray_address,
    baseline=None,
    write_baseline=None,
    show_not_run=False,
    preview=False,
) -> None:
    """Audit the log at each PATH (a directory of Parquet files, or one file; local, or an s3://,
    gs:// or file:// URI).

    Each PATH is audited as a log of its own, with the configuration found next to it (the
    nearest pyproject.toml with [tool.rollout-audit] at or above it; one inside PATH came with
    the log and may state only how the run was produced: see --show-settings); --merge audits all PATHS
    as one log, e.g. partitions kept in separate directories. With several logs the text
    formats print a `== PATH ==` header before each report, JSON is {"logs": [{"path", ...}]},
    and the exit code is the worst of them.

    Exit 0: every selected check that had its inputs ran and held. 1: findings that block
    training. 2: the audit could not be completed (a check crashed, no usable input, bad
    configuration).
    """
    from .contract.config import LOG_CONTEXT
    from .reporting.outputs import check_output, write_atomic

    if ray_address not in (None, "local", "auto") and "://" not in ray_address and os.path.exists(ray_address):
        paths, ray_address = (ray_address, *paths), "local"  # `--ray PATH`: a local cluster, then the path
    if not paths:
        raise click.UsageError("Missing argument 'PATHS...'.")
    if show_settings:
        from .session import Request, configure

        cfg, file = configure(Request(source=list(paths), config_file=config_path, replay=replay, preview=preview))
        click.echo(f"# configuration: {cfg.source if ', over ' in cfg.source else file or cfg.source}")
        click.echo(f"# a configuration inside the audited directory may set only: {', '.join(LOG_CONTEXT)}")
        click.echo("[tool.rollout-audit]\n" + _toml(cfg.settings()))
        return
    sel, ign = _known_codes(select), _known_codes(ignore)
    for out in (output, write_baseline):
        if out:
            check_output(out, paths)
    from .running.options import Options

    ray = None if ray_address is None else (True if ray_address == "local" else ray_address)
    opts = Options(select=tuple(sel), ignore=tuple(ign), workers=workers, ray=ray, tune=True)
    found = [(list(paths), None)] if merge or framework else _logs_of(paths)
    logs = [log for log, _ in found]
    within = dict((id(log), w) for log, w in found)
    if (baseline or write_baseline) and len(logs) > 1:
        _fail("a baseline belongs to one log: give one PATH, or --merge")
    from .running.cluster import quiet_ray
    from .session import Request, run

    def request(log: list[str]) -> Request:
        return Request(
            source=log,
            framework=framework,
            context=_context(context),
            config_file=config_path,
            replay=replay,
            preview=preview,
            options=opts,
            baseline=baseline,
            use_baseline=not write_baseline,
            log_root=within[id(log)],  # the directory of runs it was found in: its trust boundary
        )

    with quiet_ray(opts):  # Ray's own log lines never reach the user's output
        done = [(log, run(request(log))) for log in logs]
    for _, a in done:
        if a.converted is not None and a.converted.policy:  # the trainer's own policy, from its configuration
            click.echo(f"rollout-audit: note: {a.converted.policy}", err=True)
        _warn_not_dumps(a.converted)
    if write_baseline:
        _write_baseline(done[0], write_baseline)
    reports = [(log, a.report) for log, a in done]
    painted = fmt == "text" and not output and (_tty_colour() if color is None else color)
    limit = None if show_all else done[0][1].cfg.max_examples
    from .reporting.report import render_logs

    text = render_logs(reports, fmt, limit=limit, color=painted, strict=strict, quiet=quiet, show_not_run=show_not_run)
    if output:
        write_atomic(output, text + "\n")
    elif text:
        click.echo(text, color=painted)  # click strips styles off a non-terminal unless told
    for log, rep in reports:
        if fmt != "text" or output or quiet:  # the report is elsewhere or cut short: say why on stderr too
            _say_incomplete(rep, log)
    sys.exit(max(rep.exit_code(strict) for _, rep in reports))


def _toml_value(v: object) -> str:
    """A TOML value: strings, numbers and booleans as JSON writes them (TOML accepts those forms),
    lists as arrays, mappings as inline tables with quoted keys."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return json.dumps(v)


def _toml(settings: dict) -> str:
    """The settings as lines of a `[tool.rollout-audit]` table; a key with no value is a comment."""
    return "\n".join(f"# {k} = (not set)" if v is None else f"{k} = {_toml_value(v)}" for k, v in settings.items())


def _logs_of(paths: tuple[str, ...]) -> list[tuple[list[str], str | None]]:
    """Each PATH as a log of its own; a directory of runs (each run a directory with its own
    `trajectories` folder) as one log per run, said on stderr in one line. Parquet files of such a
    directory that lie in no run are audited together as one more log."""
    from .reading.io import logs_under, stray_files

    logs: list[tuple[list[str], str | None]] = []  # (paths of one log, the directory of runs it was found in)
    for p in paths:
        runs = logs_under(p)
        if runs is None:
            logs.append(([p], None))
            continue
        stray = stray_files(p, runs)
        logs += [([r], p) for r in runs] + ([(stray, p)] if stray else [])
        more = f", and {len(stray)} Parquet file(s) in none of them, audited together" if stray else ""
        click.echo(
            f"rollout-audit: {p}: {len(runs)} log{'s' if len(runs) != 1 else ''} found (directories with a "
            f"trajectories/ folder){more}; each audited on its own (--merge: all as one log)",
            err=True,
        )
    return logs


def _write_baseline(done, path) -> NoReturn:
    """Record one log's findings (after its tolerated rates) in `path`, and end the command."""
    from .workflow import policy

    log, a = done
    if not a.report.complete:
        _say_incomplete(a.report, log)
        _fail(f"the audit is incomplete: no baseline written to {path}")
    n = policy.write_baseline(path, a.report, a.ids(), a.tokens)
    click.echo(f"wrote baseline {path}: {n} finding{'s' if n != 1 else ''} recorded")
    sys.exit(0)


def _tty_colour() -> bool:
    """Colour by default only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _context(pairs: tuple[str, ...]) -> dict[str, str]:
    """`KEY=VALUE` options as keyword arguments for an adapter."""
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key.isidentifier():
            _fail(f"--context wants KEY=VALUE, not {p!r}")
        out[key] = value
    return out


def _say_incomplete(rep, paths) -> None:
    """One line on stderr per reason the audit of the log at `paths` could not be completed (exit 2),
    naming the log."""
    from .reporting.report import incomplete, printable

    for line in incomplete(rep):
        click.echo(f"rollout-audit: error: {', '.join(map(printable, paths))}: {line}", err=True)


@main.command("diff")
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--z",
    "z_noise",
    type=click.FloatRange(0, min_open=True),
    default=3.0,
    show_default=True,
    help="A statistic moved when |z| of its change is above this.",
)
@click.option("--all", "every", is_flag=True, help="Text: every statistic, not only those that moved.")
@click.option(
    "--allow-lost-coverage",
    is_flag=True,
    help="Do not fail when a check that ran on A did not run on B (still listed).",
)
def diff_cmd(a, b, fmt, config_path, z_noise, every, allow_lost_coverage) -> None:
    """What changed from log A to log B (two runs, or two step directories of one log): findings
    compared by identity (code, trajectory, place), checks that ran on A and not on B, and the
    statistics that moved beyond noise. Exit 1 when error findings are new in B or a check lost
    coverage; 2 when either audit is incomplete."""
    from .reporting.report import json_text
    from .session import Request, run
    from .workflow.diff import diff, render_diff

    done = [run(Request(source=[p], config_file=config_path, use_baseline=False)) for p in (a, b)]
    reps = [x.report for x in done]
    d = diff([a], [b], reps[0], reps[1], z_noise=z_noise, allow_lost_coverage=allow_lost_coverage)
    click.echo(json_text(d) if fmt == "json" else render_diff(d, every))
    if d["exit_code"] == 2:  # one line naming each incomplete side
        from .reporting.report import incomplete, printable

        why = [
            f"{side} {printable(p)}: {'; '.join(incomplete(r))}"
            for side, p, r in zip("AB", (a, b), reps)
            if incomplete(r)
        ]
        click.echo(f"rollout-audit: error: the diff is incomplete: {' | '.join(why)}", err=True)
    sys.exit(d["exit_code"])


@main.command("filter")
@click.argument("log", type=click.Path(exists=True))
@click.argument("out", type=click.Path(file_okay=False))
@click.option(
    "--select",
    multiple=True,
    help="Codes or prefixes whose flagged trajectories are dropped (default: every code with an error finding).",
)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False))
def filter_cmd(log, out, select, config_path) -> None:
    """Write OUT: the log at LOG without the trajectories the selected checks flagged, and without
    the updates that named them. Never writes in place; states what it dropped."""
    from .reading.io import discover
    from .reporting.outputs import check_new_directory, check_output
    from .reporting.report import printable
    from .running.options import Options
    from .session import Request, run
    from .workflow.filter import filter_log

    sel = _known_codes(select)
    check_output(out, [log], writes_log=True)
    check_new_directory(out)
    opts = Options(select=tuple(sel))
    done = run(Request(source=[log], config_file=config_path, options=opts))
    rep = done.report
    if not rep.complete:
        from .reporting.report import incomplete

        _fail(f"{printable(log)}: the audit is incomplete ({'; '.join(incomplete(rep))}): nothing written")
    import polars as pl

    from .contract.config import log_config

    f = rep.findings
    chosen = pl.any_horizontal([pl.col("code").str.starts_with(c) for c in sel]) if sel else None
    f = f.filter(pl.col("severity") == "error" if chosen is None else chosen)
    flagged = f.filter(pl.col("trajectory_id").is_not_null())
    drop = set(flagged["trajectory_id"].to_list())
    s005 = rep.findings.filter((pl.col("code") == "S005") & ~pl.col("message").str.contains("max_row_group_bytes"))
    unreadable = dict(s005.select("file", "message").unique("file", keep="first").iter_rows())  # left to refuse
    res = filter_log(discover([log]), [log], drop, out, done.cfg, log_config(log), unreadable)
    per = ", ".join(
        f"{c} {n}" for c, n in flagged.group_by("code").agg(pl.col("trajectory_id").n_unique()).sort("code").iter_rows()
    )
    click.echo(
        f"dropped {res.trajectories_dropped} trajector{'y' if res.trajectories_dropped == 1 else 'ies'}"
        f"{' (' + printable(per) + ')' if per else ''} and {res.updates_dropped} "
        f"update{'' if res.updates_dropped == 1 else 's'} that named them; wrote {printable(out)}: "
        f"{res.trajectories_kept} trajectories, {res.updates_kept} updates"
    )
    for line in res.unread:  # what was written, as the line above: stdout (stderr is for a refusal)
        click.echo(f"left out: {printable(line)}")
    unplaced = f.height - flagged.height
    if unplaced:
        click.echo(f"kept: {unplaced} finding(s) of the selected codes name no trajectory (see `check`)")
    sys.exit(_filtered_verdict(out, config_path, opts, sel, log))


def _filtered_verdict(out, config_path, opts, sel, log) -> int:
    """Audit the copy `filter` wrote, as `check OUT` would (with the same selection), print its
    verdict, and return its exit code: `filter LOG OUT && train OUT` goes ahead only on a copy
    that passes."""
    from .reporting.report import printable, verdict_line
    from .session import Request, run

    rep = run(Request(source=[out], config_file=config_path, options=opts)).report
    code = rep.exit_code()
    scope = f" (checks {', '.join(sel)})" if sel else ""
    click.echo(f"the copy{scope}: {verdict_line(rep)}")
    if code == 2:
        from .reporting.report import incomplete

        click.echo(f"rollout-audit: error: {printable(log)} filtered into {printable(out)}: the audit of the copy "
                   f"is incomplete: {'; '.join(incomplete(rep))}", err=True)  # fmt: skip
    elif code:
        codes = ", ".join(sorted(rep.codes("error")))
        click.echo(
            f"rollout-audit: error: {printable(log)} filtered into {printable(out)}: the copy does not pass"
            f"{' (' + printable(codes) + ')' if codes else ''}: findings that name no trajectory cannot be "
            f"filtered out; see `rollout-audit check {printable(out)}`",
            err=True,
        )
    return code


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--from", "framework", default=None, help="The steps are a trainer's dump files (as `check --from`).")
@click.option(
    "--context", "context", multiple=True, metavar="KEY=VALUE", help="With --from: what the trainer does not record."
)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--status",
    "status",
    type=click.Path(dir_okay=False),
    default=None,
    help="Keep this JSON file up to date: every step audited, the worst exit code, watching or stopped.",
)
@click.option(
    "--metrics",
    "metrics",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append one JSON line of audit figures per step (errors and warnings by family, trainable share, lag).",
)
@click.option(
    "--tensorboard",
    "tensorboard",
    type=click.Path(file_okay=False),
    default=None,
    help="Write the same figures as scalars to a TensorBoard event file in this directory (step = step index).",
)
@click.option("--fail-fast", is_flag=True, help="Stop at the first step that does not pass, with its exit code.")
@click.option("--interval", type=click.FloatRange(0.01), default=1.0, show_default=True, help="Seconds between polls.")
@click.option(
    "--idle",
    type=click.FloatRange(0),
    default=None,
    help="Stop after this many seconds without a new step (default: never).",
)
@click.option("--max-steps", type=click.IntRange(1), default=None, help="Stop after this many steps.")
def watch(
    directory, framework, context, config_path, status, metrics, tensorboard, fail_fast, interval, idle, max_steps
) -> None:
    """Follow DIRECTORY as a trainer writes it, and audit each new step's file once it is complete
    (moved in by a rename, or its size unchanged since the last poll). One line per step; exit with
    the worst step's exit code (0 when every step passed)."""
    from pathlib import Path

    from .reporting.outputs import check_output
    from .workflow.events import EventFile
    from .workflow.watch import Watcher, step_auditor

    for out in (status, metrics, tensorboard):  # never inside the watched log, onto a step, or into a FIFO
        if out is not None:
            check_output(out, [directory])
    root = Path(directory).resolve()
    ctx = _context(context) if framework else {}
    try:
        events = EventFile(Path(tensorboard)) if tensorboard else None
    except OSError as e:
        _fail(f"--tensorboard {tensorboard}: cannot write an event file there ({e.strerror or e})")
    w = Watcher(
        root,
        step_auditor(config_path, root, framework, ctx),
        Path(status) if status else None,
        Path(metrics) if metrics else None,
        events,
        ignore={Path(p).resolve() for p in (status, metrics, events and events.path) if p},
        native=not framework,
    )
    try:
        code = w.follow(
            lambda line: click.echo(line), interval=interval, idle=idle, fail_fast=fail_fast, max_steps=max_steps
        )
    except KeyboardInterrupt:
        code = w.finish(lambda line: click.echo(line))
    from .reporting.report import printable

    click.echo(
        f"watched {printable(directory)}: {len(w.steps)} step(s), worst exit code {w.worst}, exit {code}", err=True
    )
    sys.exit(code)


# where the lessons the checks cite come from
LECTURE = (
    "the lecture “Module 11. RL for LLM agents: tools, environments, and long trajectories” (material version 2026.23)"
)


@main.command()
@click.argument("code", required=False)
@click.option("--list", "list_all", is_flag=True, help="List every check code, by family.")
def explain(code, list_all) -> None:
    """Explain a check: the rule, the lesson it comes from, what to fix (a family letter: its checks)."""
    from .checks import all_rules
    from .contract.registry import FAMILIES

    rules = all_rules()
    want = (code or "").upper()
    if list_all or not code or want in FAMILIES:
        for fam, title in FAMILIES.items():
            members = sorted(c for c in rules if c.startswith(fam))
            if not members or (want in FAMILIES and fam != want):
                continue
            click.echo(f"{fam}  {title}")
            for c in members:
                mark = "  (preview)" if rules[c].preview else ""
                click.echo(f"  {c}  {rules[c].severity:<7}  {rules[c].name}{mark}")
        return
    found = rules.get(want)
    if found is None:
        _fail(f"unknown check code {code!r}; see `rollout-audit explain --list`")
    r = found
    from .frames.batch import contract_names

    needs = ", ".join(contract_names(r.requires)) or "nothing beyond the file list"
    extra = (f"\nReads when present: {', '.join(contract_names(r.optional))}" if r.optional else "") + (
        f"\nConfiguration: {', '.join(r.config)}" if r.config else ""
    )
    state = ", preview: runs only with --preview" if r.preview else ""
    source = f"\nLessons are those of {LECTURE}." if "Lesson" in r.explanation else ""
    click.echo(f"{r.code} ({r.severity}{state}): {r.name}\n\n{r.explanation}\n\nNeeds: {needs}{extra}{source}")


@main.command("config")
@click.argument("key", required=False)
@click.option("--list", "list_all", is_flag=True, help="List every configuration key with its description.")
def config_cmd(key, list_all) -> None:
    """Explain a configuration key: its type, default, where it may be set, and the checks that read it."""
    from .reporting.settings import key_entry, keys

    if list_all or not key:
        from .contract.config import Config

        for k in keys():
            click.echo(f"{k:<26} {Config.model_fields[k].description}")
        return
    click.echo(key_entry(key))


@main.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def schema(fmt) -> None:
    """Print the log contract (columns, types, requirement levels)."""
    from .contract import schema as S

    if fmt == "json":
        click.echo(json.dumps(S.contract(), indent=1))
        return
    doc = S.contract()
    click.echo(f"rollout log contract v{doc['version']}  (R required, C recommended, O optional)")
    for table, title in (
        ("trajectories", "trajectory records: one row per episode"),
        ("turn", "turn struct: one element of `turns` per agent turn"),
        ("updates", "update records: one row per optimizer update"),
    ):
        click.echo(f"\n{title}")
        for c in S.columns(table):
            click.echo(f"  {c.name:<24} {c.type:<20} {c.requirement}  {c.meaning}")
    click.echo("\nstop reasons: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in doc["stop_reasons"].items()))
    click.echo("token_source: " + ", ".join(f"{k} {v}" for k, v in doc["token_source"].items()))


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def stats(paths, fmt) -> None:
    """Counts, trainable share, stop causes, rewards, groups and policy versions of a log."""
    from .reading.log import scan
    from .reporting.report import json_text
    from .reporting.stats import log_stats, render_stats

    log = scan(paths)
    _warn_unreadable(log.broken)
    d = log_stats(log)
    click.echo(json_text(d) if fmt == "json" else render_stats(d))


def _warn_not_dumps(conv) -> None:
    """One line on stderr per file of a dump directory that is not a dump file (named, never skipped silently)."""
    from .reporting.report import printable

    for f in conv.skipped if conv is not None else ():
        click.echo(
            f"rollout-audit: warning: {printable(f)}: not a dump file (.jsonl, .jsonl.gz, .parquet); not read", err=True
        )


def _warn_unreadable(broken: list[tuple[str, str]]) -> None:
    """One line on stderr per file left out (S005 in an audit), so partial statistics say so."""
    from .reporting.report import printable

    for path, why in broken:
        click.echo(f"rollout-audit: warning: {printable(path)} left out: {printable(why)}", err=True)


@main.command()
@click.argument("path", type=click.Path())
@click.argument("trajectory_id")
@click.option("--color/--no-color", default=None, help="Colour by provenance (default: when stdout is a terminal).")
@click.option(
    "--tokenizer",
    "tokenizer_dir",
    type=click.Path(),
    help="A local Hugging Face tokenizer directory to decode with (needs transformers). "
    "Default: the vocabulary the log declares, else token ids.",
)
@click.option("--ids", is_flag=True, help="Also print each token's id and behaviour log-prob.")
@click.option("--width", type=click.IntRange(40, 1000), default=None, help="Columns (default: the terminal's).")
def show(path, trajectory_id, color, tokenizer_dir, ids, width) -> None:
    """Print one trajectory turn by turn: decoded text coloured by provenance, trained tokens underlined,
    trained non-policy tokens flagged with !, findings' codes next to their tokens, observations and rewards.
    The findings are those `rollout-audit check PATH` reports on this trajectory."""
    import shutil

    import polars as pl

    from .reading.log import scan
    from .reporting.decode import DecodeError, from_directory
    from .reporting.show import render, transcript
    from .running.options import Options
    from .session import Request, run

    log = scan(path)
    _warn_unreadable(log.broken)
    try:
        dec = from_directory(tokenizer_dir) if tokenizer_dir else None
    except DecodeError as e:
        _fail(str(e))
    if log.trajectories.filter(pl.col("trajectory_id") == trajectory_id).select(pl.len()).collect().item() == 0:
        _fail(f"trajectory {trajectory_id!r} is not in the log")
    # the findings `rollout-audit check PATH` reports: the same audit, settled by the same configuration
    rep = run(Request(source=[path], options=Options(tune=True))).report
    try:
        t = transcript(log, trajectory_id, rep.findings)
    except KeyError as e:
        _fail(str(e.args[0]))
    cols = width or shutil.get_terminal_size((100, 24)).columns
    use = sys.stdout.isatty() if color is None else color
    click.echo(render(t, color=use, width=cols, decoder=dec, ids=ids), color=use)  # --color survives a pipe


@main.command("convert")
@click.option("--from", "framework", required=True, help="verl, skyrl, slime, rllm, verifiers or openai.")
@click.argument("src", type=click.Path(exists=True))
@click.argument("dst", type=click.Path(file_okay=False))
@click.option("--context", "context", multiple=True, metavar="KEY=VALUE", help="What the trainer does not record.")
def convert_cmd(framework, src, dst, context) -> None:
    """Convert a trainer's dump (SRC: JSON Lines or Parquet records) into a contract log in DST."""
    from pathlib import Path

    from .adapters.convert import write_table
    from .reporting.outputs import atomic_directory, check_new_directory, check_output

    check_output(dst, [src])  # a dump is not a contract log: DST may sit next to it, never inside it
    check_new_directory(dst)
    from .adapters.convert import convert
    from .session import policy_table

    conv = convert(framework, [src], _context(context))
    from .contract.config import Config
    from .session import with_policy

    policy = with_policy(Config(), conv)  # validated under the trainer's own stop reasons
    trajectories, updates = conv.tables()
    with atomic_directory(dst) as tmp:  # DST appears whole or not at all
        for name, table in (("trajectories", trajectories), ("updates", updates)):
            if table is not None and table.num_rows:
                (tmp / name).mkdir(parents=True, exist_ok=True)
                try:
                    write_table(tmp / name / "part-0000.parquet", table, name, config=policy)
                except RolloutAuditError as e:  # the refusal names the dump the records came from
                    from .reporting.report import printable

                    _fail(f"{printable(src)}: its {name} do not convert to the contract: {_first_line(e)}")
        if conv.settings:  # the trainer's policy travels with the log: `check DST` audits as `check --from` does
            (tmp / "pyproject.toml").write_text(policy_table(conv))
    said = f"; the trainer's policy in {Path(dst) / 'pyproject.toml'}" if conv.settings else ""
    click.echo(f"wrote {dst} ({trajectories.num_rows} trajectories{said})")


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="rollout-audit-report.html", show_default=True)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--select", multiple=True, help="Codes or prefixes to run (as `check --select`).")
@click.option("--ignore", multiple=True, help="Codes or prefixes to skip.")
@click.option("--from", "framework", default=None, help="PATHS are a trainer's dump (as `check --from`).")
@click.option(
    "--context", "context", multiple=True, metavar="KEY=VALUE", help="With --from: what the trainer does not record."
)
@click.option("--replay", "replay", type=click.IntRange(0), default=None, help="Replay N trajectories (as `check`).")
@click.option("--baseline", "baseline", type=click.Path(dir_okay=False), default=None, help="As `check --baseline`.")
@click.option("--preview", is_flag=True, help="Also run the checks in preview (as `check --preview`).")
def report(paths, output, config_path, select, ignore, framework, context, replay, baseline, preview) -> None:
    """Write an HTML page: the verdict, every check (pass / fail / not run, with its explanation), findings
    per code with examples, and plots of the distributions where the catalogued faults show. The
    verdict and exit code are those of `rollout-audit check` with the same options."""
    from .reading.io import discover
    from .reading.log import Log
    from .reporting.html import render_html
    from .reporting.outputs import check_output, write_atomic
    from .reporting.stats import distributions, log_stats
    from .running.engine import memory_discovery
    from .running.options import Options
    from .session import Request, run

    check_output(output, paths)
    sel, ign = _known_codes(select), _known_codes(ignore)
    a = run(
        Request(
            source=list(paths),
            framework=framework,
            context=_context(context),
            config_file=config_path,
            replay=replay,
            preview=preview,
            options=Options(select=tuple(sel), ignore=tuple(ign), tune=True),
            baseline=baseline,
        )
    )
    rep = a.report
    try:
        disc = memory_discovery(*a.converted.tables()) if a.converted is not None else discover(list(paths))
        log = Log(disc)
        st = {**log_stats(log), "distributions": distributions(log)} if disc.of_kind("trajectories") else None
    except Exception:  # noqa: BLE001 - statistics are a courtesy; a broken log still gets its findings page
        st = None
    write_atomic(output, render_html(rep, st, ", ".join(map(str, paths))))
    click.echo(f"wrote {output}")
    _say_incomplete(rep, paths)
    sys.exit(rep.exit_code())


@main.command()
@click.argument("out", type=click.Path(file_okay=False), default="demo-out")
@click.option("--profile", type=click.Choice(["tiny", "smoke", "full"]), default="smoke", show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Training progress on stderr (default: a bar on a terminal, a line every few seconds elsewhere).",
)
def demo(out, profile, seed, progress) -> None:
    """Train the key-and-door reference agent on CPU, write its log to OUT/log, audit it with replay.

    OUT also holds the checkpoints, a pyproject.toml with the collector's settings (found by any
    `check OUT/log`) and OUT/rollout-audit.toml, which adds the agent's replayer:
    `rollout-audit check OUT/log --config OUT/rollout-audit.toml --replay 64`. Needs the agent
    extra: pip install 'rollout-audit[agent]'.
    """
    from pathlib import Path

    from .contract.config import load_config
    from .reporting.outputs import check_new_directory

    try:
        from reference_agent.demo import CONFIG, LOG, REPLAY, format_table, next_steps, replay_summary, run_demo
    except ImportError as e:
        _fail(f"the reference agent needs torch: pip install -e '.[agent]' ({e})")
    _replace_own_demo(out)
    check_new_directory(out)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / DEMO_MARK).write_text("written by `rollout-audit demo`: a later demo may replace this directory\n")
    click.echo(f"training the {profile} profile (seed {seed}) into {out} ...", err=True)
    shown: bool | str = (sys.stderr.isatty() or "lines") if progress is None else progress
    result = run_demo(str(out), profile=profile, seed=seed, progress=shown)
    click.echo(format_table(result))
    from .api import audit

    code = 0
    for run in result["run_dirs"]:  # each run apart: the checkpoints of one run's versions replay only its log
        cfg = load_config(Path(run) / CONFIG)
        cfg.replay = REPLAY
        rep = audit(str(Path(run) / LOG), config=cfg.with_source(f"{Path(run) / CONFIG} with replay = {REPLAY}"))
        click.echo(f"\naudit of the log it wrote, {Path(run) / LOG}:")
        click.echo(replay_summary(rep.summary))
        click.echo(rep.render("text"))
        click.echo(next_steps(run))
        code = max(code, rep.exit_code())
    sys.exit(code)


DEMO_MARK = ".rollout-audit-demo"  # the file that says a directory is a demo's output


def _replace_own_demo(out: str) -> None:
    """Remove `out` when an earlier demo wrote it (it holds the demo's mark, a regular file, and is a
    real directory, not a symlink); anything else is left for `check_new_directory` to refuse."""
    import shutil
    from pathlib import Path

    p = Path(out)
    mark = p / DEMO_MARK
    if p.is_symlink() or not p.is_dir() or mark.is_symlink() or not mark.is_file():
        return
    click.echo(f"replacing {out}: an earlier `rollout-audit demo` wrote it", err=True)
    shutil.rmtree(p)


@main.group(invoke_without_command=True)
@click.option("--list", "list_all", is_flag=True, help="List the named faults and the codes each must raise.")
@click.pass_context
def faults(ctx, list_all) -> None:
    """Break a compliant log on purpose: named faults, each with the codes it must raise."""
    if ctx.invoked_subcommand is None:
        import shutil
        import textwrap

        from .faults import FAULTS

        room = max(shutil.get_terminal_size((120, 24)).columns - 58, 40)  # descriptions wrap, never cut
        for f in FAULTS.values():
            lines = textwrap.wrap(f.description, room, break_on_hyphens=False) or [""]
            click.echo(f"{f.name:<44} {','.join(sorted(f.codes)):<12} {lines[0]}")
            for line in lines[1:]:
                click.echo(" " * 58 + line)


@faults.command("apply")
@click.argument("name")
@click.argument("src", type=click.Path(exists=True))
@click.argument("dst", type=click.Path())
@click.option("--seed", default=0, show_default=True, help="Chooses which trajectory is broken.")
def faults_apply(name, src, dst, seed) -> None:
    """Write DST: the log at SRC broken by fault NAME."""
    from .faults import FAULTS, apply, declared_components, read_records, write_records
    from .reporting.outputs import atomic_directory, check_new_directory, check_output

    if name not in FAULTS:
        _fail(f"unknown fault {name!r}; see `rollout-audit faults --list`")
    check_output(dst, [src], writes_log=True)
    check_new_directory(dst)
    try:
        (t, u), touched = apply(name, *read_records(src), seed=seed)
    except ValueError as e:  # the log has nothing this fault can break, or cannot be read
        raise UsageError(f"{src}: {_first_line(e)}") from None
    declared = declared_components(src) | FAULTS[name].declares  # the producer's declaration, carried over
    with atomic_directory(dst) as tmp:  # DST appears whole or not at all
        write_records(tmp, t, u, corrupt=FAULTS[name].file_level, reward_components=declared)
    click.echo(
        f"{dst}: {name} (must raise {', '.join(sorted(FAULTS[name].codes))}); touched: "
        f"{', '.join(touched) or 'the whole log'}"
    )


@faults.command("matrix")
@click.argument("src", type=click.Path(exists=True))
@click.option("--parts", default=1, show_default=True, help="Split each broken log into this many partitions.")
def faults_matrix(src, parts) -> None:
    """Apply every fault to the log at SRC, audit each, print the detection matrix (exit 1 on a miss)."""
    import tempfile

    from .faults import FAULTS, detect, read_records, render_matrix

    trajs, ups = read_records(src)
    with tempfile.TemporaryDirectory() as work:
        rows = [detect(n, trajs, ups, work, parts=parts) for n in FAULTS]
    click.echo(render_matrix(rows))
    sys.exit(0 if all(r.ok for r in rows) else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
