"""Each command's options, declared once. A command's options are one frozen, keyword-only
dataclass whose fields carry their click declaration: the click command is built from the fields,
what click parsed is normalised once (codes checked against the catalogue, `KEY=VALUE` pairs split,
colour resolved against the terminal) into that one object, and the command body, the running
`Options` and the audit `Request` are all made from it. An option is added by adding a field."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import click

FORMATS = ("text", "concise", "json", "github", "junit", "sarif")

T = TypeVar("T", bound="Parsed")


def fail(msg: str) -> NoReturn:
    """Refuse the command line: one line on stderr, exit 2."""
    click.echo(f"rollout-audit: error: {msg}", err=True)
    sys.exit(2)


# ------------------------------------------------------------------ values as click gives them


def codes(values: Sequence[str]) -> tuple[str, ...]:
    """Comma-separated codes; an empty one (`--ignore ""`, `M,,L`) would match every check: refused."""
    out = tuple(c.strip().upper() for v in values for c in v.split(","))
    if any(not c for c in out):
        fail("an empty check code or prefix matches every check; remove it")
    return out


def known_codes(values: Sequence[str]) -> tuple[str, ...]:
    """`codes`, each one a check's code or a prefix of one."""
    from ..checks import all_rules

    out = codes(values)
    known = all_rules()
    for c in out:
        if not any(k.startswith(c) for k in known):
            fail(f"unknown check code or prefix {c!r}; see `rollout-audit explain --list`")
    return out


def pairs(values: Sequence[str]) -> Mapping[str, str]:
    """`KEY=VALUE` options as keyword arguments for an adapter."""
    out = {}
    for p in values:
        key, sep, value = p.partition("=")
        if not sep or not key.isidentifier():
            fail(f"--context wants KEY=VALUE, not {p!r}")
        out[key] = value
    return out


def tty_colour() -> bool:
    """Colour by default only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


# ------------------------------------------------------------------ declaring a field


def option(*decls: str, default: Any = None, parse: Callable[[Any], Any] | None = None, **click_kw: Any) -> Any:
    """A field that is a click option: its declarations (`"--select"`), its default, what turns
    click's value into the field's (`parse`), and click's keywords (help, type, flags)."""
    meta = {"click": ("option", decls, {"default": default, **click_kw}), "parse": parse}
    return field(default=default, metadata=meta)


def flag(*decls: str, help: str) -> Any:
    """A field that is an on/off option, off by default."""
    return option(*decls, default=False, is_flag=True, help=help)


def argument(*, default: Any = None, parse: Callable[[Any], Any] | None = None, **click_kw: Any) -> Any:
    """A field that is a click argument, named as the field is."""
    return field(default=default, metadata={"click": ("argument", (), click_kw), "parse": parse})


@dataclass(frozen=True, kw_only=True)
class Parsed:
    """Options parsed once. `command` builds the click command; `resolve` is where options that
    depend on one another are settled, once, before the object is made."""

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> dict[str, Any]:
        return values

    @classmethod
    def parse(cls: type[T], values: dict[str, Any]) -> T:
        out = {}
        for f in dataclasses.fields(cls):
            if "click" not in f.metadata:
                continue
            v = values[f.name]
            convert = f.metadata["parse"]
            out[f.name] = convert(v) if convert is not None and v is not None else v
        return cls(**cls.resolve(out))

    @classmethod
    def command(cls: type[T], group: click.Group, name: str | None = None, **kw: Any):
        """Decorate `body(opts) -> exit code | None` into the click command `name` of `group`,
        with one click parameter per field, in the order the fields are declared."""

        def make(body: Callable[[T], int | None]) -> click.Command:
            def callback(**values: Any) -> None:
                code = body(cls.parse(values))
                if code is not None:
                    sys.exit(code)

            callback.__doc__ = body.__doc__
            fn: Any = callback
            for f in reversed(dataclasses.fields(cls)):
                if "click" not in f.metadata:
                    continue
                kind, decls, click_kw = f.metadata["click"]
                if kind == "argument":
                    fn = click.argument(f.name, **click_kw)(fn)
                else:
                    fn = click.option(*decls, f.name, **click_kw)(fn)
            return group.command(name or body.__name__.replace("_", "-"), **kw)(fn)

        return make


# ------------------------------------------------------------------ what an audit is asked


def _config_file(**kw: Any) -> Any:
    return option(
        "--config",
        type=click.Path(exists=True, dir_okay=False),
        help="TOML file with a [tool.rollout-audit] table (default: nearest pyproject.toml).",
        **kw,
    )


def _context(help: str) -> Any:
    return option("--context", default=(), multiple=True, metavar="KEY=VALUE", parse=pairs, help=help)


