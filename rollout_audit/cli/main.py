"""The `rollout-audit` command line. Exit codes: 0 clean, 1 error findings, 2 unusable input."""

from __future__ import annotations

import importlib
import json
import sys

import click

from ..contract.errors import RolloutAuditError
from . import commands
from .commands import first_line as _first_line
from .options import (
    CheckOptions,
    ConvertOptions,
    DiffOptions,
    FilterOptions,
    ReportOptions,
    ShowOptions,
    WatchOptions,
    fail,
)


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

    # commands whose module is imported only when they are named or listed: the recorder proxy
    # pulls in asyncio and ssl, about a third of the start-up of every other command
    lazy = {"capture": "rollout_audit.capture.command"}

    def _load(self, name: str) -> None:
        module = self.lazy.get(name)
        if module is not None and name not in self.commands:
            command = getattr(importlib.import_module(module), name)
            command.epilog = EXAMPLES.get(name, command.epilog)
            self.add_command(command)

    def get_command(self, ctx, cmd_name):
        if cmd_name not in self.commands:  # an unknown name loads them all, so that "did you mean" sees every one
            for name in [cmd_name] if cmd_name in self.lazy else self.lazy:
                self._load(name)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):
        for name in self.lazy:
            self._load(name)
        return super().list_commands(ctx)

    def format_commands(self, ctx, formatter) -> None:
        """Each command with the whole first sentence of its help, never cut at 45 characters."""
        self.list_commands(ctx)
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
                fail(_first_line(e))
            if isinstance(e, OSError):  # the system refused a path (absent, unreadable, full): its message names it
                fail(_first_line(e))
            fail(f"internal error: {type(e).__name__}: {_first_line(e)} (please report this)")


def examples(*lines: tuple[str, str]) -> str:
    """A command's `--help` epilog: `rollout-audit ARGS` and what it does, one example a line, what
    it does under a long one (kept as written: click rewraps any paragraph not marked \\b)."""
    col = 36
    out = []
    for cmd, what in lines:
        line = f"rollout-audit {cmd}"
        out.append(
            f"  {line:<{col}}{what}".rstrip()
            if len(line) < col
            else f"  {line}" + (f"\n  {'':<{col}}{what}" if what else "")
        )
    return "\b\nExamples:\n" + "\n".join(out)


# Each command's examples (tests/test_cli_ux.py parses every one with the command's own options)
EXAMPLES = {
    "check": examples(
        ("check logs/", "audit one log"),
        ("check logs/ --format sarif -o audit.sarif", "SARIF 2.1.0 for code scanning"),
        ("check logs/ --select M,L201 --ignore R409 --strict", "some checks; warnings fail too"),
        ("check --from verl DUMP --context environment_version=v3", "a trainer's dump, converted in memory"),
        ("check logs/ --write-baseline b.json", "accept today's findings (then --baseline b.json)"),
    ),
    "diff": examples(
        ("diff run1/ run2/", "findings and statistics that changed from run1 to run2"),
        ("diff run1/ run2/ --format json", "the same, as JSON"),
    ),
    "filter": examples(
        ("filter logs/ clean/", "a copy without the flagged trajectories and their updates"),
        ("filter logs/ clean/ --select M", "drop only what the mask checks flag"),
    ),
    "watch": examples(
        ("watch out/ --status status.json --fail-fast", "audit each step as it completes; stop on the first error"),
        ("watch dumps/ --from verl --idle 600", "a trainer's dumps; stop after 10 minutes without a step"),
    ),
    "explain": examples(
        ("explain U602", "the rule, the lesson it comes from, what to fix"),
        ("explain M", "the checks of one family"),
        ("explain --list", "every check code"),
    ),
    "config": examples(
        ("config --list", "every configuration key"),
        ("config atol", "one key: what it means, its default"),
    ),
    "schema": examples(("schema", "the log contract"), ("schema --format json", "the same, as JSON")),
    "stats": examples(
        ("stats logs/", "counts, trainable share, stop causes, rewards"), ("stats logs/ --format json", "")
    ),
    "show": examples(
        ("show logs/ TRAJECTORY_ID", "one transcript by provenance, findings at their tokens"),
        ("show logs/ TRAJECTORY_ID --tokenizer DIR --ids", "decoded text; each token's id and log-prob"),
    ),
    "convert": examples(
        ("convert --from slime DUMP out/", "a trainer's dump written as a contract log"),
    ),
    "report": examples(
        ("report logs/ -o report.html", "an offline HTML page: verdict, findings, plots"),
    ),
    "capture": examples(
        ("capture --upstream http://127.0.0.1:8000 --out sessions/", "record every exchange with the server"),
        ("check --from openai sessions/", "then audit what was recorded"),
    ),
    "demo": examples(
        ("demo", "train the reference agent, audit its log"), ("demo out/ --profile tiny", "the smallest run")
    ),
    "faults": examples(
        ("faults --list", "the named faults and the codes each must raise"),
        ("faults apply policy_tokens_unmasked fixtures/compliant broken/", "a copy with one fault"),
        ("faults matrix fixtures/compliant", "apply every fault, audit each"),
    ),
}


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


