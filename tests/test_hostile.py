"""Hostile and malformed input: outputs never touch inputs, strings validated at
the read boundary, every output format escapes what it prints, bounded resources, discovery
that reports what it does not read. The CLI runs in a subprocess: what a user sees."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import xml.dom.minidom
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fuzzlib import run_cli
from hostilehelp import EVIL_ID, Run, assert_clean_exit, cli, write

from rollout_audit import Config, RolloutWriter, audit
from rollout_audit.contract.config import tomllib  # tomllib, or tomli before Python 3.11
from rollout_audit.reading.io import discover
from rollout_audit.synth import make_log


def child(*args: str, timeout: float = 120) -> Run:
    """`rollout-audit ARGS` in a child process (forked from the fuzz tests' preloaded server, so
    that it costs the audit, not the imports): a native crash is an exit code, not a dead test run."""
    with tempfile.TemporaryDirectory() as work:
        out = run_cli(list(args), Path(work), timeout=timeout)
    return Run(out.exit, out.stdout, out.stderr)


def digest(root: Path) -> dict[str, str]:
    """Every file under `root` (or `root` itself) with the hash of its bytes."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def small_records():
    return make_log(n_tasks=2, group_size=2, n_versions=1, seed=3)


def write_table(path: Path, table: pa.Table) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def clean_table(records) -> pa.Table:
    from rollout_audit.reading.records import records_to_table

    return records_to_table(records[0])


# ---------------------------------------------------------------- 1. outputs never touch inputs


@pytest.fixture
def log(tmp_path, small_records) -> Path:
    return write(tmp_path / "log", small_records[0])


@pytest.mark.parametrize("how", ["same file", "dot-relative", "absolute", "inside dir", "symlinked dir"])
def test_check_output_never_overwrites_input(tmp_path, log, how):
    part = log / "trajectories" / "part-0000.parquet"
    (tmp_path / "link").symlink_to(log)
    target, out = {
        "same file": (part, part),
        "dot-relative": (log, Path("./log/trajectories/report.txt")),
        "absolute": (log, (log / "report.txt").resolve()),
        "inside dir": (log, log / "trajectories" / "x.parquet"),
        "symlinked dir": (log, tmp_path / "link" / "report.txt"),
    }[how]
    before = digest(log)
    r = cli("check", str(target), "-o", str(out), cwd=tmp_path)
    assert r.returncode == 2 and "never writes to its input" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert digest(log) == before


def test_check_output_hard_link_to_input_refused(tmp_path, log):
    part = log / "trajectories" / "part-0000.parquet"
    os.link(part, tmp_path / "alias.parquet")
    before = digest(log)
    r = cli("check", str(part), "-o", str(tmp_path / "alias.parquet"))
    assert r.returncode == 2 and "audited input" in r.stderr
    assert digest(log) == before


@pytest.mark.parametrize("command", ["check", "report"])
def test_output_hard_linked_to_any_file_of_the_log_refused(tmp_path, log, command):
    os.link(log / "trajectories" / "part-0000.parquet", tmp_path / "alias.txt")
    before = digest(log)
    r = cli(command, str(log), "-o", str(tmp_path / "alias.txt"))
    assert r.returncode == 2 and "hard link" in r.stderr and "never writes to its input" in r.stderr, r.stderr
    assert digest(log) == before


def test_output_is_replaced_never_written_through(tmp_path, log):
    keep = tmp_path / "keep.txt"
    keep.write_text("mine\n")
    os.link(keep, tmp_path / "out.txt")
    r = cli("check", str(log), "-o", str(tmp_path / "out.txt"))
    assert_clean_exit(r, (0, 1))
    assert keep.read_text() == "mine\n" and "configuration:" in (tmp_path / "out.txt").read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_report_from_inside_the_log_refused(log):
    before = digest(log)
    r = cli("report", ".", cwd=log)  # default output rollout-audit-report.html lands in "."
    assert r.returncode == 2 and "inside the audited log" in r.stderr
    assert digest(log) == before and not (log / "rollout-audit-report.html").exists()


def test_faults_apply_refuses_a_copy_next_to_the_source_file(log):
    part = log / "trajectories" / "part-0000.parquet"
    before = digest(log)
    r = cli("faults", "apply", "tool_tokens_trained", str(part), str(log / "trajectories" / "broken"))
    assert r.returncode == 2 and "inside the audited log" in r.stderr
    assert digest(log) == before


def test_outputs_outside_the_log_are_written(tmp_path, log):
    r = cli("check", str(log), "-o", str(tmp_path / "report.txt"))
    assert_clean_exit(r, (0, 1))
    assert (tmp_path / "report.txt").read_text().strip()


# ---------------------------------------------------------------- 2-3. read boundary


def _with_column(table: pa.Table, name: str, arr: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, arr)


def test_non_utf8_string_is_a_finding_and_the_rest_is_audited(tmp_path, small_records):
    t = clean_table(small_records)
    raw = [s.encode() for s in t.column("stop_reason").to_pylist()]
    raw[2] = b"\xff\xfe\xc3"
    bad = _with_column(t, "stop_reason", pa.array(raw, pa.binary()).view(pa.string()))
    write_table(tmp_path / "log" / "trajectories" / "a.parquet", bad)
    write(tmp_path / "log", small_records[0], "b.parquet")
    r = child("check", str(tmp_path / "log"), "--format", "json")
    assert_clean_exit(r, (1,))
    rep = json.loads(r.stdout)
    s001 = [f for f in rep["findings"] if f["code"] == "S001"]
    assert any("stop_reason" in f["message"] and "row 2" in f["message"] and "UTF-8" in f["message"] for f in s001)
    assert rep["summary"]["rows_read"] == 2 * len(small_records[0])  # both files audited


def test_non_utf8_inside_the_turns_struct(tmp_path, small_records):
    t = clean_table(small_records)
    turns = t.column("turns").combine_chunks()
    values = turns.flatten()
    i = values.type.get_field_index("action_text")
    texts = [(s or "").encode() for s in values.field(i).to_pylist()]
    texts[-1] = b"ok\x80"
    fields = [
        values.field(k) if k != i else pa.array(texts, pa.binary()).view(pa.string())
        for k in range(values.type.num_fields)
    ]
    struct = pa.StructArray.from_arrays(fields, fields=list(values.type))
    bad = _with_column(t, "turns", pa.ListArray.from_arrays(turns.offsets, struct))
    write_table(tmp_path / "log" / "a.parquet", bad)
    r = child("check", str(tmp_path / "log"), "--format", "json")
    assert_clean_exit(r, (1,))
    msgs = [f["message"] for f in json.loads(r.stdout)["findings"] if f["code"] == "S001"]
    assert any(m.startswith("turns: row ") and "UTF-8" in m for m in msgs), msgs


