"""Each command's options are declared once, as the fields of one frozen object: the click
command is built from the fields, and the audit a command asks for is made from that object, so
`check` and `report` given the same audit options ask for the same audit."""

from __future__ import annotations

import dataclasses

import click
import pytest

from rollout_audit.cli import main
from rollout_audit.cli.options import AuditOptions, CheckOptions, Parsed, ReportOptions


def _fields(cls: type[Parsed]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if "click" in f.metadata]


@pytest.mark.parametrize("name", ["check", "report", "diff", "filter", "watch", "show", "convert"])
def test_a_commands_parameters_are_its_options_fields(name):
    cmd = main.commands[name]
    params = [p.name for p in cmd.params if p.name != "help"]
    cls = {"check": CheckOptions, "report": ReportOptions}.get(name)
    if cls is None:
        from rollout_audit.cli import options

        cls = getattr(options, f"{name.capitalize()}Options")
    assert params == _fields(cls)  # nothing declared beside the object, nothing of it left undeclared


def test_check_and_report_share_every_audit_option():
    audit = set(_fields(AuditOptions))
    for name in ("check", "report"):
        assert audit <= {p.name for p in main.commands[name].params}


def _parsed(cls: type[Parsed], args: list[str]) -> Parsed:
    """What the command line `args` parses into, through the command built from `cls`."""
    got: list[Parsed] = []

    @cls.command(click.Group(), "probe")
    def probe(opts) -> None:
        got.append(opts)

    probe.main(args, standalone_mode=False)
    return got[0]


def test_the_same_audit_options_make_the_same_request(tmp_path):
    args = ["fixtures/compliant", "--select", "m,L201", "--ignore", "R409", "--replay", "3", "--preview"]
    args += ["--from", "verl", "--context", "rollout_n=4"]
    c = _parsed(CheckOptions, args)
    r = _parsed(ReportOptions, args)
    assert isinstance(c, CheckOptions) and isinstance(r, ReportOptions)
    assert c.select == ("M", "L201")  # normalised once, upper case, split on commas
    assert dict(c.context) == {"rollout_n": "4"}
    rc, rr = c.request(c.paths), r.request(r.paths)
    assert rc == rr
    assert rc.options.select == ("M", "L201") and rc.options.ignore == ("R409",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.strict = True  # type: ignore[misc]


def test_ray_alone_before_a_path_is_a_local_cluster():
    c = _parsed(CheckOptions, ["--ray", "fixtures/compliant"])
    assert isinstance(c, CheckOptions)
    assert c.paths == ("fixtures/compliant",) and c.ray is True
    assert c.running().executor_name == "ray"


def test_an_unknown_code_is_refused_once_in_one_line():
    from click.testing import CliRunner

    res = CliRunner().invoke(main, ["check", "fixtures/compliant", "--select", "Z999"])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "rollout-audit: error: unknown check code or prefix 'Z999'; see `rollout-audit explain --list`"
    ]


def test_report_audits_each_log_on_its_own_as_check_does(tmp_path):
    from click.testing import CliRunner

    two = ["fixtures/compliant", "fixtures/broken/loss_over_whole_transcript"]
    out = tmp_path / "r.html"
    rep = CliRunner().invoke(main, ["report", *two, "-o", str(out)])
    chk = CliRunner().invoke(main, ["check", *two, "--format", "json"])
    assert rep.exit_code == chk.exit_code == 1
    page = out.read_text()
    assert 'id="logs"' in page and 'id="log0-verdict"' in page and 'id="log1-verdict"' in page
    assert "f-S002" not in page  # two logs are not one log with every trajectory id twice
