"""The capture layers' exchange readers through the CLI (`check --from rllm_gateway | agent_lightning |
art`): each compliant fixture audits clean under its page's command, each fault fixture is flagged or
refused with one line naming file, record and field; the gateway's SQLite store, written by the
gateway's own `SqliteTraceStore`, is read without a write; a streamed response without its raw body
names what it costs M111; calls join trainer rows by their exact token prefix."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from adapterhelp import cli, fixture
from frameworks.rllm_gateway import null_logprob_dropped

from rollout_audit.adapters.base import read_dump
from rollout_audit.adapters.exchanges import join
from rollout_audit.adapters.steps import Call

IDENTITY = ["--context", "environment_id=doors", "--context", "environment_version=v1"]
IDENTITY += ["--context", "verifier_version=v1", "--context", "reset_seed=0"]
AGL = ["--context", "rollout_temperature=1.0", "--context", "top_p=1.0", *IDENTITY]


def check(name: str, path: Path, *args: str):
    return cli("check", "--from", name, path, *args, "--format", "json")


def codes(res) -> list[str]:
    return sorted({f["code"] for f in json.loads(res.stdout)["findings"]})


def refused(res) -> str:
    """The one stderr line of an exit-2 refusal (no traceback)."""
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    return lines[0]


def written(tmp: Path, records: list[dict]) -> Path:
    f = tmp / "traces.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in records))
    return f


def store(tmp: Path, case: str | list[dict]) -> Path:
    """The fixture's traces written into a SQLite store by the gateway's own SqliteTraceStore, and its
    end lines into a JSON file beside it (the gateway records no outcome)."""
    gw = pytest.importorskip("rllm_model_gateway.store.sqlite_store")
    from rllm_model_gateway.models import TraceRecord

    tmp.mkdir(exist_ok=True)
    recs = read_dump(fixture("rllm_gateway", case)) if isinstance(case, str) else case
    traces = [TraceRecord(**r).model_dump() for r in recs if "end" not in r]  # the fixture is the gateway's shape
    ends = [dict(r) for r in recs if "end" in r]

    async def write() -> None:
        s = gw.SqliteTraceStore(str(tmp / "gateway_traces.db"))
        for t in traces:
            await s.store_trace(t["trace_id"], t["session_id"], t)
        await s.close()

    asyncio.run(write())
    (tmp / "outcomes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ends))
    return tmp


# ---------------------------------------------------------------- rllm-model-gateway


def test_gateway_store_audits_clean_and_is_not_written(tmp_path: Path) -> None:
    d = store(tmp_path / "s", "compliant")
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in d.iterdir()}
    res = check("rllm_gateway", d, *IDENTITY)
    assert res.exit_code == 0 and not json.loads(res.stdout)["findings"], res.output
    assert json.loads(res.stdout)["summary"]["rows_read"] == 2 and json.loads(res.stdout)["summary"]["dump_files"] == 2
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in d.iterdir()} == before  # no journal, no write


def test_gateway_store_and_json_give_the_same_findings(tmp_path: Path) -> None:
    d = store(tmp_path / "s", "control_token_replaced")
    via_store, via_json = (
        check("rllm_gateway", d, *IDENTITY),
        check("rllm_gateway", fixture("rllm_gateway", "control_token_replaced"), *IDENTITY),
    )

    def keys(res) -> list[tuple]:
        return sorted((f["code"], f["trajectory_id"], f["position"]) for f in json.loads(res.stdout)["findings"])

    assert via_store.exit_code == via_json.exit_code == 1
    assert keys(via_store) == keys(via_json) == [("M108", "episode-0#1", 13), ("M111", "episode-0#0", 13)]
    named = {f["file"] for f in json.loads(via_store.stdout)["findings"] if f["code"] == "M111"}
    assert named == {f"{d / 'gateway_traces.db'}:trace 'episode-0-t0'"}


@pytest.mark.parametrize(("case", "code"), [("control_token_replaced", "M111"), ("logprobs_false_kept", "L201")])
def test_gateway_faults_are_flagged(case: str, code: str) -> None:
    res = check("rllm_gateway", fixture("rllm_gateway", case), *IDENTITY)
    assert res.exit_code == 1 and code in codes(res), res.output


def test_streamed_response_without_raw_body_says_what_m111_costs() -> None:
    res = check("rllm_gateway", fixture("rllm_gateway", "compliant_streamed"), *IDENTITY)
    rep = json.loads(res.stdout)
    assert res.exit_code == 0 and not rep["findings"], res.output
    why = {n["code"]: n["reason"] for n in rep["not_run"]}["M111"]
    assert "4 of 4 responses without their raw body" in why and "compliant_streamed.jsonl:1" in why
    assert "replaced control token" in why
    # with raw bodies the same sessions leave M111 not run only for want of a split, not of evidence
    kept = json.loads(check("rllm_gateway", fixture("rllm_gateway", "compliant"), *IDENTITY).stdout)["not_run"]
    assert {n["code"]: n["reason"] for n in kept}[
        "M111"
    ] == "columns split_exposed_position, split_exposed_logprob_id absent"


def test_one_streamed_session_among_others_leaves_m111_not_run_naming_it(tmp_path: Path) -> None:
    """M111's evidence is declared for the whole dump: a check that ran on the sessions with raw
    bodies only would be silent on the streamed one and still say it ran."""
    kept = read_dump(fixture("rllm_gateway", "control_token_replaced"))
    streamed = [r for r in read_dump(fixture("rllm_gateway", "compliant_streamed")) if r["session_id"] == "episode-1"]
    rep = json.loads(check("rllm_gateway", written(tmp_path, [*kept, *streamed]), *IDENTITY).stdout)
    why = {n["code"]: n["reason"] for n in rep["not_run"]}["M111"]
    assert "2 of 4 responses without their raw body" in why and "traces.jsonl:4 (session episode-1)" in why


def test_dropped_null_logprob_is_refused_naming_file_record_and_field(tmp_path: Path) -> None:
    line = refused(check("rllm_gateway", written(tmp_path, null_logprob_dropped()), *IDENTITY))
    assert "traces.jsonl:1: logprobs: 2 log-probs for 3 sampled token ids" in line
    d = store(tmp_path / "s", null_logprob_dropped())
    line = refused(check("rllm_gateway", d, *IDENTITY))
    assert f"{d / 'gateway_traces.db'}:trace 'episode-0-t0': logprobs: 2 log-probs for 3" in line


def test_raw_body_logprobs_of_another_length_are_refused(tmp_path: Path) -> None:
    recs = [dict(r) for r in read_dump(fixture("rllm_gateway", "compliant"))]
    recs[0]["raw_response"]["choices"][0]["logprobs"]["content"].pop()
    f = tmp_path / "traces.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    line = refused(check("rllm_gateway", f, *IDENTITY))
    assert "traces.jsonl:1: raw_response.choices[0]: logprobs.content: 2 log-probs for 3 sampled token ids" in line


def _db(path: Path, sql: str, rows: list[tuple] = ()) -> Path:
    con = sqlite3.connect(path)
    con.executescript(sql)
    con.executemany("INSERT INTO traces VALUES (?, ?, ?)", rows) if rows else None
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize(
    ("sql", "rows", "said"),
    [
        ("CREATE TABLE other (x);", [], "no table 'traces'"),
        ("CREATE TABLE t (a); CREATE VIEW traces AS SELECT 1;", [], "no table 'traces'"),
        ("CREATE TABLE traces (trace_id TEXT, data TEXT, created_at REAL);", [("t1", "{not json", 0.0)],
         ":trace 't1': data: not JSON"),
        ("CREATE TABLE traces (trace_id TEXT, data TEXT, created_at REAL);", [("t1", "[1]", 0.0)],
         ":trace 't1': data: a trace must be a JSON object"),
        ("CREATE TABLE traces (trace_id TEXT, data TEXT, created_at REAL);", [("t1", '{"x": 1}', 0.0)],
         "missing field 'session_id'"),
    ],
)  # fmt: skip
def test_a_store_that_is_not_the_gateways_is_one_line(tmp_path: Path, sql: str, rows: list[tuple], said: str) -> None:
    db = _db(tmp_path / "x.db", sql, rows)
    assert said in refused(check("rllm_gateway", db, *IDENTITY))


def test_a_wal_store_is_read_without_a_file_beside_it_or_refused_while_its_wal_holds_pages(tmp_path: Path) -> None:
    recs = [r for r in read_dump(fixture("rllm_gateway", "compliant")) if "end" not in r]
    db = tmp_path / "wal.db"
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE traces (trace_id TEXT PRIMARY KEY, data TEXT NOT NULL, created_at REAL NOT NULL)")
    con.executemany(
        "INSERT INTO traces VALUES (?, ?, ?)", [(r["trace_id"], json.dumps(r), k) for k, r in enumerate(recs)]
    )
    con.commit()
    con.close()  # the last connection merges the WAL and removes it
    before = sorted(p.name for p in tmp_path.iterdir())
    res = check("rllm_gateway", db, *IDENTITY)
    assert res.exit_code == 0 and json.loads(res.stdout)["summary"]["rows_read"] == 2, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before == ["wal.db"]
    (tmp_path / "wal.db-wal").write_bytes(b"")
    assert "a WAL-mode store with a wal.db-wal beside it" in refused(check("rllm_gateway", db, *IDENTITY))


def test_a_db_file_that_is_not_sqlite_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "gateway_traces.db").write_bytes(b"\x00\x01 not a database")
    line = refused(check("rllm_gateway", tmp_path, *IDENTITY))
    assert "gateway_traces.db" in line


# ---------------------------------------------------------------- agent-lightning


@pytest.mark.parametrize("case", ["compliant", "compliant_retried"])
def test_agent_lightning_compliant_audits_clean(case: str) -> None:
    res = check("agent_lightning", fixture("agent_lightning", case), *AGL)
    assert res.exit_code == 0 and not json.loads(res.stdout)["findings"], res.output


def test_agent_lightning_keeps_the_last_request_of_a_retried_prompt() -> None:
    from rollout_audit.adapters import load

    table = load("agent_lightning").to_contract(read_dump(fixture("agent_lightning", "compliant_retried")))
    (turns,) = table.column("turns").to_pylist()
    assert [t["sampled_token_ids"] for t in turns] == [[50, 51, 2], [60, 61, 62, 2]]  # not the retried [57, 58, 2]


@pytest.mark.parametrize(
    ("case", "code", "where"),
    [("control_token_replaced", "M111", "ro-0/0#0"), ("stale_server_version", "P502", "ro-0/0")],
)
def test_agent_lightning_faults_are_flagged(case: str, code: str, where: str) -> None:
    res = check("agent_lightning", fixture("agent_lightning", case), *AGL)
    found = {(f["code"], f["trajectory_id"]) for f in json.loads(res.stdout)["findings"]}
    assert res.exit_code == 1 and (code, where) in found, res.output


def test_a_temperature_override_against_the_trainers_is_l212_on_every_call() -> None:
    """The proxy sampled at 1.0 (adjusted_params) while the agent asked, and the trainer recomputes at,
    0.7: the recorded request alone would audit clean. L212 names each rollout at its first turn."""
    ctx = ["--context", "rollout_temperature=0.7", "--context", "top_p=1.0", *IDENTITY]
    res = check("agent_lightning", fixture("agent_lightning", "temperature_override"), *ctx)
    rep = json.loads(res.stdout)
    found = {(f["code"], f["trajectory_id"], f["turn"]) for f in rep["findings"]}
    assert res.exit_code == 1 and found == {("L212", "ro-0/0", 0), ("L212", "ro-1/0", 0)}, res.output
    assert "sampled at temperature 1.0 on 2 of 2 turn(s)" in rep["findings"][0]["message"]
    assert "trainer_temperature = 0.7" in rep["findings"][0]["message"]
    # HEAD's own shape: the request is the body sent upstream, with the proxy's temperature in it
    res = check("agent_lightning", fixture("agent_lightning", "compliant"), *ctx)
    assert res.exit_code == 1 and codes(res) == ["L212"], res.output
    # a trainer at the proxy's temperature: nothing to find, and the sampler's value is on the turns
    res = check("agent_lightning", fixture("agent_lightning", "temperature_override"), *AGL)
    assert res.exit_code == 0 and not json.loads(res.stdout)["findings"], res.output
    # without the trainer's temperature L212 is not run, and says what it needs
    res = check("agent_lightning", fixture("agent_lightning", "temperature_override"), *IDENTITY)
    reasons = {n["code"]: n["reason"] for n in json.loads(res.stdout)["not_run"]}
    assert "trainer_temperature" in reasons["L212"], reasons


def test_agent_lightning_misaligned_logprobs_are_refused(tmp_path: Path) -> None:
    recs = [dict(r) for r in read_dump(fixture("agent_lightning", "compliant"))]
    recs[1]["data"]["response"]["choices"][0]["logprobs"]["content"].append(
        {"token": "token_id:9", "logprob": -1.0, "bytes": None, "top_logprobs": []}
    )
    f = tmp_path / "events.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    line = refused(check("agent_lightning", f, *AGL))
    assert "events.jsonl:2: rollout ro-0/0: response.choices[0]: logprobs.content: 5 log-probs for 4" in line


# ---------------------------------------------------------------- ART


def test_art_compliant_audits_clean() -> None:
    res = check("art", fixture("art", "compliant"), *IDENTITY)
    assert res.exit_code == 0 and not json.loads(res.stdout)["findings"], res.output


@pytest.mark.parametrize(
    ("case", "code", "turn"),
    [
        ("render_drops_separator", "M105", 1),
        ("sampled_without_logprob", "L201", 0),
        ("versions_span_update", "P501", 0),
    ],
)
def test_art_faults_are_flagged(case: str, code: str, turn: int) -> None:
    res = check("art", fixture("art", case), *IDENTITY)
    found = {(f["code"], f["trajectory_id"], f["turn"]) for f in json.loads(res.stdout)["findings"]}
    assert res.exit_code == 1 and found == {(code, "group 0/0", turn)}, res.output


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda g: g["trajectories"][0]["flags"].pop(), "trajectories[0]: tokens, logprobs and flags differ in length"),
        (
            lambda g: g["trajectories"][0]["flags"].__setitem__(11, 2),
            "trajectories[0]: flags[11]: SAMPLED without EXACT",
        ),
        (lambda g: g.update(format="art.trajectories"), "an ART compact payload"),
    ],
)
def test_art_records_art_refuses_are_one_line(tmp_path: Path, edit, said: str) -> None:
    (group,) = [dict(r) for r in read_dump(fixture("art", "compliant"))]
    edit(group)
    f = tmp_path / "art.jsonl"
    f.write_text(json.dumps(group) + "\n")
    assert "art.jsonl:1" in (line := refused(check("art", f, *IDENTITY))) and said in line


# ---------------------------------------------------------------- joining calls to rows by prefix digest


def _call(prompt: list[int], ids: list[int]) -> Call:
    return Call(prompt, ids, None)


def test_join_is_exact_on_the_token_prefix() -> None:
    rows = [[1, 2, 3, 10, 11, 4, 5, 12], [1, 2, 3, 20, 21, 4, 5, 22]]
    calls = [_call([1, 2, 3], [10, 11]), _call([1, 2, 3, 20, 21, 4, 5], [22]), _call([1, 2, 3], [20, 21])]
    j = join(rows, calls)
    assert j.row_of_call == [0, 1, 1] and j.rows_without_calls == [] and j.unjoined == []


@pytest.mark.parametrize(
    "call",
    [
        _call([1, 2, 3], [10, 12]),  # one sampled id different
        _call([1, 2, 9], [10, 11]),  # one context id different
        _call([1, 2], [3, 10, 11]),  # the same ids, split elsewhere: still the same prefix (joined)
        _call([1, 2, 3, 10, 11, 4, 5, 12], [0]),  # past the row's end
    ],
)
def test_join_accepts_nothing_near(call: Call) -> None:
    j = join([[1, 2, 3, 10, 11, 4, 5, 12]], [call])
    same_prefix = [*call.prompt_ids, *call.completion_ids] == [1, 2, 3, 10, 11]
    assert j.row_of_call == ([0] if same_prefix else [None])
    assert j.unjoined == ([] if same_prefix else [0]) and j.rows_without_calls == ([] if same_prefix else [0])


def test_identical_calls_meet_identical_rows_one_each() -> None:
    rows = [[1, 2, 7, 8], [1, 2, 7, 8], [1, 2, 9]]
    j = join(rows, [_call([1, 2], [7, 8]), _call([1, 2], [7, 8])])
    assert j.row_of_call == [0, 1] and j.rows_without_calls == [2]


def test_a_call_that_ends_past_the_row_meets_nothing() -> None:
    rows = [[5, 6, 7]]
    assert join(rows, [_call([5, 6, 7], [])]).row_of_call == [0]
    assert join(rows, [_call([5, 6], [7, 8])]).row_of_call == [None]


# ---------------------------------------------------------------- hostile values in every field

HOSTILE = [4975.7, 2**63, -1, "0", "", None, True, [], {}, [None], "\x1b[2J\n::error::x", float("nan")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rllm_gateway", "agent_lightning", "art"])
def test_a_hostile_value_anywhere_converts_or_is_one_adapter_error(tmp_path: Path, name: str) -> None:
    """Every value of the compliant fixture's first record (lists: their first four) set to each hostile value: the conversion
    succeeds or fails with an AdapterError naming the file (never another exception); a sample of
    them through the CLI exits 0, 1 or 2 with no traceback."""
    import copy

    from fuzzlib import _paths, _set

    from rollout_audit.adapters.convert import convert
    from rollout_audit.contract.errors import AdapterError

    recs = [dict(r) for r in read_dump(fixture(name, "compliant"))]
    f = tmp_path / "dump.jsonl"
    n = len(HOSTILE)  # each field gets four of the values, in turn, so every value meets every kind of field
    cases = [(p, HOSTILE[(i + j) % n]) for i, p in enumerate(_paths(recs[0])) for j in range(0, n, 3)]
    for k, (path, value) in enumerate(cases):
        first = copy.deepcopy(recs[0])
        _set(first, path, value, "set")
        f.write_text("".join(json.dumps(r) + "\n" for r in [first, *recs[1:]]))
        try:
            convert(name, [f], {})
        except AdapterError as e:
            assert str(f) in str(e) and "\n" not in str(e), (path, value, str(e))
        if k % 41 == 0:
            res = cli("check", "--from", name, f)
            assert res.exit_code in (0, 1, 2) and "Traceback" not in res.output and "internal error" not in res.output