def test_duplicate_column_is_s005_and_the_rest_is_audited(tmp_path, small_records):
    t = clean_table(small_records)
    dup = t.append_column("reward", t.column("reward"))
    write_table(tmp_path / "log" / "a.parquet", dup)
    write(tmp_path / "log", small_records[0], "b.parquet")
    r = cli("check", str(tmp_path / "log"), "--format", "json")
    assert_clean_exit(r, (1,))
    rep = json.loads(r.stdout)
    s005 = [f for f in rep["findings"] if f["code"] == "S005"]
    assert len(s005) == 1 and "reward" in s005[0]["message"] and s005[0]["file"].endswith("a.parquet")
    assert rep["summary"]["rows_read"] == len(small_records[0])


def test_duplicate_column_in_memory_is_s001(small_records):
    t = clean_table(small_records)
    rep = audit(t.append_column("reward", t.column("reward")))
    assert any("reward" in m and "more than once" in m for m in rep.findings["message"].to_list())


# ---------------------------------------------------------------- 4. injection into CI and terminals


@pytest.fixture
def evil_log(tmp_path, small_records) -> Path:
    trajs = [dict(t) for t in small_records[0]]
    trajs[0]["stop_reason"] = "weird\n::error file=x,line=1::forged\x1b[2J\u202e"
    trajs[1]["trajectory_id"] = EVIL_ID
    root = tmp_path / "ev\nil,a::b%"
    return write(root, trajs)


@pytest.mark.parametrize("fmt", ["text", "github", "junit"])
def test_formats_never_emit_controls_or_forged_commands(evil_log, fmt):
    r = cli("check", str(evil_log), "--format", fmt)
    assert_clean_exit(r, (1,))
    assert not any(ord(c) < 32 and c != "\n" or 0x7F <= ord(c) <= 0x9F or c == "\u202e" for c in r.stdout)
    lines = r.stdout.splitlines()
    if fmt == "github":
        assert all(line.startswith(("::error ", "::warning ", "::notice ")) for line in lines)
        props = [line[2:].split("::", 1)[0].split(" ", 1)[1] for line in lines if " file=" in line]
        assert props and all(p.count(",") == 1 and p.count("=") == 2 and ":" not in p for p in props), props
    else:
        assert not any(line.lstrip().startswith("::") for line in lines)
    if fmt == "junit":
        xml.dom.minidom.parseString(r.stdout.encode())
    assert "\\x1b" in r.stdout or fmt == "github"


def test_json_round_trips_hostile_strings(evil_log):
    r = cli("check", str(evil_log), "--format", "json")
    assert_clean_exit(r, (1,))
    ids = {f["trajectory_id"] for f in json.loads(r.stdout)["findings"]}
    assert "\x1b" not in r.stdout and (EVIL_ID in ids or ids)


def test_show_prints_markup_as_text(evil_log):
    r = cli("show", str(evil_log), EVIL_ID, "--color", "--width", "400")  # one line whatever the terminal
    assert_clean_exit(r, (0,))
    assert "[link=https://e.x]y[/]" in r.stdout and "\x1b]8;" not in r.stdout and "\x1b[2J" not in r.stdout


def test_long_values_are_cut_with_their_length(tmp_path, small_records):
    trajs = [dict(t) for t in small_records[0]]
    trajs[0]["stop_reason"] = "x" * 200_000
    r = cli("check", str(write(tmp_path / "log", trajs)), "--format", "json")
    assert_clean_exit(r, (1,))
    assert len(r.stdout) < 50_000 and "characters)" in r.stdout


# ---------------------------------------------------------------- 5. resources


def test_token_cap_makes_a_trajectory_a_finding(tmp_path, small_records):
    log = write(tmp_path / "log", small_records[0])
    (tmp_path / "pyproject.toml").write_text("[tool.rollout-audit]\nmax_tokens_per_trajectory = 10\n")
    r = cli("check", str(log), "--format", "json", cwd=tmp_path)
    assert_clean_exit(r, (1, 2))  # 2 when every trajectory was over the cap: nothing left to audit
    msgs = [f["message"] for f in json.loads(r.stdout)["findings"] if f["code"] == "S001"]
    assert any("max_tokens_per_trajectory" in m for m in msgs)


def test_row_group_cap_makes_a_file_a_finding(tmp_path, small_records):
    log = write(tmp_path / "log", small_records[0])
    (tmp_path / "pyproject.toml").write_text("[tool.rollout-audit]\nmax_row_group_bytes = 1000\n")
    r = cli("check", str(log), "--format", "json", cwd=tmp_path)
    assert_clean_exit(r, (2,))  # the only trajectory file is not read: nothing to audit
    assert json.loads(r.stdout)["unusable"]
    assert any("max_row_group_bytes" in f["message"] for f in json.loads(r.stdout)["findings"] if f["code"] == "S005")


def long_row(record: dict, n: int) -> pa.Table:
    """`record` as a one-row table whose token lists hold `n` zeros each: a few KB once
    compressed, whatever `n` (a compression bomb)."""
    from rollout_audit.reading.records import records_to_table

    table = records_to_table([record])
    cols = []
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if name in ("token_ids", "token_source", "loss_mask", "behavior_logprobs", "token_turn"):
            vt = col.type.value_type
            zeros = np.zeros(n, dtype=bool if pa.types.is_boolean(vt) else vt.to_pandas_dtype())
            col = pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.array(zeros).cast(vt))
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=table.schema)


