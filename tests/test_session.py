"""One audit, every entry point: the same request through `check`, `report`, `watch`, `audit()` and
`assert_clean` (and so the pytest fixture, which is `assert_clean`) gives the same exit code,
findings and not-run list, on every framework fixture (compliant and faulted, converted with
`--from`) and on the agent's compliant log and a spread of its broken ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from adapterhelp import CONTEXT, FIXTURES, cli, context_args, users_word
from click.testing import CliRunner

import rollout_audit as ra
from rollout_audit.cli import main
from rollout_audit.contract.errors import AuditFailed
from rollout_audit.testing import assert_clean

ROOT = Path(__file__).resolve().parent.parent
DUMPS = sorted((p.parent.name, p.stem) for p in FIXTURES.glob("*/*.jsonl"))
BROKEN = sorted(p.name for p in (ROOT / "fixtures" / "broken").iterdir() if p.is_dir())
LOGS = ["compliant", *BROKEN]  # the agent's compliant log and every broken one
# the fast tier's share of the parity below: the agent's compliant log, a broken one, and a dump with
# findings (a conversion, the trainer's settings and the relabelling back to the dump's records); the
# full suite runs every log and every dump
FAST = {"compliant", "loss_over_whole_transcript", "slime-removed_sample_in_denominator"}
assert FAST <= {*LOGS, *(f"{n}-{c}" for n, c in DUMPS)}, "a fast-tier parity case is no longer bundled"


def _tier(ids: list[str], values: list) -> list:
    return [pytest.param(*v, id=i, marks=() if i in FAST else pytest.mark.slow) for i, v in zip(ids, values)]


def _key(f: dict) -> tuple:
    return (f["code"], f["severity"], f["trajectory_id"], f["turn"], f["position"], f["message"])


def _order(key: tuple) -> tuple:
    # a finding without a turn or position (null) sorts before those with one
    return tuple((v is not None, v) for v in key)


def _lib(rep: ra.Report) -> tuple[int, list[tuple], list[str]]:
    return rep.exit_code(), sorted((_key(f) for f in rep.findings.to_dicts()), key=_order), sorted(rep.not_run)


def _json(stdout: str) -> tuple[list[tuple], list[str]]:
    doc = json.loads(stdout)
    return sorted((_key(f) for f in doc["findings"]), key=_order), sorted(n["code"] for n in doc["not_run"])


def _watch_step(tmp: Path, step: Path, *frm: str) -> dict:
    """`watch` over a directory holding `step` (a dump file, or a log directory moved in whole):
    the status entry of that one step."""
    root = tmp / "watched"
    root.mkdir()
    (shutil.copytree if step.is_dir() else shutil.copy)(step, root / step.name)
    status = tmp / "status.json"
    res = CliRunner().invoke(
        main,
        ["watch", str(root), *frm, "--status", str(status), "--interval", "0.01", "--max-steps", "1", "--idle", "5"],
    )
    assert res.exit_code in (0, 1, 2), res.output
    (entry,) = json.loads(status.read_text())["steps"]
    return entry


def _same_everywhere(tmp: Path, target: Path, frm: tuple[str, ...], lib_kw: dict) -> None:
    checked = cli("check", target, *frm, "--format", "json")
    code = checked.exit_code
    findings, not_run = _json(checked.stdout)
    # the library
    assert _lib(ra.audit(str(target), **lib_kw)) == (code, findings, not_run)
    # assert_clean (and the pytest fixture `rollout_audit_clean`, the same function)
    try:
        assert_clean(str(target), **lib_kw)
        raised = None
    except AuditFailed as e:
        raised = e.report
    assert (raised is not None) == (code != 0)
    if raised is not None:
        assert _lib(raised) == (code, findings, not_run)
    # the HTML report: its exit code is check's
    page = tmp / "r.html"
    assert cli("report", target, *frm, "-o", page).exit_code == code
    # watch: the step's exit code and codes are check's
    entry = _watch_step(tmp, target, *frm)
    assert (entry["exit_code"], entry["codes"]) == (code, sorted({f[0] for f in findings})), entry


@pytest.mark.parametrize(("name", "case"), _tier([f"{n}-{c}" for n, c in DUMPS], DUMPS))
def test_a_framework_dump_audits_the_same_through_every_entry_point(tmp_path, name, case):
    frm = ("--from", name, *context_args())
    _same_everywhere(tmp_path, FIXTURES / name / f"{case}.jsonl", frm, {"framework": name, "context": CONTEXT})


@pytest.mark.parametrize("log", _tier(LOGS, [(x,) for x in LOGS]))
def test_an_agent_log_audits_the_same_through_every_entry_point(tmp_path, log):
    target = ROOT / "fixtures" / ("compliant" if log == "compliant" else f"broken/{log}")
    _same_everywhere(tmp_path, target, (), {})


@pytest.mark.slow
def test_convert_then_check_is_check_from_on_every_dump(tmp_path):
    """The trainer's policy a conversion derived travels with the converted log."""
    for i, (name, case) in enumerate(DUMPS):
        src, out = FIXTURES / name / f"{case}.jsonl", tmp_path / f"out{i}"
        conv = cli("convert", "--from", name, src, out, *context_args())
        if conv.exit_code:
            assert cli("check", "--from", name, src, *context_args()).exit_code == 2, conv.output
            continue
        direct = cli("check", "--from", name, src, *context_args(), "--format", "json")
        after = cli("check", out, "--format", "json", *users_word(conv, tmp_path))  # what the log cannot vouch for
        assert direct.exit_code == after.exit_code, (name, case, direct.output, after.output)
        strip = [(c, s, t, u, p) for c, s, t, u, p, _ in _json(direct.stdout)[0]]
        assert strip == [(c, s, t, u, p) for c, s, t, u, p, _ in _json(after.stdout)[0]], (name, case)
        assert _json(direct.stdout)[1] == _json(after.stdout)[1], (name, case)


