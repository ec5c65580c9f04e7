"""The `rollout-audit` command line. Exit codes: 0 clean, 1 error findings, 2 unusable input."""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

import click

from ..contract.errors import RolloutAuditError
from . import commands
from .commands import first_line as _first_line

FORMATS = ("text", "concise", "json", "github", "junit")


def _codes(values: tuple[str, ...]) -> list[str]:
    """Comma-separated codes; an empty one (`--ignore ""`, `M,,L`) would match every check: refused."""
    codes = [c.strip().upper() for v in values for c in v.split(",")]
    if any(not c for c in codes):
        _fail("an empty check code or prefix matches every check; remove it")
    return codes


def _known_codes(values: tuple[str, ...]) -> list[str]:
    """`_codes`, each one a check's code or a prefix of one."""
    from ..checks import all_rules

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
    if ray_address not in (None, "local", "auto") and "://" not in ray_address and os.path.exists(ray_address):
        paths, ray_address = (ray_address, *paths), "local"  # `--ray PATH`: a local cluster, then the path
    if not paths:
        raise click.UsageError("Missing argument 'PATHS...'.")
    if show_settings:
        commands.show_settings(paths, config_path, replay, preview, click.echo)
        return
    sel, ign = _known_codes(select), _known_codes(ignore)
    sys.exit(
        commands.check(
            paths,
            select=sel,
            ignore=ign,
            fmt=fmt,
            config_path=config_path,
            strict=strict,
            show_all=show_all,
            quiet=quiet,
            color=_tty_colour() if color is None else color,
            merge=merge,
            output=output,
            workers=workers,
            ray=None if ray_address is None else (True if ray_address == "local" else ray_address),
            replay=replay,
            framework=framework,
            context=_context(context),
            baseline=baseline,
            write_baseline_to=write_baseline,
            show_not_run=show_not_run,
            preview=preview,
            echo=click.echo,
        )
    )


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
    code = commands.diff(
        a,
        b,
        fmt=fmt,
        config_path=config_path,
        z_noise=z_noise,
        every=every,
        allow_lost_coverage=allow_lost_coverage,
        echo=click.echo,
    )
    sys.exit(code)


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
    sel = _known_codes(select)
    sys.exit(commands.filter_flagged(log, out, select=sel, config_path=config_path, echo=click.echo))


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
    code = commands.watch(
        directory,
        framework=framework,
        context=_context(context) if framework else {},
        config_path=config_path,
        status=status,
        metrics=metrics,
        tensorboard=tensorboard,
        fail_fast=fail_fast,
        interval=interval,
        idle=idle,
        max_steps=max_steps,
        echo=click.echo,
    )
    sys.exit(code)


@main.command()
@click.argument("code", required=False)
@click.option("--list", "list_all", is_flag=True, help="List every check code, by family.")
def explain(code, list_all) -> None:
    """Explain a check: the rule, the lesson it comes from, what to fix (a family letter: its checks)."""
    commands.explain(code, list_all, click.echo)


@main.command("config")
@click.argument("key", required=False)
@click.option("--list", "list_all", is_flag=True, help="List every configuration key with its description.")
def config_cmd(key, list_all) -> None:
    """Explain a configuration key: its type, default, where it may be set, and the checks that read it."""
    from ..reporting.settings import key_entry, keys

    if list_all or not key:
        from ..contract.config import Config

        for k in keys():
            click.echo(f"{k:<26} {Config.model_fields[k].description}")
        return
    click.echo(key_entry(key))


@main.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def schema(fmt) -> None:
    """Print the log contract (columns, types, requirement levels)."""
    from ..contract import schema as S

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
    commands.stats(paths, fmt, click.echo)


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

    commands.show(
        path,
        trajectory_id,
        color=sys.stdout.isatty() if color is None else color,
        tokenizer_dir=tokenizer_dir,
        ids=ids,
        width=width or shutil.get_terminal_size((100, 24)).columns,
        echo=click.echo,
    )


@main.command("convert")
@click.option("--from", "framework", required=True, help="verl, skyrl, slime, rllm, verifiers or openai.")
@click.argument("src", type=click.Path(exists=True))
@click.argument("dst", type=click.Path(file_okay=False))
@click.option("--context", "context", multiple=True, metavar="KEY=VALUE", help="What the trainer does not record.")
def convert_cmd(framework, src, dst, context) -> None:
    """Convert a trainer's dump (SRC: JSON Lines or Parquet records) into a contract log in DST."""
    commands.convert(framework, src, dst, _context(context), click.echo)


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
    sel, ign = _known_codes(select), _known_codes(ignore)
    code = commands.report(
        paths,
        output=output,
        config_path=config_path,
        select=sel,
        ignore=ign,
        framework=framework,
        context=_context(context),
        replay=replay,
        baseline=baseline,
        preview=preview,
        echo=click.echo,
    )
    sys.exit(code)


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
    sys.exit(commands.demo(out, profile, seed, progress, click.echo))


@main.group(invoke_without_command=True)
@click.option("--list", "list_all", is_flag=True, help="List the named faults and the codes each must raise.")
@click.pass_context
def faults(ctx, list_all) -> None:
    """Break a compliant log on purpose: named faults, each with the codes it must raise."""
    if ctx.invoked_subcommand is None:
        import shutil
        import textwrap

        from ..faults import FAULTS

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
    commands.apply_fault(name, src, dst, seed, click.echo)


@faults.command("matrix")
@click.argument("src", type=click.Path(exists=True))
@click.option("--parts", default=1, show_default=True, help="Split each broken log into this many partitions.")
def faults_matrix(src, parts) -> None:
    """Apply every fault to the log at SRC, audit each, print the detection matrix (exit 1 on a miss)."""
    sys.exit(commands.fault_matrix(src, parts, click.echo))


if __name__ == "__main__":  # pragma: no cover
    main()
