"""Hostile input, round 7: an rLLM gateway store from an audited directory is read immutable, with no
extension and within a memory bound (a column SQLite computes on read was a gigabyte per row from a
few kB on disk; a hot journal left beside the store was "attempt to write a readonly database"), and
a `--calls` path that does not exist is one line, not click's usage block. Through the CLI."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hostilehelp import cli
from test_hostile_round6 import _CAPPED, FRAMEWORKS, IDENTITY, ROOT, _refusal


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _store(folder: Path, data_sql: str | None = None, rows: int = 1) -> Path:
    """A gateway store (table traces(trace_id, data, created_at)); with `data_sql`, `data` is a generated
    column of that expression, written into the schema in place (SQLite computes it only when read)."""
    db = folder / "gateway_traces.db"
    con = sqlite3.connect(db)
    if data_sql is None:
        con.execute("CREATE TABLE traces (trace_id TEXT PRIMARY KEY, data TEXT NOT NULL, created_at REAL NOT NULL)")
        con.executemany("INSERT INTO traces VALUES (?, '{}', ?)", [(f"t{k}", k) for k in range(rows)])
    else:
        con.execute("CREATE TABLE traces (trace_id TEXT, created_at REAL, data GENERATED ALWAYS AS (abs(1)))")
        con.executemany("INSERT INTO traces (trace_id, created_at) VALUES (?, ?)", [(f"t{k}", k) for k in range(rows)])
        con.execute("PRAGMA writable_schema = ON")
        con.execute("UPDATE sqlite_master SET sql = replace(sql, 'abs(1)', ?) WHERE name = 'traces'", (data_sql,))
    con.commit()
    con.close()
    return db


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads its address space from /proc")
@pytest.mark.parametrize(
    ("data_sql", "rows"),
    [
        ("zeroblob(900000000)", 1),  # one value of 900 MB, past the line cap: computed whole to be measured
        ("'\"' || replace(hex(zeroblob(60000000)), '0', 'a') || '\"'", 12),  # twelve JSON strings of 120 MB
    ],
)
def test_a_gateway_store_whose_data_sqlite_computes_on_read_is_refused_within_a_memory_bound(tmp_path, data_sql, rows):
    """A store of a few kB whose `data` is a generated column: SQLite built each value when read (a
    gigabyte per row), so the audit passed a 1 GB address-space limit above what it maps
    ("internal error: MemoryError") or an exit 2 after the allocation. Now refused naming the column."""
    store = tmp_path / "store"
    store.mkdir()
    db = _store(store, data_sql, rows)
    assert db.stat().st_size < 65536
    before = _digests(store)
    script = tmp_path / "capped.py"
    script.write_text(_CAPPED)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ROLLOUT_AUDIT_NO_PROGRESS": "1"}
    r = subprocess.run(
        [sys.executable, str(script), "check", "--from", "rllm_gateway", str(store), *IDENTITY],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    line = _refusal(r)
    assert f"{db}: traces: 'data': a column SQLite computes on read" in line, line
    assert _digests(store) == before


@pytest.mark.parametrize("call", ["load_extension('/nonexistent/evil')", "load_extension('./x.so', 'init')"])
def test_a_gateway_store_whose_schema_loads_an_extension_is_refused_and_loads_none(tmp_path, call):
    store = tmp_path / "store"
    store.mkdir()
    db = _store(store, call)
    before = _digests(store)
    line = _refusal(cli("check", "--from", "rllm_gateway", str(store), *IDENTITY))
    assert str(db) in line and "load_extension" not in line.split(str(db))[0], line
    assert _digests(store) == before


def test_a_hot_journal_beside_a_gateway_store_is_refused_naming_it(tmp_path):
    """A writer killed mid-transaction leaves a hot `-journal` beside the store: opened read-only,
    SQLite must roll it back and answered "attempt to write a readonly database" (naming neither the
    journal nor what to do); opened immutable it would read pages the journal says are half written."""
    store = tmp_path / "store"
    store.mkdir()
    db = _store(store, rows=2)
    crash = (
        "import os, sqlite3, sys\n"
        "con = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "con.execute('PRAGMA cache_size=1')\n"
        "con.execute('BEGIN')\n"
        "for i in range(2000): con.execute(\"INSERT INTO traces VALUES (?, ?, 9)\", (f'x{i}', 'y' * 1000))\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", crash, str(db)], check=True, timeout=120)
    assert (store / "gateway_traces.db-journal").exists()
    before = _digests(store)
    line = _refusal(cli("check", "--from", "rllm_gateway", str(store), *IDENTITY))
    assert f"{db}: a store with a gateway_traces.db-journal beside it" in line, line
    assert _digests(store) == before


def test_a_calls_path_that_does_not_exist_is_one_line_naming_it(tmp_path):
    """`--calls` was `click.Path(exists=True)`: a missing path printed click's usage block and its error."""
    missing = tmp_path / "capture"
    dump = FRAMEWORKS / "slime" / "compliant.jsonl"
    line = _refusal(cli("check", "--from", "slime", str(dump), "--calls", str(missing), *IDENTITY))
    assert str(missing) in line and "Usage" not in line, line


