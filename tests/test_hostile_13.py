"""Hostile input on the contract 1.3 evidence the adapters read from other people's dumps: expert routes
(slime `rollout_routed_experts`, SkyRL `rollout_expert_indices`, verl `routed_experts_rows` with the
`attempt` hook's lists, rLLM `routing_matrices` [header JSON, base64], verifiers/prime-rl node
`routed_experts` payloads and Episode records), loss streams and weights (`loss_weights` under
`--context trainer=prime-rl`) and overlong penalties (verl DAPO `overlong_reward`, SkyRL DAPO), with
the context each takes.

Each case puts one hostile value in a compliant fixture and runs the user's path (`check --from FW
FILE`, and `convert`): a refusal is exit 2 with one line naming the dump file, the record and the
field, never a traceback, an internal error or a message that names no field; a value the checks
judge is a finding. Values that claim huge sizes are small inputs (a count of 10^12, a shape of
10^18): the audit runs under an address-space limit, so a case that would build what a count claims
fails here instead of filling the machine. Then every string a new check prints from the dump is
escaped in every format."""

from __future__ import annotations

import copy
import json
import resource
import xml.dom.minidom
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostilehelp import assert_clean_exit, cli

ROOT = Path(__file__).resolve().parent.parent
DUMPS = ROOT / "fixtures" / "frameworks"
BASE = ["environment_id=doors", "environment_version=v1", "verifier_version=v1", "reset_seed=0"]
VERL = ["response_length=64", "top_k=-1", "temperature=1.0", "top_p=1.0"]
VERL_DAPO = [*VERL, "max_resp_len=64", "overlong_buffer_len=16", "overlong_penalty_factor=1.0"]
SAMPLING = ["temperature=1.0", "top_p=1.0"]
SKYRL_DAPO = [*SAMPLING, "max_generate_length=64", "overlong_buffer_len=32", "overlong_buffer_penalty_factor=1.0"]
RLLM = ["temperature=0.7", "top_p=1.0"]
PRIME = ["trainer=prime-rl"]
NAN, INF = float("nan"), float("inf")
# what a refusal says when the code did not foresee the shape: it names the record, not the field
UNNAMED = ("a field has the wrong shape", "malformed record", "internal error")
HEADROOM = 1 << 30  # address space an audit may add to what this process maps (a tiny dump needs far less)


def _records(fw: str, case: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (DUMPS / fw / f"{case}.jsonl").read_text().splitlines() if x.strip()]


def _last_step(recs: list[dict], hdr: str | None = None, data: str | None = None, version: Any = "keep") -> None:
    """rLLM: the routes of every trajectory's last step (where the trainer reads them), and its version."""
    for ep in recs:
        for tr in ep["trajectories"]:
            st = tr["steps"][-1]
            for tgt in (st, st["model_output"]):
                if "routing_matrices" in tgt:
                    tgt["routing_matrices"] = [hdr or tgt["routing_matrices"][0], tgt["routing_matrices"][1]]
                    if data is not None:
                        tgt["routing_matrices"][1] = data
                if version != "keep":
                    tgt["weight_version"] = version


def _node(recs: list[dict], i: int) -> dict:
    """verifiers: node `i` of the last record's (first) trace."""
    rec = recs[-1]
    return (rec["traces"][0] if "traces" in rec else rec)["nodes"][i]


def _set(*path: Any) -> Callable[[list[dict]], None]:
    """A mutation that sets the last record's value at `path` (the last item is the value)."""
    *keys, value = path

    def mutate(recs: list[dict]) -> None:
        at: Any = recs[-1]
        for k in keys[:-1]:
            at = at[k]
        at[keys[-1]] = value

    return mutate