def write_groups(path: Path, groups: list[pa.Table]) -> Path:
    """One Parquet file with each table as a row group (zstd, as writers use)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, groups[0].schema, compression="zstd") as w:
        for g in groups:
            w.write_table(g.cast(groups[0].schema))
    return path


def test_compression_bomb_is_refused_before_decoding(tmp_path, small_records):
    t = small_records[0]
    from rollout_audit.reading.records import records_to_table

    normal = records_to_table(t[:2])
    bomb = long_row(dict(t[2], trajectory_id="bomb"), 20_000_000)  # 20M tokens in one row
    f = write_groups(tmp_path / "log" / "trajectories" / "part-0.parquet", [normal, bomb])
    assert f.stat().st_size < 200_000
    r = run_cli(["check", str(tmp_path / "log"), "--format", "json"], tmp_path)
    assert r.exit == 1, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert r.peak_mb < 800, r.peak_mb  # decoding the row alone takes about 1 GB
    report = json.loads(r.stdout)
    (found,) = [x for x in report["findings"] if "max_tokens_per_trajectory" in x["message"]]
    assert found["code"] == "S001" and found["file"] == str(f)
    assert "row 2 (trajectory bomb): 20,000,000 tokens" in found["message"]
    assert report["summary"]["rows_read"] == 2  # the rows of the other row group are audited


def test_a_long_trajectory_leaves_its_row_group_unread_and_says_so(tmp_path, small_records):
    t = small_records[0]
    from rollout_audit.reading.records import records_to_table

    lists = ("token_ids", "token_source", "loss_mask", "behavior_logprobs", "token_turn")
    groups = [records_to_table(t[:2]), records_to_table([t[2], dict(t[3], **{c: t[3][c] * 3 for c in lists})])]
    longest = len(t[3]["token_ids"]) * 3
    f = write_groups(tmp_path / "log" / "trajectories" / "part-0.parquet", groups)
    limit = max(len(x["token_ids"]) for x in t)  # every other trajectory fits
    (tmp_path / "pyproject.toml").write_text(f"[tool.rollout-audit]\nmax_tokens_per_trajectory = {limit}\n")
    r = cli("check", str(tmp_path / "log"), "--format", "json", cwd=tmp_path)
    assert_clean_exit(r, (1,))
    report = json.loads(r.stdout)
    (found,) = [x for x in report["findings"] if "max_tokens_per_trajectory" in x["message"]]
    assert found["file"] == str(f) and found["code"] == "S001"
    assert f"row 3 (trajectory {t[3]['trajectory_id']}): {longest:,} tokens" in found["message"]
    assert "row group 1 is not read, so its 1 other trajectories (rows 2-3)" in found["message"]
    assert report["summary"]["rows_read"] == 2


def test_a_row_group_over_the_byte_bound_is_s005_and_the_rest_is_audited(tmp_path, small_records):
    t = small_records[0]
    from rollout_audit.reading.io import discover
    from rollout_audit.reading.records import records_to_table

    groups = [records_to_table(t[:2]), long_row(dict(t[2], trajectory_id="wide"), 200_000)]
    f = write_groups(tmp_path / "log" / "trajectories" / "part-0.parquet", groups)
    sizes = discover([tmp_path / "log"]).files[0].groups
    assert sizes[1].tokens == 200_000 and sizes[1].decoded > 200_000 * 17  # four 32-bit lists and a mask
    assert sizes[0].decoded < 10**6
    (tmp_path / "pyproject.toml").write_text("[tool.rollout-audit]\nmax_row_group_bytes = 1000000\n")
    r = cli("check", str(tmp_path / "log"), "--format", "json", cwd=tmp_path)
    assert_clean_exit(r, (1,))
    report = json.loads(r.stdout)
    (found,) = [x for x in report["findings"] if x["code"] == "S005"]
    assert found["file"] == str(f)
    assert "row group 1 (rows 2-2) decodes to" in found["message"] and "max_row_group_bytes" in found["message"]
    assert report["summary"]["rows_read"] == 2


def test_the_default_bounds_pass_long_real_shapes(tmp_path, small_records):
    """The defaults never fire on real shapes: 128 episodes of 19k tokens in one row group (the
    benchmark's long shape) and a 1M-token agent episode; the row lengths are not even read."""
    from rollout_audit.contract.config import Config
    from rollout_audit.reading.io import discover
    from rollout_audit.reading.read import readable_groups

    t = small_records[0][0]
    long_shape = pa.concat_tables([long_row(dict(t, trajectory_id=f"e{i}"), 19_000) for i in range(128)])
    write_groups(tmp_path / "log" / "trajectories" / "part-0.parquet", [long_shape, long_row(t, 1_000_000)])
    (f,) = discover([tmp_path / "log"]).files
    cfg, broken = Config(), []
    assert readable_groups(f, cfg.max_row_group_bytes, cfg.max_tokens_per_trajectory, broken) == ([0, 1], [])
    assert not broken and f.groups[0].tokens == 128 * 19_000


def test_large_row_groups_are_decoded_in_slices(tmp_path, small_records, monkeypatch):
    from rollout_audit.reading import io

    t = small_records[0]
    write(tmp_path / "log", t)
    whole = audit(tmp_path / "log")
    monkeypatch.setattr(io, "SLICE_BYTES", 1)  # every row group is larger: read a row at a time
    sliced = audit(tmp_path / "log")
    assert (
        sliced.findings.select("code", "trajectory_id").rows() == whole.findings.select("code", "trajectory_id").rows()
    )
    assert sliced.summary["rows_read"] == whole.summary["rows_read"] == len(t)


# ---------------------------------------------------------------- 6. discovery and the writer


def test_deep_directory_tree(tmp_path, small_records):
    d = deep = tmp_path / "log"
    d.mkdir()
    for _ in range(1200):  # Path.mkdir(parents=True) itself recurses once per level
        deep = deep / "d"
        deep.mkdir()
    try:
        write(deep, small_records[0])
        assert len(discover([d]).files) == 1
    finally:  # shutil.rmtree (pytest's clean-up) and rglob recurse once per level: remove the tree here
        for leaf in (deep / "trajectories").iterdir():
            leaf.unlink()
        (deep / "trajectories").rmdir()
        while deep != d:
            deep.rmdir()
            deep = deep.parent


def test_unlistable_directory_is_a_finding(tmp_path, log, monkeypatch):
    locked = log / "locked"
    locked.mkdir()
    locked.chmod(0)
    if os.geteuid() == 0:  # root lists every directory: the kernel's refusal is simulated for this one
        real = os.scandir

        def scandir(path):
            if Path(path) == locked:
                raise PermissionError(13, "Permission denied", str(path))
            return real(path)

        monkeypatch.setattr(os, "scandir", scandir)
    try:
        d = discover([log])
    finally:
        locked.chmod(0o755)
    assert [p for p, _ in d.broken] == [str(locked)] and "cannot be listed" in d.broken[0][1]
    assert len(d.files) == 1


def test_symlink_out_of_the_tree_is_not_followed(tmp_path, log):
    outside = tmp_path / "outside.parquet"
    outside.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (log / "passwd.parquet").symlink_to(outside)
    (log / "inner.parquet").symlink_to(log / "trajectories" / "part-0000.parquet")  # inside: followed
    d = discover([log])
    assert [p for p, _ in d.broken] == [str(log / "passwd.parquet")] and "not followed" in d.broken[0][1]
    assert len(d.files) == 2
    assert len(discover([log], follow_symlinks=True).broken) == 1  # followed: not Parquet


def test_symlink_loop_and_fifo(tmp_path, log):
    (log / "loop").symlink_to(log)
    os.mkfifo(log / "pipe.parquet")
    r = child("check", str(log), "--format", "json", timeout=60)
    assert_clean_exit(r, (1,))
    assert any("not a regular file" in f["message"] for f in json.loads(r.stdout)["findings"])


def test_killed_writer_temp_file_is_a_finding(tmp_path, small_records):
    w = RolloutWriter(tmp_path / "log" / "part.parquet")
    w.write(small_records[0])  # never closed: the writer was killed
    r = cli("check", str(tmp_path / "log"), "--format", "json")
    assert_clean_exit(r, (2,))  # the temp file is the only file: reported, and nothing to audit
    assert any("unfinished write" in f["message"] for f in json.loads(r.stdout)["findings"] if f["code"] == "S005")


def test_writer_fsyncs_file_then_directory(tmp_path, small_records, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    with RolloutWriter(tmp_path / "a.parquet") as w:
        w.write(small_records[0])
    assert len(synced) == 2 and synced[0].endswith(".tmp") and synced[1] == str(tmp_path)


def test_many_small_files_give_the_findings_of_one_file(tmp_path, small_records):
    trajs = [dict(t) for t in small_records[0]]
    trajs[1]["token_turn"] = [*trajs[1]["token_turn"][:-1], 42]  # S004 on the second trajectory
    one = write(tmp_path / "one", trajs)
    many = tmp_path / "many"
    for i, t in enumerate(trajs):
        write(many, [t], f"part-{i:04d}.parquet")
    a, b = audit(str(one)), audit(str(many))
    key = ["code", "trajectory_id", "message", "turn", "position"]
    assert a.findings.height and a.findings.select(key).sort(key).equals(b.findings.select(key).sort(key))
    mine = b.findings.filter(b.findings["trajectory_id"] == trajs[1]["trajectory_id"])
    assert mine.height and all(f.endswith("part-0001.parquet") for f in mine["file"].to_list())


# ---------------------------------------------------------------- 7. a log cannot vouch for itself

TRUSTED_ONLY = {
    "replay": "replay = 8",
    "replay_endpoints": 'replay-endpoints = {"0" = "http://127.0.0.1:9/v1"}',
    "replayer": 'replayer = "sys:exit"',
    "replay_checkpoints": 'replay_checkpoints = "ckpt/{version}"',
}


@pytest.mark.parametrize("key", sorted(TRUSTED_ONLY))
def test_a_log_config_cannot_run_code_or_reach_the_network(tmp_path, log, key):
    (log / "pyproject.toml").write_text(f"[tool.rollout-audit]\n{TRUSTED_ONLY[key]}\n")
    before = digest(log)
    for cwd in (tmp_path, log):  # from outside, and from inside the log (`check .`)
        r = cli("check", str(log) if cwd == tmp_path else ".", cwd=cwd)
        assert r.returncode == 2 and str(log / "pyproject.toml") in r.stderr and "refused" in r.stderr, r.stderr
        assert key.replace("_", "-") in r.stderr or key in r.stderr
    with pytest.raises(ValueError, match="refused"):  # the library finds the same file and refuses it
        audit(str(log))
    from rollout_audit.testing import assert_clean

    with pytest.raises(ValueError, match="pyproject.toml"):
        assert_clean(str(log))
    assert digest(log) == before


def test_the_users_own_project_config_may_set_replay(tmp_path, log, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.rollout-audit]\nreplay_checkpoints = "ckpt/step-{version}"\n')
    r = cli("check", "log", "--show-settings", cwd=tmp_path)
    assert r.returncode == 0 and '"ckpt/step-{version}"' in r.stdout and "# configuration: " in r.stdout
    monkeypatch.chdir(tmp_path)
    assert audit("log").summary["configuration"] == "pyproject.toml [tool.rollout-audit]"
    r = cli("check", ".", cwd=tmp_path)  # the project's own file, but inside the audited directory
    assert r.returncode == 2 and "refused" in r.stderr
    from rollout_audit import load_config

    assert load_config().replay_checkpoints == "ckpt/step-{version}"  # no audited path: the project's own
    with pytest.raises(ValueError, match="refused in a configuration inside the audited log"):
        load_config(start=".")  # auditing the working directory: the file is inside it


# a key of each kind that steers the audit rather than stating how the run was produced
WEAKENING = {
    "atol": "atol = 0.5",
    "select": 'select = ["M"]',
    "ignore": 'ignore = ["M101"]',
    "tolerated_share": 'tolerated_share = {"M101" = 1.0}',
    "baseline": 'baseline = "accepted.json"',
    "max_row_group_bytes": "max-row-group-bytes = 1",
}
TAKEN = {"atol": 0.5, "select": ["M"], "ignore": ["M101"], "tolerated_share": {"M101": 1.0}, "max_row_group_bytes": 1}


@pytest.mark.parametrize("key", sorted(WEAKENING))
def test_a_log_config_cannot_weaken_the_audit(tmp_path, log, key):
    (log / "pyproject.toml").write_text(f"[tool.rollout-audit]\nmax_response_tokens = 64\n{WEAKENING[key]}\n")
    r = child("check", str(log), timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{log / 'pyproject.toml'}: {WEAKENING[key].split(' =')[0]}: refused" in lines[0], lines[0]
    assert "max_response_tokens: refused" not in lines[0] and "--config FILE" in lines[0]
    with pytest.raises(ValueError, match="refused in a configuration inside the audited log"):
        audit(str(log))  # the library finds the same file and refuses it


def test_a_file_of_the_log_audited_alone_is_still_inside_it(tmp_path, log):
    """One trajectory file named on its own: the configuration in the log it sits in (the directory
    whose trajectories/ holds it) came with the log; a single-file log in a project's directory
    keeps the project's configuration."""
    (log / "pyproject.toml").write_text("[tool.rollout-audit]\natol = 0.5\n")
    (one,) = sorted((log / "trajectories").rglob("*.parquet"))[:1]
    r = child("check", str(one), timeout=60)
    assert r.returncode == 2 and f"{log / 'pyproject.toml'}: atol: refused" in r.stderr, r.stderr
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.rollout-audit]\natol = 0.5\n")
    single = project / "rollouts.parquet"
    single.write_bytes(one.read_bytes())
    r = cli("check", str(single), "--show-settings")
    assert r.returncode == 0 and tomllib.loads(r.stdout)["tool"]["rollout-audit"]["atol"] == 0.5, r.stdout[:500]


@pytest.mark.parametrize("key", sorted(WEAKENING))
def test_the_same_config_beside_the_log_is_read(tmp_path, log, key):
    """Beside the log (in the directory that holds it), a configuration sets every key but those
    that run code or reach the network; the report names it."""
    (tmp_path / "pyproject.toml").write_text(f"[tool.rollout-audit]\n{WEAKENING[key]}\n")
    (tmp_path / "accepted.json").write_text("not json")  # a baseline that cannot be used: exit 2 naming it
    r = cli("check", str(log), "--format", "json")  # from this repository: not the user's own for that log
    assert_clean_exit(r, (0, 1, 2))
    if key == "baseline":
        assert r.returncode == 2 and f"baseline {tmp_path / 'accepted.json'}: cannot read" in r.stderr, r.stderr
        return
    if key == "max_row_group_bytes":  # the cap was taken: the only file is refused
        assert r.returncode == 2 and "max_row_group_bytes" in r.stdout, r.stdout[-2000:]
    assert json.loads(r.stdout)["summary"]["configuration"] == f"{tmp_path / 'pyproject.toml'} [tool.rollout-audit]"
    shown = tomllib.loads(cli("check", str(log), "--show-settings").stdout)["tool"]["rollout-audit"]
    assert shown[key] == TAKEN[key] != Config().settings()[key]


def test_a_log_config_may_state_how_the_run_was_produced_and_the_report_names_it(tmp_path, log, small_records):
    budget = 1 + min(len(t["token_ids"]) for t in small_records[0])
    (log / "pyproject.toml").write_text(
        f'[tool.rollout-audit]\nmax-response-tokens = {budget}\ntruncation = "penalize"\ngrpo_epsilon = 1e-8\n'
    )
    r = cli("check", str(log), cwd=tmp_path)
    assert_clean_exit(r, (0, 1))
    assert r.stdout.splitlines()[-2] == "configuration: log/pyproject.toml [tool.rollout-audit]"
    r = cli("check", str(log), "--format", "json", cwd=tmp_path)
    assert json.loads(r.stdout)["summary"]["configuration"] == "log/pyproject.toml [tool.rollout-audit]"
    rep = audit(str(log))
    assert rep.summary["configuration"].startswith(str(log / "pyproject.toml"))
    assert "T306" in rep.summary["checks_run"] and "T306" not in rep.not_run  # the budget was taken
    shown = cli("check", str(log), "--show-settings", cwd=tmp_path).stdout.splitlines()
    assert shown[1].startswith("# a configuration inside the audited directory may set only: truncation,")
    assert audit(None).summary["configuration"] == "defaults"


def test_a_config_named_with_config_is_the_users_own_even_inside_the_log(tmp_path, log):
    mine = log / "mine.toml"
    mine.write_text(
        "".join(f"{line}\n" for k, line in WEAKENING.items() if k not in ("baseline", "max_row_group_bytes"))
    )
    r = cli("check", str(log), "--config", str(mine), "--format", "json", cwd=tmp_path)
    assert_clean_exit(r, (0, 1))
    assert json.loads(r.stdout)["summary"]["configuration"] == str(mine)
    shown = tomllib.loads(cli("check", str(log), "--config", str(mine), "--show-settings").stdout)["tool"][
        "rollout-audit"
    ]
    assert shown["atol"] == 0.5 and shown["select"] == ["M"] and shown["tolerated_share"] == {"M101": 1.0}


@pytest.mark.parametrize("line", ['select = ["Z999"]', 'ignore = [""]', 'ignore = ["M", " "]', 'select = ["m10x"]'])
def test_unknown_or_empty_codes_in_a_config_file_are_exit_2(tmp_path, log, line):
    (tmp_path / "pyproject.toml").write_text(f"[tool.rollout-audit]\n{line}\n")  # beside the log: read
    r = cli("check", str(log), cwd=tmp_path)
    assert r.returncode == 2 and "pyproject.toml" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [["--ignore", ""], ["--select", "M,,L"], ["--select", "Z999"], ["--ignore", " "]])
def test_unknown_or_empty_codes_on_the_command_line_are_exit_2(log, args):
    r = cli("check", str(log), *args)
    assert r.returncode == 2 and "code" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    "kw", [{"select": ["Z999"]}, {"ignore": [""]}, {"ignore": "R409"}, {"select": "M"}, {"ignore": ["R4", "?"]}]
)
def test_unknown_or_empty_codes_in_the_api_and_fixture_are_errors(log, small_records, kw):
    from rollout_audit.contract.config import ConfigError
    from rollout_audit.testing import assert_clean

    for run in (
        lambda: audit(str(log), **kw),
        lambda: audit(small_records[0], **kw),
        lambda: assert_clean(str(log), **kw),
    ):
        with pytest.raises(ConfigError, match="select|ignore"):
            run()
    with pytest.raises(ConfigError):
        ra_config(select=["M", ""])