@dataclass(frozen=True, kw_only=True)
class AuditOptions(Parsed):
    """What an audit is asked, shared by every command that makes one: which checks, under which
    configuration, of which source, with what replayed and settled against which baseline."""

    paths: tuple[str, ...] = argument(default=(), nargs=-1, required=False, type=click.Path())
    select: tuple[str, ...] = option(
        "--select",
        default=(),
        multiple=True,
        parse=known_codes,
        help="Codes or prefixes to run (e.g. M,L201). Default: all.",
    )
    ignore: tuple[str, ...] = option(
        "--ignore", default=(), multiple=True, parse=known_codes, help="Codes or prefixes to skip."
    )
    config_file: str | None = _config_file()
    preview: bool = flag(
        "--preview",
        help="Also run the checks in preview (new, not yet stable; `explain --list` marks them).",
    )
    framework: str | None = option(
        "--from",
        help="PATHS are a trainer's dump (JSON Lines or Parquet records) to convert in memory first: "
        "verl, skyrl, slime, rllm, verifiers or openai.",
    )
    context: Mapping[str, str] = _context("With --from: what the trainer does not record.")
    calls: tuple[str, ...] = option(
        "--calls",
        default=(),
        multiple=True,
        help="With --from: a `rollout-audit capture` directory (or OpenAI request/response lines) whose engine "
        "calls are joined to the dump's rows by their exact token prefix (calls that carry no row id).",
    )
    replay: int | None = option(
        "--replay",
        type=click.IntRange(0),
        help="Replay N trajectories stratified by policy version (L205-L207, L209; needs a configured replayer).",
    )
    merge: bool = flag(
        "--merge",
        help="Audit all PATHS as one log (partitions of one log); by default each PATH is a log of its own.",
    )
    baseline: str | None = option(
        "--baseline",
        type=click.Path(dir_okay=False),
        help="Fail only on findings not recorded in this baseline file (default: `baseline` of the configuration).",
    )
    one_thread: bool = flag(
        "--one-thread",
        help="Read, decode and check on one thread (by default the next batch is decoded on Arrow's thread pool "
        "while the current one is checked; the findings are the same).",
    )

    def running(self, **kw: Any):
        """The running options: the selection, and what the command adds (workers, Ray)."""
        from ..running.options import Options

        return Options(select=self.select, ignore=self.ignore, tune=True, pipeline=not self.one_thread, **kw)

    def request(self, source: Sequence[str], **kw: Any):
        """The audit of `source` these options ask for; `kw`: what the command adds (its running
        options, the directory the log was found in, no baseline)."""
        from ..session import Request

        kw.setdefault("options", self.running())
        return Request(
            source=list(source),
            framework=self.framework,
            context=dict(self.context or {}),
            calls=tuple(self.calls),
            config_file=self.config_file,
            replay=self.replay,
            preview=self.preview,
            baseline=self.baseline,
            **kw,
        )


@dataclass(frozen=True, kw_only=True)
class CheckOptions(AuditOptions):
    """`rollout-audit check`."""

    fmt: str = option("--format", default="text", type=click.Choice(FORMATS), show_default=True)
    strict: bool = flag("--strict", help="Exit 1 on warnings too.")
    show_all: bool = flag("--show-all", help="Text format: show every finding, not a sample per code.")
    quiet: bool = flag(
        "-q",
        "--quiet",
        help="Text and concise formats: the findings only; nothing when clean.",
    )
    color: bool = option(
        "--color/--no-color",
        help="Colour the text format (default: when stdout is a terminal and NO_COLOR is unset).",
    )
    show_not_run: bool = flag(
        "--show-not-run",
        help="Text format: each check not run with its reason, one per line.",
    )
    output: str | None = option(
        "-o",
        "--output",
        type=click.Path(dir_okay=False, writable=True),
        help="Write the report to this file instead of stdout.",
    )
    workers: int = option(
        "--workers",
        default=1,
        type=click.IntRange(1, 64),
        show_default=True,
        help="Batches checked at once (2: ~13% faster on 2 cores, one more batch in memory; benchmarks/README.md).",
    )
    ray: bool | str | None = option(
        "--ray",
        is_flag=False,
        flag_value="local",
        metavar="[ADDRESS]",
        help="Run on a Ray cluster: ADDRESS, or alone (put it after PATHS) for a local cluster of --workers CPUs "
        "(needs the distributed extra).",
    )
    show_settings: bool = flag(
        "--show-settings",
        help="Print the configuration in use and where it came from, then exit.",
    )
    write_baseline: str | None = option(
        "--write-baseline",
        type=click.Path(dir_okay=False),
        help="Record today's findings in this file (for --baseline) and exit 0.",
    )

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> dict[str, Any]:
        ray, paths = values["ray"], values["paths"]
        if ray not in (None, "local", "auto") and "://" not in ray and os.path.exists(ray):
            paths, ray = (ray, *paths), "local"  # `--ray PATH`: a local cluster, then the path
        if not paths:
            raise click.UsageError("Missing argument 'PATHS...'.")
        colour = tty_colour() if values["color"] is None else values["color"]
        return {
            **values,
            "paths": tuple(paths),
            "ray": True if ray == "local" else ray,
            "color": colour,
        }

    def running(self, **kw: Any):
        return super().running(workers=self.workers, ray=self.ray, **kw)