B64 = "AQID"  # three bytes
HUGE = 10**12
# (id, framework, fixture, mutation, context, expected): expected ("refused", words the one line must
# hold besides FILE:LINE) or ("finding", codes among the findings)
CASES: list[tuple[str, str, str, Callable[[list[dict]], None] | None, list[str], tuple[str, Any]]] = [
    # ---- rLLM routing_matrices, [header JSON, base64]
    ("rllm header nested 50k deep", "rllm", "compliant_routes",
     lambda r: _last_step(r, "{" + '"shape": ' + "[" * 50_000 + "]" * 50_000 + "}"), RLLM,
     ("refused", ["routing_matrices"])),
    ("rllm header of 100k characters", "rllm", "compliant_routes",
     lambda r: _last_step(r, '{"shape": [2, 2], "dtype": "int16", "x": "' + "a" * 100_000 + '"}'), RLLM,
     ("refused", ["routing_matrices header"])),
    ("rllm shape claims 10^12 x 10^12, no rows", "rllm", "compliant_routes",
     lambda r: _last_step(r, f'{{"shape": [{HUGE}, {HUGE}], "dtype": "int8"}}', ""), RLLM,
     ("refused", ["routing_matrices"])),
    ("rllm dtype float32", "rllm", "compliant_routes",
     lambda r: _last_step(r, '{"shape": [2, 2], "dtype": "float32"}'), RLLM, ("refused", ["dtype", "float32"])),
    ("rllm dtype with terminal escapes", "rllm", "compliant_routes",
     lambda r: _last_step(r, '{"shape": [2, 2], "dtype": "\\u001b[2J\\n::error::x"}'), RLLM,
     ("refused", ["dtype"])),
    ("rllm negative expert ids", "rllm", "compliant_routes",
     lambda r: _last_step(r, '{"shape": [1, 1], "dtype": "int8"}', "/////w=="), RLLM, ("refused", ["expert ids"])),
    ("rllm routes past the tokens", "rllm", "compliant_routes",
     lambda r: _last_step(r, '{"shape": [1, 1], "dtype": "int8"}', "AAAA" * 200), RLLM, ("finding", {"P505"})),
    ("rllm weight_version a string", "rllm", "compliant_routes", lambda r: _last_step(r, version="3"), RLLM,
     ("refused", ["weight_version"])),
    # ---- verl: row counts and the attempt hook's lists
    ("verl routed_experts_rows 10^12", "verl", "compliant_routes_vllm", _set("routed_experts_rows", HUGE), VERL,
     ("refused", ["routed_experts_rows"])),
    ("verl routed_experts_rows negative", "verl", "compliant_routes_vllm", _set("routed_experts_rows", -3), VERL,
     ("refused", ["routed_experts_rows"])),
    ("verl routed_experts_rows 3.5", "verl", "compliant_routes_vllm", _set("routed_experts_rows", 3.5), VERL,
     ("refused", ["routed_experts_rows"])),
    ("verl call routed_experts_rows 10^12", "verl", "compliant_routes_vllm",
     _set("engine_calls", -1, "routed_experts_rows", HUGE), VERL, ("refused", ["routed_experts_rows"])),
    ("verl attempts claim 10^12 tokens", "verl", "fully_async_routes",
     _set("engine_calls", -1, "attempts", [[HUGE, 7]]), VERL, ("refused", ["attempts"])),
    ("verl attempts negative count", "verl", "fully_async_routes",
     _set("engine_calls", -1, "attempts", [[-3, 7], [9, 8]]), VERL, ("refused", ["attempts"])),
    ("verl routed_experts_versions version 2^63", "verl", "fully_async_routes",
     _set("engine_calls", -1, "routed_experts_versions", [[53, 2**63], [3, 8]]), VERL,
     ("refused", ["routed_experts_version"])),
    ("verl routed_experts_sha256 not a digest", "verl", "compliant_routes_vllm",
     _set("routed_experts_sha256", "\x1b[2J\n::error::forged<script>"), VERL, ("refused", ["routed_experts_sha256"])),
    ("verl extra_fields a list", "verl", "compliant_dapo", _set("extra_fields", [1, 2]), VERL_DAPO,
     ("refused", ["extra_fields"])),
    ("verl reward_extra_info a list", "verl", "compliant_dapo", _set("extra_fields", "reward_extra_info", [1]),
     VERL_DAPO, ("refused", ["reward_extra_info"])),
    ("verl overlong_reward NaN", "verl", "compliant_dapo",
     _set("extra_fields", "reward_extra_info", "overlong_reward", NAN), VERL_DAPO, ("finding", {"R414"})),
    ("verl overlong_reward a string", "verl", "compliant_dapo",
     _set("extra_fields", "reward_extra_info", "overlong_reward", "-0.5"), VERL_DAPO,
     ("refused", ["overlong_reward"])),
    ("verl context overlong_buffer_len=0", "verl", "compliant_dapo", None,
     [*VERL, "max_resp_len=64", "overlong_buffer_len=0", "overlong_penalty_factor=1.0"],
     ("refused", ["overlong_buffer_len"])),
    ("verl context overlong_penalty_factor=-1", "verl", "compliant_dapo", None,
     [*VERL, "max_resp_len=64", "overlong_buffer_len=16", "overlong_penalty_factor=-1"],
     ("refused", ["overlong_penalty_factor"])),
    ("verl context max_resp_len of 30 digits", "verl", "compliant_dapo", None,
     [*VERL, "max_resp_len=" + "9" * 30, "overlong_buffer_len=16", "overlong_penalty_factor=1.0"],
     ("refused", ["max_resp_len"])),
    ("verl context response_length=-1", "verl", "compliant_routes_vllm", None,
     ["response_length=-1", "top_k=-1"], ("refused", ["response_length"])),
    ("verl context top_k=abc", "verl", "compliant_routes_vllm", None, ["response_length=64", "top_k=abc"],
     ("refused", ["top_k"])),
    # ---- slime: the route array and the generate hook's per-call counts
    ("slime call claims 10^12 route rows", "slime", "compliant_moe",
     lambda r: r[-1]["metadata"]["engine_calls"][-1].update(
         routed_experts_start_len=0, routed_experts_rows=HUGE, routed_experts_len=HUGE), SAMPLING,
     ("refused", ["routed_experts_"])),
    ("slime weight_version infinite", "slime", "compliant_moe",
     _set("metadata", "engine_calls", -1, "weight_version", INF), SAMPLING, ("refused", ["weight_version"])),
    ("slime weight_version 5.5", "slime", "compliant_moe",
     _set("metadata", "engine_calls", -1, "weight_version", 5.5), SAMPLING, ("refused", ["weight_version"])),
    ("slime routes of floats", "slime", "compliant_moe", _set("rollout_routed_experts", [[[0.5, 1]]]), SAMPLING,
     ("refused", ["rollout_routed_experts"])),
    ("slime negative expert id", "slime", "compliant_moe", _set("rollout_routed_experts", [[[-1, 1]]]), SAMPLING,
     ("refused", ["rollout_routed_experts"])),
    ("slime routes thrice as long", "slime", "compliant_moe",
     lambda r: r[-1].update(rollout_routed_experts=r[-1]["rollout_routed_experts"] * 3), SAMPLING,
     ("refused", ["route rows"])),
    # ---- SkyRL: rollout_expert_indices, its hook counts, the DAPO penalty and settings
    ("skyrl call claims 10^12 route rows", "skyrl", "compliant_moe",
     lambda r: r[-1]["engine_calls"][-1].update(
         rollout_expert_indices_start=0, rollout_expert_indices_rows=HUGE, rollout_expert_indices_len=HUGE),
     SAMPLING, ("refused", ["rollout_expert_indices_"])),
    ("skyrl routes of booleans", "skyrl", "compliant_moe", _set("rollout_expert_indices", [[[True, False]]]),
     SAMPLING, ("refused", ["rollout_expert_indices"])),
    ("skyrl overlong_penalty NaN", "skyrl", "compliant_dapo", _set("overlong_penalty", NAN), SKYRL_DAPO,
     ("finding", {"R414"})),
    ("skyrl context overlong_buffer_len=0", "skyrl", "compliant_dapo", None,
     [*SAMPLING, "max_generate_length=64", "overlong_buffer_len=0", "overlong_buffer_penalty_factor=1.0"],
     ("refused", ["overlong_buffer_len"])),
    ("skyrl context max_generate_length=-64", "skyrl", "compliant_dapo", None,
     [*SAMPLING, "max_generate_length=-64", "overlong_buffer_len=32", "overlong_buffer_penalty_factor=1.0"],
     ("refused", ["max_generate_length"])),
    # ---- verifiers / prime-rl: node routed_experts payloads, Episode spans, loss_weights, the context
    ("verifiers shape [0, 10^18, 10^18]", "verifiers", "compliant_prime_rl_moe",
     lambda r: _node(r, 2).update(routed_experts={"dtype": "uint8", "shape": [0, 10**18, 10**18], "data": ""}),
     PRIME, ("refused", ["routed_experts"])),
    ("verifiers shape claims 10^12 rows", "verifiers", "compliant_prime_rl_moe",
     lambda r: _node(r, 2).update(routed_experts={"dtype": "uint8", "shape": [HUGE, 2, 2], "data": B64}),
     PRIME, ("refused", ["routed_experts"])),
    ("verifiers dtype float32", "verifiers", "compliant_prime_rl_moe",
     lambda r: _node(r, 2).update(routed_experts={"dtype": "float32", "shape": [6, 2, 2], "data": B64}),
     PRIME, ("refused", ["routed_experts.dtype"])),
    ("verifiers data not base64", "verifiers", "compliant_prime_rl_moe",
     lambda r: _node(r, 2).update(routed_experts={"dtype": "uint8", "shape": [6, 2, 2], "data": "!!!"}),
     PRIME, ("refused", ["routed_experts.data"])),
    ("verifiers routes past the node's tokens", "verifiers", "compliant_prime_rl_moe",
     lambda r: _node(r, 2).update(routed_experts={"dtype": "uint8", "shape": [60, 2, 2], "data": "AAAA" * 80}),
     PRIME, ("finding", {"P505"})),
    ("verifiers span start 10^30", "verifiers", "compliant_prime_rl_moe",
     _set("run", "work", "policy", {"start": 10**30, "end": 10**30}), PRIME, ("refused", ["run.work.policy.start"])),
    ("verifiers span start a string", "verifiers", "compliant_prime_rl_moe",
     _set("run", "work", "policy", {"start": "3", "end": "3"}), PRIME, ("refused", ["run.work.policy.start"])),
    ("verifiers ce weight NaN", "verifiers", "compliant_prime_rl_echo",
     lambda r: _node(r, 3).update(loss_weights={"ce": [NAN] * len(_node(r, 3)["token_ids"])}),
     [*PRIME, "policy_version=3"], ("finding", {"M110"})),
    ("verifiers rl weight -inf", "verifiers", "compliant_prime_rl_echo",
     lambda r: _node(r, 2).update(loss_weights={"rl": [-INF] * len(_node(r, 2)["token_ids"])}),
     [*PRIME, "policy_version=3"], ("finding", {"M110"})),
    ("verifiers ce weights short", "verifiers", "compliant_prime_rl_echo",
     lambda r: _node(r, 3).update(loss_weights={"ce": [1.0]}), [*PRIME, "policy_version=3"],
     ("refused", ["loss_weights.ce"])),
    ("verifiers context trainer with escapes", "verifiers", "compliant_prime_rl_echo", None,
     ["trainer=\x1b[2Jevil\n::error::x"], ("refused", ["trainer"])),
    ("verifiers context policy_version=3.5", "verifiers", "compliant_prime_rl_echo", None,
     [*PRIME, "policy_version=3.5"], ("refused", ["policy_version"])),
]  # fmt: skip