def ra_config(**kw):
    from rollout_audit import Config

    return Config.from_mapping(kw)


@pytest.mark.parametrize("template", ["{version:>999999999}", "ckpt/{version!r}", "{0}", "{x}", "{version}{"])
def test_replay_checkpoint_template_accepts_only_version(tmp_path, log, template):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"replay_checkpoints = {json.dumps(template)}\n")
    r = child("check", str(log), "--config", str(cfg), timeout=60)
    assert r.returncode == 2 and "replay_checkpoints" in r.stderr and "{version}" in r.stderr, r.stderr
    assert ra_config(replay_checkpoints="ckpt/step-{version}/{{x}}").replay_checkpoints


@pytest.mark.parametrize(
    "text",
    [
        "[tool.rollout-audit]\natol = " + "9" * 400 + "\n",
        "[tool.rollout-audit]\ndifficulty_band = [0, " + "9" * 400 + "]\n",
        "[tool]\nrollout-audit = 5\n",
        "[tool]\nrollout-audit = [1, 2]\n",
        "[tool.rollout-audit]\nselect = " + "[" * 5000 + "]" * 5000 + "\n",
        "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n",
        "[tool.rollout-audit]\natol = 1\n\xff\n",
    ],
    ids=["huge-int-float", "huge-int-band", "scalar", "array", "deep-array", "deep-table", "not-utf8"],
)
def test_odd_toml_is_exit_2_with_the_file(tmp_path, log, text):
    (tmp_path / "pyproject.toml").write_bytes(  # beside the log, where every key is read
        text.encode("utf-8", "surrogateescape") if "\xff" not in text else text.encode("latin-1")
    )
    r = child("check", str(log), timeout=60)
    assert r.returncode == 2 and "pyproject.toml" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize(
    "setting, says",
    [
        ('baseline = "/dev/zero"', "baseline /dev/zero: not a regular file (baseline = '/dev/zero' in "),
        ('baseline = "."', ": not a regular file (baseline = '.' in "),
        ('baseline = "missing.json"', "missing.json: no such file (baseline = 'missing.json' in "),
        ('tolerated_share = {"S" = 0.0}', "tolerated_share: unknown check code 'S'"),
    ],
    ids=["device", "directory", "missing", "unknown-code"],
)
def test_a_setting_that_cannot_be_used_is_exit_2_naming_the_configuration(tmp_path, log, setting, says):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[tool.rollout-audit]\n{setting}\n")
    r = cli("check", str(log), "--config", str(cfg), "--format", "json")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and says in lines[0] and str(cfg) in lines[0], r.stderr