def _trl_run(tmp: Path, edit) -> Path:
    """TRL's compliant run directory (the RolloutRecorder's records and TRL's completion log) with its
    first rollout record edited."""
    import json
    import shutil

    run = tmp / "run"
    shutil.copytree(FRAMEWORKS / "trl" / "compliant", run)
    f = run / "trl-rollouts.jsonl"
    recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    edit(recs[0])
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda r: r.update(step=float("inf")), "step"),
        (lambda r: r.update(index="2"), "index"),
        (lambda r: r["prompt_ids"].__setitem__(0, [1]), "prompt_ids"),
        (lambda r: r["completion_ids"].__setitem__(0, 2**40), "completion_ids[0]"),
        (lambda r: r["logprobs"].__setitem__(0, "token_id:1e30"), "logprobs"),
        (lambda r: r["trainer"].update(temperature="0.7"), "trainer.temperature"),
        (lambda r: r["trainer"].update(num_generations=float("nan")), "trainer.num_generations"),
        (lambda r: r["trainer"].update(eos_token_ids=True), "trainer.eos_token_ids"),
        (lambda r: r["turn_context_ids"].append([1, 2]), "turn_context_ids"),
        (lambda r: r["turn_logprob"].pop(), "turn_logprob"),
        (lambda r: r["turn_sampled_token_ids"].__setitem__(0, 5), "turn_sampled_token_ids[0]"),
    ],
)
def test_a_trl_rollout_record_of_the_wrong_shape_names_file_record_and_field(tmp_path, edit, field):
    """The RolloutRecorder's records rebuild the batch TRL built: a value of the wrong type or count was
    "TRL: malformed record (OverflowError: cannot convert float infinity to integer)", naming neither
    the record nor the field (one TRL case in ten of the round-7 campaign)."""
    run = _trl_run(tmp_path, edit)
    line = _refusal(cli("check", "--from", "trl", str(run), *IDENTITY))
    assert f"{run / 'trl-rollouts.jsonl'}:1" in line and field in line and "malformed record" not in line, line


def test_a_gateway_store_whose_schema_is_not_utf8_is_one_line(tmp_path):
    """A byte flipped in the schema (an index's name): sqlite3 failed to decode SQLite's own message naming it and
    raised UnicodeDecodeError, not sqlite3.Error ("internal error"; round-7 campaign seed 4634)."""
    store = tmp_path / "store"
    store.mkdir()
    db = _store(store, rows=1)
    con = sqlite3.connect(db)
    con.execute("PRAGMA writable_schema = ON")
    # the name of the primary key's index, `sqlite_autoindex_traces_1`, with its 8th byte flipped to 0xf7
    name = b"sqlite_autoindex_traces_1".hex()
    con.execute(f"UPDATE sqlite_master SET name = CAST(x'{name[:14]}f7{name[16:]}' AS TEXT) WHERE type = 'index'")
    con.commit()
    con.close()
    line = _refusal(cli("check", "--from", "rllm_gateway", str(store), *IDENTITY))
    assert f"{db}: cannot read the SQLite store" in line, line


@pytest.mark.parametrize("value", ["token_id:1e30", [1.0], {"a": 1}, True])
def test_an_rllm_batch_row_whose_traj_rewards_are_not_numbers_names_the_field(tmp_path, value):
    """rLLM's trainer-side batch rows (`dump_batch`): a traj_rewards entry that is not a number was
    float()-ed: "a field has the wrong shape (ValueError: could not convert string to float)", naming no
    field (round-7 campaign seed 10547)."""
    import json

    lines = (FRAMEWORKS / "rllm" / "trainer_compliant.jsonl").read_text().splitlines()
    rec = json.loads(lines[2])
    rec["traj_rewards"][0] = value
    lines[2] = json.dumps(rec)
    dump = tmp_path / "trainer.jsonl"
    dump.write_text("\n".join(lines) + "\n")
    line = _refusal(cli("check", "--from", "rllm", str(dump), *IDENTITY))
    assert f"{dump}:3" in line and "traj_rewards" in line and "wrong shape" not in line, line


@pytest.mark.slow  # 600 cases in child processes, restarted after each crash of the numpy twin
def test_the_native_core_never_crashes_nor_differs_from_its_twin_on_hostile_shapes(tmp_path):
    """`benchmarks/native_hostile.py`: every kernel on empty batches, negative, huge and wrapping counts,
    int32's ends and indices past their arrays; a crash of the numpy twin (np.repeat on counts whose
    sum wraps) is numpy's, and no log reaches it (the counts come from validated list offsets)."""
    import json

    from rollout_audit.frames import native

    if native.ACTIVE is None:
        pytest.skip("the native core is not built")
    out = tmp_path / "native.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "native_hostile.py"), "--cases", "600", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=900)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 600
    bad = [r for r in rows if r["outcome"] in ("crash (native)", "differ")]
    assert not bad, bad[:3]