def _context(ctx: list[str]) -> list[str]:
    return [x for kv in [*BASE, *ctx] for x in ("--context", kv)]


def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))


def bounded(*args: str):
    """`rollout-audit ARGS` in this process under an address-space limit of what it maps now plus
    HEADROOM: an audit that builds what a dump claims gets a MemoryError (an internal error), not the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard < 0 else min(limit, hard), hard))
    try:
        return cli(*args)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _dump(tmp_path: Path, fw: str, fixture: str, mutate: Callable[[list[dict]], None] | None) -> Path:
    recs = copy.deepcopy(_records(fw, fixture))
    if mutate is not None:
        mutate(recs)
    path = tmp_path / "dump.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _one_clear_line(r, dump: Path, words: list[str]) -> None:
    """Exit 2, one line on stderr naming the dump (with its record for a record's value) and each of `words`."""
    assert_clean_exit(r, (2,))
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert str(dump) in line, line
    assert not any(u in line for u in UNNAMED), line
    assert all(w in line for w in words), (words, line)
    assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in line), line  # escapes shown, never sent


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_value_on_the_new_evidence(tmp_path, case):
    _, fw, fixture, mutate, ctx, (outcome, expected) = case
    dump = _dump(tmp_path, fw, fixture, mutate)
    r = bounded("check", "--from", fw, str(dump), *_context(ctx), "--format", "json")
    if outcome == "finding":
        assert_clean_exit(r, (1,))
        codes = {f["code"] for f in json.loads(r.stdout)["findings"]}
        assert expected <= codes, (expected, codes)
        return
    _one_clear_line(r, dump, expected)
    if mutate is not None:  # a record's value: the line names the record it is in
        assert f"{dump}:" in r.stderr, r.stderr
    out = tmp_path / "converted"
    c = bounded("convert", "--from", fw, str(dump), str(out), *_context(ctx))
    _one_clear_line(c, dump, expected)
    assert not out.exists()