@pytest.mark.parametrize("kind", ["fifo", "too-large", "not-json", "deep-json"])
def test_a_baseline_that_is_not_a_small_json_file_is_one_line_exit_2(tmp_path, log, kind):
    """Given with --baseline, or named by a configuration: a FIFO without a writer never blocks the
    audit, a file past MAX_BASELINE_BYTES is refused unread (a sparse file: no disk used)."""
    from rollout_audit.session.verdict import MAX_BASELINE_BYTES, BaselineError, read_baseline

    base = tmp_path / "accepted.json"
    if kind == "fifo":
        os.mkfifo(base)
    elif kind == "too-large":
        with open(base, "wb") as fh:
            fh.truncate(MAX_BASELINE_BYTES + 1)
    else:
        base.write_text("{'findings': []" if kind == "not-json" else "[" * 100_000 + "]" * 100_000)
    says = {"fifo": "not a regular file", "too-large": "larger than"}.get(kind, "cannot read")
    (tmp_path / "audit.toml").write_text('[tool.rollout-audit]\nbaseline = "accepted.json"\n')
    for args in (["--baseline", str(base)], ["--config", str(tmp_path / "audit.toml")]):
        r = child("check", str(log), *args, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and f"baseline {base}" in lines[0] and says in lines[0], r
    with pytest.raises(BaselineError, match=f"baseline {base}: .*{says}"):  # the reader itself, past the CLI's checks
        read_baseline(base, pl.Series("trajectory_id", ["a"]))


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "symlink-to-dev-zero", "too-large"])
def test_config_that_is_not_a_small_regular_file_is_refused(tmp_path, log, kind):
    cfg = tmp_path / "c.toml"
    if kind == "fifo":
        os.mkfifo(cfg)
    elif kind == "dev-zero":
        cfg = Path("/dev/zero")
    elif kind == "symlink-to-dev-zero":
        cfg.symlink_to("/dev/zero")
    else:
        cfg.write_text("# padding\n" * 200_000)
    r = child("check", str(log), "--config", str(cfg), timeout=60)
    assert r.returncode == 2 and str(cfg) in r.stderr, (r.returncode, r.stderr)
    assert ("not a regular file" in r.stderr) != (kind == "too-large")


