"""No string of an audited log becomes a workflow command of a CI runner, in any format or command.

`obeyed` reads output as a GitHub Actions runner does (actions/runner
src/Runner.Common/ActionCommand.cs, `TryParseV2` then the legacy `TryParse`, as
src/Runner.Worker/ActionCommandManager.cs tries them): a line whose text, leading blanks aside, starts
with `::NAME ...::`, or that holds `##[NAME ...]` anywhere, is a command when NAME is registered."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hostilehelp import assert_clean_exit, cli

ROOT = Path(__file__).resolve().parent.parent
BROKEN = ROOT / "fixtures" / "broken"
# the runner's registered command names (its command extensions, and stop-commands)
REGISTERED = {"set-env", "set-output", "save-state", "add-mask", "add-path", "add-matcher", "remove-matcher"} | {
    "debug", "warning", "error", "notice", "group", "endgroup", "echo", "stop-commands",
}  # fmt: skip
HOSTILE = "\n::error::pwned%,:##[add-mask]x:"


def obeyed(text: str) -> list[tuple[str, dict[str, str], str]]:
    """The workflow commands a runner would obey in `text`: (name, properties, data) per line."""
    out = []
    for line in text.splitlines():
        s = line.lstrip()
        end = s.find("::", 2) if s.startswith("::") else -1
        if end >= 0:
            info = s[2:end]
            name, _, props = info.partition(" ")
            if name in REGISTERED:
                pairs = (p.split("=", 1) for p in props.strip().split(",") if p)
                out.append((name, {kv[0]: kv[1] for kv in pairs if len(kv) == 2}, s[end + 2 :]))
                continue
        at = line.find("##[")
        close = line.find("]", at)
        if at >= 0 and close >= 0 and line[at + 3 : close].split(" ", 1)[0] in REGISTERED:
            out.append((line[at + 3 : close].split(" ", 1)[0], {}, line[close + 1 :]))
    return out


def _hostile_log(tmp_path: Path) -> Path:
    """A broken fixture whose trajectory ids, stop reasons and file name carry forged commands."""
    log = tmp_path / "log"
    shutil.copytree(BROKEN / "policy_tokens_unmasked", log)
    old = log / "trajectories" / "part-0000.parquet"
    t = pq.read_table(old)
    ids = pa.array([HOSTILE + i for i in t.column("trajectory_id").to_pylist()])
    t = t.set_column(t.schema.get_field_index("trajectory_id"), "trajectory_id", ids)
    reasons = pa.array([HOSTILE] * t.num_rows, t.schema.field("stop_reason").type)
    t = t.set_column(t.schema.get_field_index("stop_reason"), "stop_reason", reasons)
    pq.write_table(t.replace_schema_metadata(pq.read_schema(old).metadata), log / "trajectories" / f"{HOSTILE}.parquet")
    old.unlink()
    u = pq.read_table(log / "updates" / "updates.parquet")
    for col in ("trajectory_ids", "stat_trajectory_ids"):
        renamed = [None if v is None else [HOSTILE + i for i in v] for v in u.column(col).to_pylist()]
        u = u.set_column(u.schema.get_field_index(col), col, pa.array(renamed, u.schema.field(col).type))
    pq.write_table(u, log / "updates" / "updates.parquet")
    return log


def test_the_reader_of_this_file_finds_the_forged_commands():
    assert [c[0] for c in obeyed(f"step{HOSTILE}: ok")] == ["error"]
    assert obeyed("  ::warning file=a,title=b::m") == [("warning", {"file": "a", "title": "b"}, "m")]
    assert [c[0] for c in obeyed("text ##[add-mask]x")] == ["add-mask"]
    assert obeyed("T001 a:b, c (d)") == []


@pytest.mark.parametrize("fmt", ["text", "concise", "junit"])
def test_no_format_brings_a_workflow_command(tmp_path, fmt):
    r = cli("check", str(_hostile_log(tmp_path)), "--format", fmt)
    assert_clean_exit(r, (1,))
    assert "pwned" in r.stdout and "T" in r.stdout  # the hostile strings are shown, escaped
    assert obeyed(r.stdout + r.stderr) == []


def test_github_format_brings_only_its_own_annotations(tmp_path):
    r = cli("check", str(_hostile_log(tmp_path)), "--format", "github")
    assert_clean_exit(r, (1,))
    cmds = obeyed(r.stdout)
    assert len(cmds) == len(r.stdout.splitlines()) > 1, r.stdout[:2000]
    assert {name for name, _, _ in cmds} <= {"error", "warning", "notice"}
    assert any("pwned" in data for _, _, data in cmds)
    for _, props, data in cmds:
        assert set(props) <= {"file", "title"}, props
        assert all(c not in v for v in props.values() for c in ":,\n\r"), props  # escaped (%3A, %2C)
        assert "\n" not in data and "\r" not in data
    assert any("pwned%25%2C%3A" in p.get("file", "") for _, p, _ in cmds)  # the file name, as a property
    assert obeyed(r.stderr) == []


def test_a_watched_step_named_as_a_command_is_shown_as_text(tmp_path):
    d = tmp_path / "watched"
    d.mkdir()
    shutil.copy(
        BROKEN / "policy_tokens_unmasked" / "trajectories" / "part-0000.parquet",
        d / "::error file=x,line=1::forged.parquet",
    )
    r = cli("watch", str(d), "--interval", "0.01", "--max-steps", "1", "--idle", "1")
    assert_clean_exit(r, (0, 1))
    assert "forged.parquet" in r.stdout, r.stdout
    assert obeyed(r.stdout + r.stderr) == []


# ---------------------------------------------------------------- the column compare_logprobs names


def _with_second(tmp_path: Path, values: pa.Array | None) -> tuple[Path, Path]:
    """The compliant log with `old_logprobs` (absent when None) and a configuration naming it."""
    log = tmp_path / "log"
    shutil.copytree(ROOT / "fixtures" / "compliant", log)
    part = next((log / "trajectories").glob("*.parquet"))
    t = pq.read_table(part)
    if values is not None:
        pq.write_table(t.append_column("old_logprobs", values(t) if callable(values) else values), part)
    cfg = tmp_path / "audit.toml"
    cfg.write_text(f'{(log / "pyproject.toml").read_text()}\ncompare_logprobs = "old_logprobs"\n')
    return log, cfg


def _short_row(t: pa.Table) -> pa.Array:
    lp = t.column("behavior_logprobs").to_pylist()
    lp[2] = lp[2][:-1]
    return pa.array(lp, pa.list_(pa.float64()))


def _null_row(t: pa.Table) -> pa.Array:
    lp = t.column("behavior_logprobs").to_pylist()
    lp[2] = None
    return pa.array(lp, pa.list_(pa.float64()))


@pytest.mark.parametrize(
    "values, said",
    [
        (None, "old_logprobs"),
        (lambda t: pa.array(range(t.num_rows), pa.int64()), "column old_logprobs is int64, not a list"),
        (lambda t: pa.array([[[0.0]]] * t.num_rows), "column old_logprobs is list<element: list<element: double>>"),
        (_short_row, "entries, token_ids has"),
        (_null_row, "column old_logprobs is null, token_ids has"),  # it said "has -1 entries"
    ],
    ids=["absent", "int64", "list-of-lists", "one-row-short", "one-row-null"],
)
def test_a_bad_compare_logprobs_column_is_one_line_naming_it_and_exit_2(tmp_path, values, said):
    log, cfg = _with_second(tmp_path, values)
    r = cli("check", str(log), "--config", str(cfg), "--select", "L207")
    assert_clean_exit(r, (2,))
    assert "crashed" not in r.stdout + r.stderr and said in r.stdout + r.stderr, r.stdout + r.stderr
    if values in (_short_row, _null_row):
        tid = pq.read_table(next((log / "trajectories").glob("*.parquet"))).column("trajectory_id")[2].as_py()
        assert tid in r.stdout + r.stderr


def test_an_aligned_compare_logprobs_column_is_compared(tmp_path):
    log, cfg = _with_second(tmp_path, lambda t: t.column("behavior_logprobs"))
    r = cli("check", str(log), "--config", str(cfg), "--select", "L207")
    assert r.returncode == 0 and "L207" not in r.stdout.split("not run")[-1], r.stdout


# ---------------------------------------------------------------- token ids and token_turn


def _edited(tmp_path: Path, column: str, edit) -> tuple[Path, str]:
    """The compliant log with row 3's `column` list edited by `edit`; the row's trajectory id."""
    log = tmp_path / "log"
    shutil.copytree(ROOT / "fixtures" / "compliant", log)
    part = next((log / "trajectories").glob("*.parquet"))
    t = pq.read_table(part)
    values = t.column(column).to_pylist()
    values[3] = edit(values[3])
    i = t.schema.get_field_index(column)
    pq.write_table(t.set_column(i, column, pa.array(values, t.schema.field(column).type)), part)
    return log, t.column("trajectory_id")[3].as_py()


@pytest.mark.parametrize("bad", [-1, -(2**31)])
def test_a_negative_token_id_is_s001_naming_the_row(tmp_path, bad):
    log, tid = _edited(tmp_path, "token_ids", lambda v: [*v[:5], bad, *v[6:]])
    r = cli("check", str(log), "--select", "S001", "--format", "concise")
    assert_clean_exit(r, (1,))
    line = next(x for x in r.stdout.splitlines() if " S001 " in x)
    assert f":{tid}::5: S001 token_ids: 1 negative token id(s) (first: {bad})" in line, r.stdout


def test_token_turn_minus_one_after_a_turn_is_s004_naming_the_row(tmp_path):
    def late(v: list[int]) -> list[int]:
        i = next(k for k in range(len(v)) if v[k] >= 0) + 1
        return [*v[:i], -1, *v[i + 1 :]]

    log, tid = _edited(tmp_path, "token_turn", late)
    r = cli("check", str(log), "--select", "S004", "--format", "concise")
    assert_clean_exit(r, (1,))
    assert f":{tid}::" in r.stdout and "token_turn -1 after a token of a turn" in r.stdout, r.stdout
    clean = cli("check", str(ROOT / "fixtures" / "compliant"), "--select", "S001,S004")
    assert clean.returncode == 0, clean.stdout