# ---------------------------------------------------------------- every string escaped in every format

EVIL = "t\n::error file=evil.py,line=1::forged\x1b]8;;https://evil.example\x07x\x1b[2J<script>alert(1)</script>"


@pytest.fixture(scope="module")
def evil_dumps(tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    """Fault fixtures of the three new checks with a hostile trajectory id on every record: verl's
    duplicated routes (P505) beside its DAPO penalty over tool tokens (R414), and prime-rl's echo on
    the next action (M110)."""
    root = tmp_path_factory.mktemp("evil")
    verl = _records("verl", "routes_resumed_duplicated") + _records("verl", "dapo_overlong_counts_tool_tokens")
    for k, rec in enumerate(verl):
        rec["request_id"] = f"{EVIL}{k}"
    vf = _records("verifiers", "prime_rl_echo_on_next_action")
    for k, rec in enumerate(vf):
        rec["id"] = f"{EVIL}{k}"
    out = {}
    for name, recs, ctx in (("verl", verl, VERL_DAPO), ("verifiers", vf, [*PRIME, "policy_version=3"])):
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        out[name] = (path, ctx)
    return out


def _controls(text: str) -> bool:
    return any((ord(c) < 32 and c != "\n") or 0x7F <= ord(c) <= 0x9F for c in text)


@pytest.mark.parametrize("fw", ["verl", "verifiers"])
@pytest.mark.parametrize("fmt", ["text", "github", "json", "junit"])
def test_new_findings_escape_dump_strings_in_every_format(evil_dumps, fw, fmt):
    dump, ctx = evil_dumps[fw]
    r = cli("check", "--from", fw, str(dump), *_context(ctx), "--format", fmt)
    assert_clean_exit(r, (1,))
    expected = {"P505", "R414"} if fw == "verl" else {"M110"}
    assert all(code in r.stdout for code in expected), r.stdout[:2000]
    assert not _controls(r.stdout), r.stdout[:2000]
    lines = r.stdout.splitlines()
    if fmt == "github":
        assert all(line.startswith(("::error ", "::warning ", "::notice ")) for line in lines)
        assert not any(line.startswith("::error file=evil.py") for line in lines)  # the forged command stays text
        props = [line[2:].split("::", 1)[0].split(" ", 1)[1] for line in lines if " file=" in line]
        assert props and all(p.count("=") == 2 and ":" not in p for p in props), props
    elif fmt == "json":
        ids = {f["trajectory_id"] for f in json.loads(r.stdout)["findings"] if f["code"] in expected}
        assert ids and all(i.startswith(EVIL) for i in ids), ids  # the id round-trips, escaped by JSON
    else:
        assert not any(line.lstrip().startswith("::") for line in lines)
    if fmt == "junit":
        xml.dom.minidom.parseString(r.stdout.encode())


@pytest.mark.parametrize("fw", ["verl", "verifiers"])
def test_new_findings_escape_dump_strings_in_the_html_report(evil_dumps, tmp_path, fw):
    dump, ctx = evil_dumps[fw]
    page = tmp_path / "report.html"
    r = cli("report", "--from", fw, str(dump), *_context(ctx), "-o", str(page))
    assert_clean_exit(r, (1,))
    html = page.read_text()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)" in html
    assert "\x1b" not in html