# ---------------------------------------------------------------- 8. silent passes, and messages instead of internal errors


def test_an_empty_path_is_refused_not_the_working_directory(log):
    r = cli("check", "", cwd=log)
    assert r.returncode == 2 and "empty path" in r.stderr and "Traceback" not in r.stderr, r.stderr
    from rollout_audit.reading.io import UsageError

    with pytest.raises(UsageError, match="empty path"):
        audit("")


def test_an_infinite_turn_temperature_is_s001(small_records):
    trajs = [dict(t, turns=[dict(x) for x in t["turns"]]) for t in small_records[0]]
    trajs[1]["turns"][0]["temperature"] = float("inf")
    s001 = audit(trajs).findings.filter(pl.col("code") == "S001")
    assert any("temperature" in m and "inf" in m for m in s001["message"].to_list()), s001
    assert trajs[1]["trajectory_id"] in s001["trajectory_id"].to_list()
    assert not audit(small_records[0]).findings.filter(pl.col("code") == "S001").height


FRAMEWORK_DUMPS = Path(__file__).resolve().parent.parent / "fixtures" / "frameworks"
FROM_CONTEXT = ["environment_id=doors", "environment_version=v1", "verifier_version=v1", "reset_seed=0"]


def _id_lists(x, path=()) -> list[tuple]:
    """Paths of the token-id and mask lists of a dump record (lists of integers under a name with ids, tokens or mask)."""
    out = []
    if isinstance(x, dict):
        for k, v in x.items():
            out += _id_lists(v, (*path, k))
    elif isinstance(x, list):
        name = str(path[-1]) if path else ""
        if (
            x
            and all(isinstance(v, int) and not isinstance(v, bool) for v in x)
            and any(w in name for w in ("ids", "tokens", "mask"))
        ):
            out.append(path)
        for i, v in enumerate(x[:2]):
            out += _id_lists(v, (*path, i))
    return out


def _from_cases():
    for fw in ("verl", "skyrl", "slime", "rllm", "verifiers", "openai"):
        rec = json.loads((FRAMEWORK_DUMPS / fw / "compliant.jsonl").read_text().splitlines()[0])
        for path in _id_lists(rec):
            if (fw, path[-1], len(path) > 1 and isinstance(path[-2], int)) in UNREAD:
                continue
            yield fw, path


# copies a framework keeps next to the fields the adapter reads (rLLM's step-level ids repeat its
# model_output's; verifiers' choice token ids repeat `tokens.completion_ids`; the prompt mask is all 0)
UNREAD = {
    ("rllm", "prompt_ids", True),
    ("rllm", "response_ids", True),
    ("verifiers", "token_ids", True),
    ("verifiers", "prompt_mask", False),
}


def _put(rec: dict, path: tuple, raw: str) -> str:
    """The record as a JSON line with the first element of the list at `path` replaced by raw JSON text."""
    marker = "\x00bad\x00"
    node = rec
    for k in path:
        node = node[k]
    node[0] = marker
    return json.dumps(rec).replace(json.dumps(marker), raw)


@pytest.mark.parametrize(
    "fw, path", list(_from_cases()), ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x))
)
def test_bad_token_ids_and_masks_in_a_dump_are_refused_naming_record_and_field(tmp_path, fw, path):
    lines = (FRAMEWORK_DUMPS / fw / "compliant.jsonl").read_text().splitlines()
    field = str(path[-1])
    values = ['"0"', "0.5"] if "mask" in field else ["4975.7", "1e30", "Infinity", str(2**63), "-Infinity"]
    for raw in values:
        dump = tmp_path / "dump.jsonl"
        dump.write_text("\n".join([_put(json.loads(lines[0]), path, raw), *lines[1:]]) + "\n")
        r = cli("check", "--from", fw, str(dump), *[x for kv in FROM_CONTEXT for x in ("--context", kv)])
        assert r.returncode == 2 and "internal error" not in r.stderr and "Traceback" not in r.stderr, (raw, r.stderr)
        assert "dump.jsonl:1" in r.stderr and field in r.stderr, (raw, r.stderr)