@CheckOptions.command(main, epilog=EXAMPLES["check"])
def check(opts: CheckOptions) -> int | None:
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
    if opts.show_settings:
        commands.show_settings(opts, click.echo)
        return None
    return commands.check(opts, click.echo)


@DiffOptions.command(main, epilog=EXAMPLES["diff"])
def diff(opts: DiffOptions) -> int:
    """What changed from log A to log B (two runs, or two step directories of one log): findings
    compared by identity (code, trajectory, place), checks that ran on A and not on B, and the
    statistics that moved beyond noise. Exit 1 when error findings are new in B or a check lost
    coverage; 2 when either audit is incomplete."""
    return commands.diff(opts, click.echo)


@FilterOptions.command(main, "filter", epilog=EXAMPLES["filter"])
def filter_flagged(opts: FilterOptions) -> int:
    """Write OUT: the log at LOG without the trajectories the selected checks flagged, and without
    the updates that named them. Never writes in place; states what it dropped."""
    return commands.filter_flagged(opts, click.echo)


@WatchOptions.command(main, epilog=EXAMPLES["watch"])
def watch(opts: WatchOptions) -> int:
    """Follow DIRECTORY as a trainer writes it, and audit each new step's file once it is complete
    (moved in by a rename, or its size unchanged since the last poll). One line per step; exit with
    the worst step's exit code (0 when every step passed)."""
    return commands.watch(opts, click.echo)


@main.command(epilog=EXAMPLES["explain"])
@click.argument("code", required=False)
@click.option("--list", "list_all", is_flag=True, help="List every check code, by family.")
def explain(code, list_all) -> None:
    """Explain a check: the rule, the lesson it comes from, what to fix (a family letter: its checks)."""
    commands.explain(code, list_all, click.echo)


@main.command("config", epilog=EXAMPLES["config"])
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


@main.command(epilog=EXAMPLES["schema"])
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


@main.command(epilog=EXAMPLES["stats"])
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def stats(paths, fmt) -> None:
    """Counts, trainable share, stop causes, rewards, groups and policy versions of a log."""
    commands.stats(paths, fmt, click.echo)


@ShowOptions.command(main, epilog=EXAMPLES["show"])
def show(opts: ShowOptions) -> None:
    """Print one trajectory turn by turn: decoded text coloured by provenance, trained tokens underlined,
    trained non-policy tokens flagged with !, findings' codes next to their tokens, observations and rewards.
    The findings are those `rollout-audit check PATH` reports on this trajectory."""
    commands.show(opts, click.echo)


@ConvertOptions.command(main, epilog=EXAMPLES["convert"])
def convert(opts: ConvertOptions) -> None:
    """Convert a trainer's dump (SRC: JSON Lines or Parquet records) into a contract log in DST."""
    commands.convert(opts, click.echo)


@ReportOptions.command(main, epilog=EXAMPLES["report"])
def report(opts: ReportOptions) -> int:
    """Write an HTML page: the verdict, every check (pass / fail / not run, with its explanation), findings
    per code with examples, and plots of the distributions where the catalogued faults show. The
    verdict and exit code are those of `rollout-audit check` with the same options."""
    return commands.report(opts, click.echo)


@main.command(epilog=EXAMPLES["demo"])
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


@main.group(invoke_without_command=True, epilog=EXAMPLES["faults"])
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