@dataclass(frozen=True, kw_only=True)
class ReportOptions(AuditOptions):
    """`rollout-audit report`: the audit `check` makes, with the same options, as an HTML page."""

    paths: tuple[str, ...] = argument(default=(), nargs=-1, required=True, type=click.Path())
    output: str = option(
        "-o", "--output", default="rollout-audit-report.html", type=click.Path(dir_okay=False), show_default=True
    )


@dataclass(frozen=True, kw_only=True)
class DiffOptions(Parsed):
    """`rollout-audit diff A B`."""

    a: str = argument(default="", type=click.Path())
    b: str = argument(default="", type=click.Path())
    fmt: str = option("--format", default="text", type=click.Choice(["text", "json"]), show_default=True)
    config_file: str | None = _config_file()
    z_noise: float = option(
        "--z",
        default=3.0,
        type=click.FloatRange(0, min_open=True),
        show_default=True,
        help="A statistic moved when |z| of its change is above this.",
    )
    every: bool = flag("--all", help="Text: every statistic, not only those that moved.")
    allow_lost_coverage: bool = flag(
        "--allow-lost-coverage",
        help="Do not fail when a check that ran on A did not run on B (still listed).",
    )


@dataclass(frozen=True, kw_only=True)
class FilterOptions(Parsed):
    """`rollout-audit filter LOG OUT`."""

    log: str = argument(default="", type=click.Path(exists=True))
    out: str = argument(default="", type=click.Path())
    select: tuple[str, ...] = option(
        "--select",
        default=(),
        multiple=True,
        parse=known_codes,
        help="Codes or prefixes whose flagged trajectories are dropped (default: every code with an error finding).",
    )
    config_file: str | None = _config_file()


@dataclass(frozen=True, kw_only=True)
class WatchOptions(Parsed):
    """`rollout-audit watch DIRECTORY`."""

    directory: str = argument(default="", type=click.Path(exists=True, file_okay=False))
    framework: str | None = option("--from", help="The steps are a trainer's dump files (as `check --from`).")
    context: Mapping[str, str] = _context("With --from: what the trainer does not record.")
    config_file: str | None = _config_file()
    status: str | None = option(
        "--status",
        type=click.Path(dir_okay=False),
        help="Keep this JSON file up to date: every step audited, the worst exit code, watching or stopped.",
    )
    metrics: str | None = option(
        "--metrics",
        type=click.Path(dir_okay=False),
        help="Append one JSON line of audit figures per step (errors and warnings by family, trainable share, lag).",
    )
    tensorboard: str | None = option(
        "--tensorboard",
        type=click.Path(file_okay=False),
        help="Write the same figures as scalars to a TensorBoard event file in this directory (step = step index).",
    )
    fail_fast: bool = flag(
        "--fail-fast",
        help="Stop at the first step that does not pass, with its exit code.",
    )
    interval: float = option(
        "--interval", default=1.0, type=click.FloatRange(0.01), show_default=True, help="Seconds between polls."
    )
    idle: float | None = option(
        "--idle", type=click.FloatRange(0), help="Stop after this many seconds without a new step (default: never)."
    )
    max_steps: int | None = option("--max-steps", type=click.IntRange(1), help="Stop after this many steps.")

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> dict[str, Any]:
        return {**values, "context": values["context"] if values["framework"] else {}}


@dataclass(frozen=True, kw_only=True)
class ShowOptions(Parsed):
    """`rollout-audit show PATH ID`."""

    path: str = argument(default="", type=click.Path())
    trajectory_id: str = argument(default="")
    color: bool = option("--color/--no-color", help="Colour by provenance (default: when stdout is a terminal).")
    tokenizer_dir: str | None = option(
        "--tokenizer",
        type=click.Path(),
        help="A local Hugging Face tokenizer directory to decode with (needs transformers). "
        "Default: the vocabulary the log declares, else token ids.",
    )
    ids: bool = flag("--ids", help="Also print each token's id and behaviour log-prob.")
    width: int = option("--width", type=click.IntRange(40, 1000), help="Columns (default: the terminal's).")

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> dict[str, Any]:
        import shutil

        colour = sys.stdout.isatty() if values["color"] is None else values["color"]
        return {**values, "color": colour, "width": values["width"] or shutil.get_terminal_size((100, 24)).columns}


@dataclass(frozen=True, kw_only=True)
class ConvertOptions(Parsed):
    """`rollout-audit convert --from NAME SRC DST`."""

    framework: str = option("--from", required=True, help="verl, skyrl, slime, rllm, verifiers or openai.")
    src: str = argument(default="", type=click.Path(exists=True))
    dst: str = argument(default="", type=click.Path())
    context: Mapping[str, str] = _context("What the trainer does not record.")
