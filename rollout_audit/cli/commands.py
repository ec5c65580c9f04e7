"""What each command of `rollout-audit` does, once its options are parsed: one function per
command, returning the exit code (or nothing when the command always ends 0).

Every audit goes through `session.run`; a request that cannot be carried out raises UsageError
(the command line prints it as `rollout-audit: error: …`, exit 2). Output goes through `echo`,
which takes click.echo's arguments (`err=True`: stderr; `color=`: keep ANSI styles): the command
line passes click.echo, so what is printed, and where, is decided here and nowhere else."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..contract.errors import RolloutAuditError, UsageError

if TYPE_CHECKING:
    from . import options

Echo = Callable[..., Any]  # click.echo: (message, err=False, color=None)


# ------------------------------------------------------------------ shared lines


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def say_incomplete(rep, paths: Sequence[str], echo: Echo, *, full: bool = False) -> None:
    """One line on stderr per reason the audit of the log at `paths` could not be completed (exit 2),
    naming the log; `full`: each reason in full (`audit_errors`: a crash's file and error), for a
    report that leaves them out."""
    from ..reporting.report import audit_errors, incomplete, printable

    for line in audit_errors(rep) if full else incomplete(rep):
        echo(f"rollout-audit: error: {', '.join(map(printable, paths))}: {line}", err=True)


def warn_not_dumps(conv, echo: Echo) -> None:
    """One line on stderr per file of a dump directory that is not a dump file (named, never skipped silently)."""
    from ..reporting.report import printable

    for f in conv.skipped if conv is not None else ():
        echo(
            f"rollout-audit: warning: {printable(f)}: not a dump file (.jsonl, .jsonl.gz, .parquet); not read", err=True
        )


def warn_unreadable(broken: list[tuple[str, str]], echo: Echo) -> None:
    """One line on stderr per file left out (S005 in an audit), so partial statistics say so."""
    from ..reporting.report import printable

    for path, why in broken:
        echo(f"rollout-audit: warning: {printable(path)} left out: {printable(why)}", err=True)


# ------------------------------------------------------------------ explain

# where the lessons the checks cite come from
LECTURE = (
    "the lecture “Module 11. RL for LLM agents: tools, environments, and long trajectories” (material version 2026.23)"
)


def explain(code: str | None, list_all: bool, echo: Echo) -> None:
    """`rollout-audit explain`: one check's rule, lesson and inputs; or the checks by family. Read
    from the catalogue's text, so that no check module is imported."""
    from ..contract.registry import FAMILIES
    from ..running.catalogue import entries

    rules = entries()
    want = (code or "").upper()
    if list_all or not code or want in FAMILIES:
        for fam, title in FAMILIES.items():
            members = sorted(c for c in rules if c.startswith(fam))
            if not members or (want in FAMILIES and fam != want):
                continue
            echo(f"{fam}  {title}")
            for c in members:
                mark = "  (preview)" if rules[c].preview else ""
                echo(f"  {c}  {rules[c].severity:<7}  {rules[c].name}{mark}")
        return
    r = rules.get(want)
    if r is None:
        raise UsageError(f"unknown check code {code!r}; see `rollout-audit explain --list`")
    needs = ", ".join(r.needs) or "nothing beyond the file list"
    extra = (f"\nReads when present: {', '.join(r.reads)}" if r.reads else "") + (
        f"\nConfiguration: {', '.join(r.config)}" if r.config else ""
    )
    state = ", preview: runs only with --preview" if r.preview else ""
    source = f"\nLessons are those of {LECTURE}." if "Lesson" in r.explanation else ""
    echo(f"{r.code} ({r.severity}{state}): {r.name}\n\n{r.explanation}\n\nNeeds: {needs}{extra}{source}")


# ------------------------------------------------------------------ check


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


def show_settings(opts: options.CheckOptions, echo: Echo) -> None:
    """`check --show-settings`: the configuration the audit of its paths would use, and where it came from."""
    from ..contract.config import LOG_CONTEXT
    from ..session import configure

    cfg, file = configure(opts.request(opts.paths))
    echo(f"# configuration: {cfg.source if ', over ' in cfg.source else file or cfg.source}")
    echo(f"# a configuration inside the audited directory may set only: {', '.join(LOG_CONTEXT)}")
    echo("[tool.rollout-audit]\n" + _toml(cfg.settings()))


def logs_of(paths: Sequence[str], echo: Echo) -> list[tuple[list[str], str | None]]:
    """Each PATH as a log of its own; a directory of runs (each run a directory with its own
    `trajectories` folder) as one log per run, said on stderr in one line. Parquet files of such a
    directory that lie in no run are audited together as one more log."""
    from ..reading.io import logs_under, stray_files
    from ..reporting.report import printable

    logs: list[tuple[list[str], str | None]] = []  # (paths of one log, the directory of runs it was found in)
    for p in paths:
        runs = logs_under(p)
        if runs is None:
            logs.append(([p], None))
            continue
        stray, unread = stray_files(p, runs)
        logs += [([r], p) for r in runs] + ([(stray, p)] if stray else [])
        more = f", and {len(stray)} Parquet file(s) in none of them, audited together" if stray else ""
        echo(
            f"rollout-audit: {p}: {len(runs)} log{'s' if len(runs) != 1 else ''} found (directories with a "
            f"trajectories/ folder){more}; each audited on its own (--merge: all as one log)",
            err=True,
        )
        for f, why in unread:  # in no run: said here, since no run's verdict covers it
            echo(f"rollout-audit: {printable(f)}: {why}", err=True)
    return logs


def within_caps(disc, cfg, command: str) -> None:
    """Refuse a log holding a row group the audit does not read under `cfg`'s caps
    (`max_row_group_bytes`, `max_tokens_per_trajectory`): `command` reads every row, and such a
    group (a compression bomb among them) would take memory without bound. One line, exit 2."""
    from ..reading.read import first_unread
    from ..reporting.report import printable

    found = first_unread(disc.files, cfg.max_row_group_bytes, cfg.max_tokens_per_trajectory)
    if found is not None:
        path, why = found
        raise UsageError(
            f"{printable(path)}: {printable(why)}; `{command}` reads every row, so it does not run on this log "
            "(`rollout-audit check` audits the rest)"
        )


def audit_logs(opts: options.AuditOptions, echo: Echo, baseline: bool = False, **kw: Any) -> list:
    """Each log of the request's paths (or all of them as one, with --merge or --from) audited on
    its own: `(paths of the log, Audited)`. `baseline`: a baseline is written, which belongs to one
    log as the one read does; `kw`: what the command adds to each request."""
    from ..session import run
    from .progress import progress

    found = [(list(opts.paths), None)] if opts.merge or opts.framework else logs_of(opts.paths, echo)
    if (opts.baseline or baseline) and len(found) > 1:
        raise UsageError("a baseline belongs to one log: give one PATH, or --merge")
    done = []
    with progress(len(found), enabled=shows_progress(opts)) as step:
        for log, within in found:  # `within`: the directory of runs the log was found in, its trust boundary
            step(printable_paths(log))
            done.append((log, run(opts.request(log, log_root=within, **kw))))
    return done


def shows_progress(opts: options.AuditOptions) -> bool:
    """A progress line only for a person: stderr a terminal, a text report, not --quiet."""
    return (
        sys.stderr.isatty()
        and getattr(opts, "fmt", "text") in ("text", "concise")
        and not getattr(opts, "quiet", False)
    )


def printable_paths(log: Sequence[str]) -> str:
    from ..reporting.report import printable

    return printable(str(log[0])) + (f" (+{len(log) - 1} more)" if len(log) > 1 else "")


def write_baseline(done, path: str, echo: Echo) -> int:
    """Record one log's findings (after its tolerated rates) in `path`: exit 0."""
    from ..session import verdict

    log, a = done
    if not a.report.complete:
        say_incomplete(a.report, log, echo)
        raise UsageError(f"the audit is incomplete: no baseline written to {path}")
    n = verdict.write_baseline(path, a.report, a.ids(), a.tokens)
    echo(f"wrote baseline {path}: {n} finding{'s' if n != 1 else ''} recorded")
    return 0


def check(opts: options.CheckOptions, echo: Echo) -> int:
    """`rollout-audit check`: audit each log (or all PATHS as one), print the reports, return the
    worst exit code. `color`: colour the text format when it goes to stdout."""
    from ..reporting.outputs import check_output, write_atomic
    from ..reporting.report import render_logs
    from ..running.cluster import quiet_ray

    paths = opts.paths
    for out in (opts.output, opts.write_baseline):
        if out:
            check_output(out, paths)
    running = opts.running()
    with quiet_ray(running):  # Ray's own log lines never reach the user's output
        done = audit_logs(opts, echo, bool(opts.write_baseline), options=running, use_baseline=not opts.write_baseline)
    for _, a in done:
        if a.converted is not None and a.converted.settings_said:  # the trainer's own settings, from its configuration
            echo(f"rollout-audit: note: {a.converted.settings_said}", err=True)
        warn_not_dumps(a.converted, echo)
    if opts.write_baseline:
        return write_baseline(done[0], opts.write_baseline, echo)
    reports = [(log, a.report) for log, a in done]
    fmt = opts.fmt
    painted = fmt == "text" and not opts.output and opts.color
    limit = None if opts.show_all else done[0][1].cfg.max_examples
    # a report for a person on stdout: why an audit is incomplete goes to stderr, as every error does
    errors_apart = fmt in ("text", "concise") and not opts.output and not opts.quiet
    text = render_logs(
        reports,
        fmt,
        limit=limit,
        color=painted,
        strict=opts.strict,
        quiet=opts.quiet,
        show_not_run=opts.show_not_run,
        errors=not errors_apart,
    )
    if fmt == "text" and len(reports) > 1 and not opts.quiet:
        text += "\n\n" + overall_line(reports, opts.strict)
    if opts.output:
        write_atomic(opts.output, text + "\n")
    elif text:
        echo(text, color=painted)  # click strips styles off a non-terminal unless told
    for log, rep in reports:  # the report left them out, or is elsewhere or cut short: said on stderr
        say_incomplete(rep, log, echo, full=errors_apart)
    return max(rep.exit_code(opts.strict) for _, rep in reports)


def overall_line(reports: Sequence[tuple[Sequence[str], Any]], strict: bool) -> str:
    """After the reports of several logs: how many logs each verdict got, the findings over all of
    them, and the exit code the command returns (the worst one)."""
    from ..running.report import verdict

    by = {v: 0 for v in ("ok", "FAIL", "INCOMPLETE")}
    errors = warnings = 0
    for _, rep in reports:
        by[verdict(rep, strict)] += 1
        errors += rep.summary["by_severity"]["error"] if rep.unusable is None else 0
        warnings += rep.summary["by_severity"]["warning"] if rep.unusable is None else 0
    worst = max(rep.exit_code(strict) for _, rep in reports)
    return (
        f"overall: {len(reports)} logs: {by['ok']} ok, {by['FAIL']} FAIL, {by['INCOMPLETE']} INCOMPLETE; "
        f"{errors} error{'s' if errors != 1 else ''}, {warnings} warning{'s' if warnings != 1 else ''}; exit {worst}"
    )


# ------------------------------------------------------------------ report


def report(opts: options.ReportOptions, echo: Echo) -> int:
    """`rollout-audit report`: the audit `check` makes, written as an HTML page with the log's
    statistics; the audit's exit code."""
    from ..reading.io import discover
    from ..reading.log import Log
    from ..reporting.html import render_html
    from ..reporting.outputs import check_output, write_atomic
    from ..reporting.stats import distributions, log_stats
    from ..running.engine import memory_discovery

    paths, output = opts.paths, opts.output
    check_output(output, paths)
    pages, reports = [], []
    for log, a in audit_logs(opts, echo):  # each log audited on its own, as `check` does
        disc = memory_discovery(*a.converted.tables()) if a.converted is not None else discover(log)
        within_caps(disc, a.cfg, "report")  # its statistics read every row the audit's caps allow, no more
        try:
            read = Log(disc)
            st = {**log_stats(read), "distributions": distributions(read)} if disc.of_kind("trajectories") else None
        except Exception:  # noqa: BLE001 - statistics are a courtesy; a broken log still gets its findings page
            st = None
        pages.append((", ".join(map(str, log)), a.report, st))
        reports.append((log, a.report))
    write_atomic(output, render_html(pages))
    echo(f"wrote {output}")
    for log, rep in reports:
        say_incomplete(rep, log, echo)
    return max(rep.exit_code() for _, rep in reports)


# ------------------------------------------------------------------ diff


def diff(opts: options.DiffOptions, echo: Echo) -> int:
    """`rollout-audit diff A B`: both audits, what changed between them; the diff's exit code."""
    from ..reading.io import discover
    from ..reporting.report import incomplete, json_text, printable
    from ..session import Request, run
    from ..workflow.diff import diff as compare
    from ..workflow.diff import render_diff

    a, b = opts.a, opts.b
    audited = [run(Request(source=[p], config_file=opts.config_file, use_baseline=False)) for p in (a, b)]
    for p, done in zip((a, b), audited):  # its statistics read every row the audit's caps allow, no more
        within_caps(discover([p]), done.cfg, "diff")
    reps = [done.report for done in audited]
    d = compare([a], [b], reps[0], reps[1], z_noise=opts.z_noise, allow_lost_coverage=opts.allow_lost_coverage)
    echo(json_text(d) if opts.fmt == "json" else render_diff(d, opts.every))
    if d["exit_code"] == 2:  # one line naming each incomplete side
        why = [
            f"{side} {printable(p)}: {'; '.join(incomplete(r))}"
            for side, p, r in zip("AB", (a, b), reps)
            if incomplete(r)
        ]
        echo(f"rollout-audit: error: the diff is incomplete: {' | '.join(why)}", err=True)
    return d["exit_code"]


# ------------------------------------------------------------------ filter


def filter_flagged(opts: options.FilterOptions, echo: Echo) -> int:
    """`rollout-audit filter LOG OUT`: audit LOG, copy it to OUT without the trajectories the
    selected checks flagged (and the updates that named them), then audit the copy: its exit code."""
    import polars as pl

    from ..contract.config import log_config
    from ..reading.io import discover
    from ..reporting.outputs import check_new_directory, check_output
    from ..reporting.report import incomplete, printable
    from ..running.options import Options
    from ..session import Request, run
    from ..workflow.filter import filter_log

    log, out, select = opts.log, opts.out, opts.select
    check_output(out, [log], writes_log=True)
    check_new_directory(out)
    running = Options(select=select)
    done = run(Request(source=[log], config_file=opts.config_file, options=running))
    rep = done.report
    if not rep.complete:
        raise UsageError(f"{printable(log)}: the audit is incomplete ({'; '.join(incomplete(rep))}): nothing written")
    f = rep.findings
    chosen = pl.any_horizontal([pl.col("code").str.starts_with(c) for c in select]) if select else None
    f = f.filter(pl.col("severity") == "error" if chosen is None else chosen)
    flagged = f.filter(pl.col("trajectory_id").is_not_null())
    drop = set(flagged["trajectory_id"].to_list())
    s005 = rep.findings.filter((pl.col("code") == "S005") & ~pl.col("message").str.contains("max_row_group_bytes"))
    unreadable = dict(s005.select("file", "message").unique("file", keep="first").iter_rows())  # left to refuse
    res = filter_log(discover([log]), [log], drop, out, done.cfg, log_config(log), unreadable)
    per = ", ".join(
        f"{c} {n}" for c, n in flagged.group_by("code").agg(pl.col("trajectory_id").n_unique()).sort("code").iter_rows()
    )
    echo(
        f"dropped {res.trajectories_dropped} trajector{'y' if res.trajectories_dropped == 1 else 'ies'}"
        f"{' (' + printable(per) + ')' if per else ''} and {res.updates_dropped} "
        f"update{'' if res.updates_dropped == 1 else 's'} that named them; wrote {printable(out)}: "
        f"{res.trajectories_kept} trajectories, {res.updates_kept} updates"
    )
    for line in res.unread:  # what was written, as the line above: stdout (stderr is for a refusal)
        echo(f"left out: {printable(line)}")
    unplaced = f.height - flagged.height
    if unplaced:
        echo(f"kept: {unplaced} finding(s) of the selected codes name no trajectory (see `check`)")
    return _filtered_verdict(out, opts.config_file, running, select, log, echo)


def _filtered_verdict(out, config_file, running, sel, log, echo: Echo) -> int:
    """Audit the copy `filter` wrote, as `check OUT` would (with the same selection), print its
    verdict, and return its exit code: `filter LOG OUT && train OUT` goes ahead only on a copy
    that passes."""
    from ..reporting.report import incomplete, printable, verdict_line
    from ..session import Request, run

    rep = run(Request(source=[out], config_file=config_file, options=running)).report
    code = rep.exit_code()
    scope = f" (checks {', '.join(sel)})" if sel else ""
    echo(f"the copy{scope}: {verdict_line(rep)}")
    if code == 2:
        echo(f"rollout-audit: error: {printable(log)} filtered into {printable(out)}: the audit of the copy "
             f"is incomplete: {'; '.join(incomplete(rep))}", err=True)  # fmt: skip
    elif code:
        codes = ", ".join(sorted(rep.codes("error")))
        echo(
            f"rollout-audit: error: {printable(log)} filtered into {printable(out)}: the copy does not pass"
            f"{' (' + printable(codes) + ')' if codes else ''}: findings that name no trajectory cannot be "
            f"filtered out; see `rollout-audit check {printable(out)}`",
            err=True,
        )
    return code


# ------------------------------------------------------------------ watch


def watch(opts: options.WatchOptions, echo: Echo) -> int:
    """`rollout-audit watch DIRECTORY`: audit each step as the trainer writes it; the watch's exit code."""
    from ..reporting.outputs import check_output
    from ..reporting.report import printable
    from ..workflow.events import EventFile
    from ..workflow.watch import Watcher, step_auditor

    directory, status, metrics, tensorboard = opts.directory, opts.status, opts.metrics, opts.tensorboard
    for out in (status, metrics, tensorboard):  # never inside the watched log, onto a step, or into a FIFO
        if out is not None:
            check_output(out, [directory])
    root = Path(directory).resolve()
    try:
        events = EventFile(Path(tensorboard)) if tensorboard else None
    except OSError as e:
        raise UsageError(f"--tensorboard {tensorboard}: cannot write an event file there ({e.strerror or e})") from None
    w = Watcher(
        root,
        step_auditor(opts.config_file, root, opts.framework, dict(opts.context)),
        Path(status) if status else None,
        Path(metrics) if metrics else None,
        events,
        ignore={Path(p).resolve() for p in (status, metrics, events and events.path) if p},
        native=not opts.framework,
    )
    if sys.stderr.isatty():  # a person is waiting: say it started (a log or a pipe gets the result lines only)
        stop = f"after {opts.idle:g} s without a new step" if opts.idle is not None else "on Ctrl-C"
        echo(f"watching {printable(directory)}: each step audited once complete; stops {stop}", err=True)
    try:
        code = w.follow(
            lambda line: echo(line),
            interval=opts.interval,
            idle=opts.idle,
            fail_fast=opts.fail_fast,
            max_steps=opts.max_steps,
        )
    except KeyboardInterrupt:
        code = w.finish(lambda line: echo(line))
    if w.checked_nothing():
        echo(f"rollout-audit: error: {printable(directory)}: no step was audited: nothing was checked", err=True)
    else:
        echo(
            f"watched {printable(directory)}: {len(w.steps)} step(s), worst exit code {w.worst}, exit {code}", err=True
        )
    return code


# ------------------------------------------------------------------ stats and show


def stats(paths: Sequence[str], fmt: str, echo: Echo) -> None:
    """`rollout-audit stats`: the log's statistics, as text or JSON."""
    from ..reading.log import scan
    from ..reporting.report import json_text
    from ..reporting.stats import log_stats, render_stats
    from ..session import Request, configure

    log = scan(paths)
    warn_unreadable(log.broken, echo)
    within_caps(log.discovery, configure(Request(source=list(paths)))[0], "stats")
    d = log_stats(log)
    echo(json_text(d) if fmt == "json" else render_stats(d))


SUGGEST_FROM = 200_000  # ids compared for a "did you mean" (difflib is linear in them)


def _near(log, wanted: str) -> str:
    """`; did you mean …?` with the log's closest trajectory ids, or how many it has and one of them."""
    import difflib

    import polars as pl

    from ..reporting.report import printable

    ids = log.trajectories.select(pl.col("trajectory_id").cast(pl.String)).head(SUGGEST_FROM).collect()
    ids = [i for i in ids["trajectory_id"].to_list() if i is not None]
    if not ids:
        return " (it has no trajectory ids)"
    close = difflib.get_close_matches(wanted, ids, n=3, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(repr(printable(c)) for c in close) + "?"
    more = "+" if len(ids) == SUGGEST_FROM else ""
    return f" ({len(ids)}{more} trajectories, e.g. {printable(ids[0])!r})"


def show(opts: options.ShowOptions, echo: Echo) -> None:
    """`rollout-audit show PATH ID`: one trajectory turn by turn with the findings `check PATH` reports on it."""
    import polars as pl

    from ..reading.log import scan
    from ..reporting.decode import DecodeError, from_directory
    from ..reporting.report import printable
    from ..reporting.show import render, transcript
    from ..running.options import Options
    from ..session import Request, configure, run

    path, trajectory_id, color = opts.path, opts.trajectory_id, opts.color
    log = scan(path)
    warn_unreadable(log.broken, echo)
    within_caps(log.discovery, configure(Request(source=[path]))[0], "show")
    try:
        dec = from_directory(opts.tokenizer_dir) if opts.tokenizer_dir else None
    except DecodeError as e:
        raise UsageError(str(e)) from None
    if log.trajectories.filter(pl.col("trajectory_id") == trajectory_id).select(pl.len()).collect().item() == 0:
        raise UsageError(f"trajectory {printable(trajectory_id)!r} is not in the log{_near(log, trajectory_id)}")
    # the findings `rollout-audit check PATH` reports: the same audit, settled by the same configuration
    rep = run(Request(source=[path], options=Options(tune=True))).report
    try:
        t = transcript(log, trajectory_id, rep.findings)
    except KeyError as e:
        raise UsageError(str(e.args[0])) from None
    echo(render(t, color=color, width=opts.width, decoder=dec, ids=opts.ids), color=color)  # --color survives a pipe


# ------------------------------------------------------------------ convert


def convert(opts: options.ConvertOptions, echo: Echo) -> None:
    """`rollout-audit convert`: a trainer's dump at SRC written as a contract log in DST, with the
    trainer's settings as the log's own configuration."""
    from ..adapters.convert import convert as read_dump
    from ..contract.config import Config
    from ..reporting.outputs import atomic_directory, check_new_directory, check_output
    from ..reporting.report import printable
    from ..session.dumps import (
        adapter_waives,
        adapter_waives_denominators,
        merged_trainer_settings,
        trainer_settings_table,
    )
    from ..writing import write_table

    framework, src, dst = opts.framework, opts.src, opts.dst
    check_output(dst, [src])  # a dump is not a contract log: DST may sit next to it, never inside it
    check_new_directory(dst)
    conv = read_dump(framework, [src], dict(opts.context))
    cfg = merged_trainer_settings(Config(), conv)  # validated under the trainer's own stop reasons
    trajectories, updates = conv.tables()
    with atomic_directory(dst) as tmp:  # DST appears whole or not at all
        for name, table in (("trajectories", trajectories), ("updates", updates)):
            if table is not None and table.num_rows:
                (tmp / name).mkdir(parents=True, exist_ok=True)
                try:
                    write_table(tmp / name / "part-0000.parquet", table, name, config=cfg)
                except RolloutAuditError as e:  # the refusal names the dump the records came from
                    raise UsageError(
                        f"{printable(src)}: its {name} do not convert to the contract: {first_line(e)}"
                    ) from None
        if conv.settings:  # the trainer's settings travels with the log: `check DST` audits as `check --from` does
            (tmp / "pyproject.toml").write_text(trainer_settings_table(conv))
    said = f"; the trainer's settings in {Path(dst) / 'pyproject.toml'}" if conv.settings else ""
    echo(f"wrote {dst} ({trajectories.num_rows} trajectories{said})")
    if waived := adapter_waives(conv):  # the adapter's word does not travel inside the log
        echo(
            f"rollout-audit: note: {printable(dst)}: {framework}'s dump does not record {', '.join(waived)}; "
            f"audit it with not_recorded = {json.dumps(waived)} in your own configuration (--config FILE)",
            err=True,
        )
    if adapter_waives_denominators(conv):
        echo(
            f"rollout-audit: note: {printable(dst)}: {framework}'s update records carry no loss reduction nor "
            "denominator; audit it with denominator_not_recorded = true in your own configuration (--config FILE)",
            err=True,
        )


# ------------------------------------------------------------------ demo

DEMO_MARK = ".rollout-audit-demo"  # the file that says a directory is a demo's output


def _replace_own_demo(out: str, echo: Echo) -> None:
    """Remove `out` when an earlier demo wrote it (it holds the demo's mark, a regular file, and is a
    real directory, not a symlink); anything else is left for `check_new_directory` to refuse."""
    import shutil

    p = Path(out)
    mark = p / DEMO_MARK
    if p.is_symlink() or not p.is_dir() or mark.is_symlink() or not mark.is_file():
        return
    echo(f"replacing {out}: an earlier `rollout-audit demo` wrote it", err=True)
    shutil.rmtree(p)


def demo(out: str, profile: str, seed: int, progress: bool | None, echo: Echo) -> int:
    """`rollout-audit demo`: train the reference agent into OUT, audit each run's log with replay;
    the worst exit code."""
    from ..api import audit
    from ..contract.config import load_config
    from ..reporting.outputs import check_new_directory

    try:
        from reference_agent.demo import CONFIG, LOG, REPLAY, format_table, next_steps, replay_summary, run_demo
    except ImportError as e:
        raise UsageError(f"the reference agent needs torch: pip install -e '.[agent]' ({e})") from None
    _replace_own_demo(out, echo)
    check_new_directory(out)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / DEMO_MARK).write_text("written by `rollout-audit demo`: a later demo may replace this directory\n")
    echo(f"training the {profile} profile (seed {seed}) into {out} ...", err=True)
    shown: bool | str = (sys.stderr.isatty() or "lines") if progress is None else progress
    result = run_demo(str(out), profile=profile, seed=seed, progress=shown)
    echo(format_table(result))
    code = 0
    for run in result["run_dirs"]:  # each run apart: the checkpoints of one run's versions replay only its log
        cfg = load_config(Path(run) / CONFIG)
        cfg.replay = REPLAY
        rep = audit(str(Path(run) / LOG), config=cfg.with_source(f"{Path(run) / CONFIG} with replay = {REPLAY}"))
        echo(f"\naudit of the log it wrote, {Path(run) / LOG}:")
        echo(replay_summary(rep.summary))
        echo(rep.render("text"))
        echo(next_steps(run))
        code = max(code, rep.exit_code())
    return code


# ------------------------------------------------------------------ faults


def apply_fault(name: str, src: str, dst: str, seed: int, echo: Echo) -> None:
    """`rollout-audit faults apply`: DST is the log at SRC broken by fault NAME."""
    from ..faults import FAULTS, apply, declared_components, read_records, settings_toml, write_fault_log
    from ..reporting.outputs import atomic_directory, check_new_directory, check_output

    if name not in FAULTS:
        raise UsageError(f"unknown fault {name!r}; see `rollout-audit faults --list`")
    check_output(dst, [src], writes_log=True)
    check_new_directory(dst)
    try:
        (t, u), touched = apply(name, *read_records(src), seed=seed)
    except ValueError as e:  # the log has nothing this fault can break, or cannot be read
        raise UsageError(f"{src}: {first_line(e)}") from None
    f = FAULTS[name]
    declared = declared_components(src) | f.declares  # the producer's declaration, carried over
    with atomic_directory(dst) as tmp:  # DST appears whole or not at all
        write_fault_log(tmp, f, t, u, reward_components=declared)
    echo(f"{dst}: {name} (must raise {', '.join(sorted(f.codes))}); touched: {', '.join(touched) or 'the whole log'}")
    if f.user_config:  # the user's own settings: never written inside the log
        table = settings_toml(f.user_config).splitlines()[1:]
        echo(f"{dst}: caught under your own configuration (--config FILE) stating: {'; '.join(table)}")


def fault_matrix(src: str, parts: int, echo: Echo) -> int:
    """`rollout-audit faults matrix`: every fault applied to SRC and audited; 1 when one is missed."""
    import tempfile

    from ..faults import FAULTS, NoTarget, detect, read_records, render_matrix

    trajs, ups = read_records(src)
    with tempfile.TemporaryDirectory() as work:
        try:
            rows = [detect(n, trajs, ups, work, parts=parts) for n in FAULTS]
        except NoTarget as e:
            raise UsageError(f"{src}: {first_line(e)}") from None
    echo(render_matrix(rows))
    return 0 if all(r.ok for r in rows) else 1