# ---------------------------------------------------------------- the checks on a converted log's 1.3 columns


@pytest.mark.parametrize("version", [2**63 - 1, -(2**63)])
def test_a_route_version_at_the_ends_of_int64_is_p505_not_a_crashed_check(tmp_path, version):
    """routed_experts_version holds int64: one past 2^53 is rounded as the turns' versions are, and named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    log = tmp_path / "log"
    r = cli("convert", "--from", "skyrl", str(DUMPS / "skyrl" / "compliant_moe.jsonl"), str(log), *_context(SAMPLING))
    assert_clean_exit(r, (0,))
    part = next((log / "trajectories").glob("*.parquet"))
    t = pq.read_table(part)
    i = t.schema.get_field_index("routed_experts_version")
    values = [None if v is None else [None if x is None else version for x in v] for v in t.column(i).to_pylist()]
    pq.write_table(t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type)), part)
    r = cli("check", str(log), "--format", "json")
    assert_clean_exit(r, (1,))
    report = json.loads(r.stdout)
    assert not report["check_errors"], report["check_errors"]
    messages = [f["message"] for f in report["findings"] if f["code"] == "P505"]
    assert messages and all("routes of version" in m for m in messages), messages


def test_a_log_file_with_a_trainer_column_is_renamed_into_place_whole(tmp_path: Path) -> None:
    """write_table with a column the contract does not define (verl's old_log_probs): the file appears
    under its name only with that column, leaves no staged file behind, and replaces a link at its name
    instead of writing through it."""
    import pyarrow.parquet as pq

    from rollout_audit.faults import read_records
    from rollout_audit.reading.records import records_to_table
    from rollout_audit.writing import write_table

    trajs, _ = read_records(ROOT / "fixtures" / "compliant")
    table = records_to_table(trajs[:2], kind="trajectories")
    table = table.append_column("old_log_probs", table.column("behavior_logprobs"))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "trajectories"
    out.mkdir()
    (out / "part-0000.parquet").symlink_to(victim)
    write_table(out / "part-0000.parquet", table, "trajectories", validate=False)
    assert victim.read_text() == "keep"
    assert not (out / "part-0000.parquet").is_symlink()
    assert "old_log_probs" in pq.read_schema(out / "part-0000.parquet").names
    assert sorted(p.name for p in out.iterdir()) == ["part-0000.parquet"]