# values of the wrong type anywhere in a dump record (found by the fuzz campaign): exit 2 with one line
# naming the dump file and line and the field, whichever adapter reads it
WRONG_TYPES = [
    # framework, fixture, 0-based line, path to the value, raw JSON put there, what the message must name
    ("rllm", "logprobs_missing", 1, ("trajectories", 0, "steps", 1, "weight_version"), "[null]", "policy_version"),
    ("rllm", "compliant", 1, ("trajectories", 0, "reward"), '"x"', "reward"),
    ("rllm", "compliant", 1, ("trajectories", 0, "steps", 1, "model_response"), "NaN", "action_text"),
    ("rllm", "compliant", 0, ("trajectories", 0, "steps"), "0", "steps"),
    ("rllm", "compliant", 0, ("trajectories", 0, "steps", 1, "model_output", "completion_ids"), "0", "completion_ids"),
    ("rllm", "compact_filtering", 5, ("trajectories", 0), '"1"', "trajectories[0]"),
    ("verifiers", "v1_truncation_scored", 1, ("nodes", 2, "message"), "Infinity", "message"),
    ("verifiers", "v1_compliant", 0, ("task",), "true", "task"),
    ("verifiers", "v1_compliant", 0, ("nodes", 1, "parent"), "{}", "parent"),
    ("verifiers", "v1_stop_conditions", 4, ("calls", 0, "sampling"), "Infinity", "sampling"),
    ("verifiers", "compliant", 0, ("trajectory", 0, "tokens", "completion_mask"), "NaN", "completion_mask"),
    ("openai", "compliant", 2, ("end",), "-1", "end"),
    ("openai", "compliant", 2, ("end", "reward"), "[null]", "reward"),
    ("openai", "compliant", 2, ("end", "policy_version"), "1e30", "policy_version"),
    ("openai", "compliant", 0, ("response", "choices", 0, "message"), '"x"', "message"),
    ("openai", "compliant", 1, ("response", "choices"), "1.5", "choices"),
    ("openai", "retokenized", 1, ("response", "choices", 0, "logprobs", "content", 0, "logprob"), "{}", "logprobs"),
    ("slime", "removed_sample_in_denominator", 4, ("rollout_ids", 3), "Infinity", "rollout_ids"),
    ("skyrl", "compliant", 1, ("global_step",), str(2**63), "global_step"),
    ("skyrl", "compliant", 0, ("rollout_logprobs", 1), '"x"', "rollout_logprobs"),
    ("skyrl", "compliant", 0, ("stop_reasons",), '["stop"]', "stop_reasons"),
    ("verl", "compliant", 0, ("response_logprobs", 1), "{}", "response_logprobs"),
    ("verl", "compliant", 0, ("engine_calls",), "1.5", "engine_calls"),
    ("slime", "compliant", 0, ("rollout_log_probs", 1), '""', "rollout_log_probs"),
    ("slime", "compliant", 0, ("weight_versions", 0), "Infinity", "weight_versions"),
    ("slime", "compliant", 0, ("status",), "{}", "status"),
    ("verl", "compliant", 1, ("reward_score",), '"x"', "reward_score"),
    ("verifiers", "v1_compliant", 0, ("rewards",), "[1]", "rewards"),
]


def _set_raw(rec: dict, path: tuple, raw: str) -> str:
    """The record as a JSON line with the value at `path` replaced by raw JSON text."""
    marker = "\x00bad\x00"
    node = rec
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = marker
    return json.dumps(rec).replace(json.dumps(marker), raw)


@pytest.mark.parametrize(
    "fw, fixture, line, path, raw, field",
    WRONG_TYPES,
    ids=[f"{c[0]}-{'.'.join(map(str, c[3]))}={c[4]}" for c in WRONG_TYPES],
)
def test_a_value_of_the_wrong_type_in_a_dump_is_refused_naming_line_and_field(
    tmp_path, fw, fixture, line, path, raw, field
):
    lines = (FRAMEWORK_DUMPS / fw / f"{fixture}.jsonl").read_text().splitlines()
    lines[line] = _set_raw(json.loads(lines[line]), path, raw)
    dump = tmp_path / "dump.jsonl"
    dump.write_text("\n".join(lines) + "\n")
    r = cli("check", "--from", fw, str(dump), *[x for kv in FROM_CONTEXT for x in ("--context", kv)])
    message = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(message) == 1, r.stderr
    assert f"dump.jsonl:{line + 1}: " in message[0], message[0]
    assert f" {field}" in message[0].split("dump.jsonl:", 1)[1], message[0]
    assert "wrong shape" not in message[0] and "internal error" not in message[0], message[0]


@pytest.mark.parametrize("fw", ["verl", "skyrl", "slime", "rllm", "verifiers", "openai"])
def test_a_dump_with_no_record_is_refused_naming_the_file(tmp_path, fw):
    dump = tmp_path / "dump.jsonl"
    dump.write_text("\n \n")
    r = cli("check", "--from", fw, str(dump), *[x for kv in FROM_CONTEXT for x in ("--context", kv)])
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"rollout-audit: error: {dump}: {'' if fw in ('verl', 'skyrl', 'slime') else {'rllm': 'rLLM: '}.get(fw, fw + ': ')}"
        "no trajectories in the records"
    ], r.stderr


# ---------------------------------------------------------------- 9. replay against a hostile server (loopback)