# a conversion is audited in memory, where its adapter built the tables; the cases of the fast tier:
# findings relabelled to the dump (slime), a compliant trainer (verl) and an adapter that vouches for
# what its trainer does not record (rllm: no loss denominators)
IN_MEMORY_FAST = {"slime-removed_sample_in_denominator", "verl-trainer_compliant", "rllm-trainer_compliant"}
assert IN_MEMORY_FAST <= {f"{n}-{c}" for n, c in DUMPS}, "a fast-tier in-memory case is no longer bundled"


def _verdict(rep: ra.Report, names: dict[str, str]) -> tuple:
    """What a report says, with the file names of `names` replaced (a written file: the in-memory name)."""

    def text(s):
        for a, b in names.items():
            s = s.replace(a, b) if isinstance(s, str) else s
        return s

    found = sorted((tuple(text(v) for v in _key(f)) + (text(f["file"]),) for f in rep.findings.to_dicts()), key=_order)
    return (
        rep.exit_code(),
        rep.complete,
        found,
        {k: text(v) for k, v in rep.not_run.items()},
        {k: text(v) for k, v in rep.partial.items()},
        {k: text(v) for k, v in rep.unfulfilled.items()},
        [{k: text(v) for k, v in c.items()} for c in rep.crashes],
        rep.summary["rows_read"],
    )


@pytest.mark.parametrize(
    ("name", "case"),
    [
        pytest.param(n, c, id=f"{n}-{c}", marks=() if f"{n}-{c}" in IN_MEMORY_FAST else pytest.mark.slow)
        for n, c in DUMPS
    ],
)
def test_a_conversion_audited_in_memory_is_its_tables_written_as_a_log(tmp_path, name, case):
    """`check --from` audits the converted tables in memory (no temporary log); the verdict is the
    one the same tables give written as a contract log and audited from disk under the same
    configuration (the session's, with the trainer's settings and the adapter's word merged in), and
    the session's report is that audit's, relabelled to the dump's records."""
    from rollout_audit.adapters.convert import convert
    from rollout_audit.reading.io import discover
    from rollout_audit.reading.read import MEMORY
    from rollout_audit.running.engine import run_audit
    from rollout_audit.session import Request, in_memory, run
    from rollout_audit.writing import write_table

    src = FIXTURES / name / f"{case}.jsonl"
    audited = run(Request(source=[str(src)], framework=name, context=CONTEXT))
    conv = convert(name, [str(src)], CONTEXT)
    names = {}
    for kind, table in zip(("trajectories", "updates"), conv.tables()):
        if table is not None and table.num_rows:
            (tmp_path / kind).mkdir()
            write_table(tmp_path / kind / "part-0000.parquet", table, kind, validate=False)
            names[str(tmp_path / kind / "part-0000.parquet")] = MEMORY
    names[str(tmp_path)] = MEMORY
    memory = run_audit(in_memory(conv), audited.cfg)
    disk = run_audit(discover([tmp_path]), audited.cfg)
    assert _verdict(memory, {}) == _verdict(disk, names), (name, case)
    assert audited.checked.exit_code() == memory.exit_code() and sorted(audited.checked.not_run) == sorted(
        memory.not_run
    )
    assert [_key(f) for f in audited.checked.findings.to_dicts()] == [_key(f) for f in memory.findings.to_dicts()]
    assert MEMORY not in " ".join(audited.checked.findings["file"].drop_nulls().to_list())  # the dump's records