class _Hostile:
    """A real HTTP server on 127.0.0.1 whose /v1/completions answer is `mode`'s (GET /v1/models is sane)."""

    def __init__(self, mode: str, interval: float = 0.25) -> None:
        import http.server
        import threading
        import time

        outer = self
        self.stop = threading.Event()
        self.interval = interval  # seconds between the bytes a dripping server sends

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, body: bytes, length: int | None = None) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(b'{"data": [{"id": "m"}]}')

            def do_POST(self):
                n = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
                if mode == "silent":
                    outer.stop.wait(30)
                    return
                if mode == "drip":
                    self.send_response(200)
                    self.end_headers()
                    while not outer.stop.is_set():
                        try:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.05)
                    return
                if mode == "huge":
                    self._send(b"", length=1 << 40)
                    return
                if mode == "slow-headers":  # a status line and headers that never end, a byte a second
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: " + b"a" * 10**6:
                        if outer.stop.wait(outer.interval):
                            return
                        try:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                        except OSError:
                            return
                    return
                lp = {"nan": float("nan"), "negative": -0.5, "big-key": -0.5}[mode]
                key = {"negative": "-1", "big-key": "9" * 12}.get(mode, "1")
                dist = {key: {"logprob": lp}, "0": {"logprob": -1.0}}
                choices = [{"index": i, "prompt_logprobs": [dist] * 64} for i in range(len(n))]
                self._send(json.dumps({"choices": choices}).replace("NaN", "NaN").encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _request():
    from rollout_audit.replay.base import ReplayRequest

    return ReplayRequest(
        version=0,
        token_ids=[np.array([3, 1, 0, 1], np.int64)],
        traj=np.zeros(2, np.int64),
        position=np.array([1, 2], np.int64),
        turn=np.zeros(2, np.int64),
        temperature=np.ones(2),
        top_p=np.ones(2),
        top_k=np.zeros(2, np.int64),
        rows=pa.table({"x": [1]}),
    )


@pytest.mark.parametrize(
    "mode, says",
    [
        ("silent", "within"),
        ("drip", "within 2 s"),
        ("slow-headers", "within 2 s"),
        ("huge", "bytes"),
        ("nan", "nan as a log-prob"),
        ("negative", "'-1' as a token id"),
        ("big-key", "as a token id"),
    ],
)
def test_http_replay_against_a_hostile_server_fails_in_bounded_time(mode, says):
    from rollout_audit.replay.base import NotConfigured
    from rollout_audit.replay.http import HTTPReplayer

    srv = _Hostile(mode)
    try:
        rp = HTTPReplayer({"0": srv.url}, timeout=2.0, connect_timeout=1.0, max_bytes=1 << 20)
        with pytest.raises(NotConfigured) as e:
            rp.replay(_request())
        silence = mode in ("silent", "slow-headers") and "timed out" in str(
            e.value
        )  # a byte later than 1 s, under load
        assert says in str(e.value) or silence, str(e.value)
    finally:
        srv.close()


def test_asked_for_replay_against_a_silent_server_is_exit_2_with_the_configured_deadline(tmp_path, log):
    srv = _Hostile("silent")
    try:
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'replay_endpoints = {{"0" = "{srv.url}"}}\nreplay_timeout = 2\nreplay_connect_timeout = 1\n')
        r = child("check", str(log), "--config", str(cfg), "--replay", "2", timeout=60)
        assert r.returncode == 2 and "L205" in r.stdout and "timed out" in r.stdout + r.stderr, (r.stdout, r.stderr)
    finally:
        srv.close()


def test_asked_for_replay_against_a_server_dripping_its_headers_ends_at_the_total_deadline(tmp_path, log):
    srv = _Hostile("slow-headers", interval=1.0)
    try:
        cfg = tmp_path / "c.toml"  # a byte a second never trips the 10 s silence bound: only the total deadline ends it
        cfg.write_text(f'replay_endpoints = {{"0" = "{srv.url}"}}\nreplay_timeout = 3\nreplay_connect_timeout = 10\n')
        r = child("check", str(log), "--config", str(cfg), "--replay", "2", timeout=90)  # None: it never ended
        out = r.stdout + r.stderr
        assert r.returncode == 2, (r.returncode, out[-2000:])
        assert f"replay endpoint {srv.url}/completions did not answer within 3 s" in out, out[-2000:]
        assert "Traceback" not in out
    finally:
        srv.close()


def test_a_symlink_loop_anywhere_is_s005_for_that_entry_and_the_rest_is_audited(log, small_records):
    (log / "a").symlink_to("b")
    (log / "b").symlink_to("a")
    (log / "trajectories" / "self.parquet").symlink_to("self.parquet")
    r = cli("check", str(log), "--format", "json")
    assert_clean_exit(r, (1,))
    rep = json.loads(r.stdout)
    s005 = {Path(f["file"]).name for f in rep["findings"] if f["code"] == "S005"}
    assert {"a", "b", "self.parquet"} <= s005, rep["findings"]
    assert rep["summary"]["rows_read"] == len(small_records[0])


def test_a_silent_s3_endpoint_fails_within_the_configured_timeouts(tmp_path, log):
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # accepts and never answers
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    try:
        cfg = tmp_path / "c.toml"
        cfg.write_text("storage_connect_timeout = 1\nstorage_request_timeout = 1\n")
        port = srv.getsockname()[1]
        uri = f"s3://logs/run?endpoint_override=127.0.0.1:{port}&scheme=http"
        r = child("check", uri, "--config", str(cfg), timeout=50)  # the default deadlines would take longer
        assert r.returncode == 2 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    finally:
        stop.set()
        for c in held:
            c.close()
        srv.close()


def test_gs_without_credentials_is_one_line_within_the_configured_timeout(tmp_path, monkeypatch):
    for k in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(k, raising=False)
    cfg = tmp_path / "c.toml"
    cfg.write_text("storage_request_timeout = 2\n")
    r = child("check", "gs://no-such-bucket/run", "--config", str(cfg), timeout=60)
    assert r.returncode == 2 and "gs://no-such-bucket/run" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_an_openai_session_dump_saved_as_parquet_converts_like_its_json_lines(tmp_path):
    lines = (FRAMEWORK_DUMPS / "openai" / "compliant.jsonl").read_text().splitlines()
    rows = pa.array([json.loads(x) for x in lines])  # one struct type: the union of the records' fields
    pq.write_table(pa.Table.from_struct_array(rows), tmp_path / "dump.parquet")
    ctx = [x for kv in FROM_CONTEXT for x in ("--context", kv)]
    a = cli("check", "--from", "openai", str(tmp_path / "dump.parquet"), *ctx, "--format", "json")
    b = cli("check", "--from", "openai", str(FRAMEWORK_DUMPS / "openai" / "compliant.jsonl"), *ctx, "--format", "json")
    assert a.returncode == b.returncode and a.returncode in (0, 1), a.stderr
    key = [(f["code"], f["trajectory_id"], f["message"]) for f in json.loads(a.stdout)["findings"]]
    assert key == [(f["code"], f["trajectory_id"], f["message"]) for f in json.loads(b.stdout)["findings"]]


def test_a_log_whose_every_row_group_is_refused_says_so(tmp_path, small_records):
    """Every row group over the byte bound: the audit is incomplete (exit 2), and the reason says
    the rows were refused rather than that the files hold none."""
    t = small_records[0]
    write_groups(
        tmp_path / "log" / "trajectories" / "part-0.parquet", [long_row(dict(t[0], trajectory_id="w"), 200_000)]
    )
    (tmp_path / "pyproject.toml").write_text("[tool.rollout-audit]\nmax_row_group_bytes = 1000000\n")
    r = cli("check", str(tmp_path / "log"), cwd=tmp_path)
    assert_clean_exit(r, (2,))
    assert "every row of the trajectory files was refused (1 part: see S005)" in r.stdout + r.stderr
    assert "hold no rows" not in r.stdout + r.stderr
