"""OpenAI-compatible adapter and SessionRecorder: sessions recorded from a real server on loopback (a tiny
GPT-2 sampling at temperature 0.7) convert and audit; raw log-probs (vLLM V1's default mode) are L206
under replay against the same server, processed ones are not. The chat-format fixture audits clean with
the not-run list docs/frameworks/openai.md predicts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from adapterhelp import (
    IDENTITY,
    cli,
    documented_not_run,
    fails_naming,
    finding_keys,
    fixture,
    opts,
    records,
    report,
    same_after_convert,
    without,
)

import rollout_audit as ra
from rollout_audit.adapters import openai as adapter
from rollout_audit.adapters.base import read_dump
from rollout_audit.contract.config import Config
from rollout_audit.integrations.openai import SessionRecorder

REPLAY = ["L205", "L206"]
# the tests below that take `model_dir` build a tiny GPT-2, serve it and replay against it: the slow tier
served = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks.tinylm import build

    torch.set_num_threads(1)
    return build(tmp_path_factory.mktemp("tinylm"), versions=1)["0"]


def _record(model_dir: str, mode: str, path: Path, sessions: int = 6) -> str:
    """An agent loop (token in, token out) against a server in `mode`; returns the server's URL."""
    from tinyserver import serve
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt, obs = tok("you are an agent in a room")["input_ids"], tok("<obs> the door is stuck </obs>")["input_ids"]
    server, url = serve(model_dir, mode)
    for n in range(sessions):
        rec = SessionRecorder(url, path, f"s{n}", logprobs_mode=mode)
        first = rec.complete(prompt, temperature=0.7, top_p=1.0, max_tokens=4, seed=n)["choices"][0]
        last = rec.complete(prompt + first["token_ids"] + obs, temperature=0.7, top_p=1.0, max_tokens=4, seed=100 + n)
        cut = last["choices"][0]["finish_reason"] == "length"  # the engine's limit, not the task's end
        rec.end(stop_reason="max_tokens" if cut else "success", reward=None if cut else 1.0, policy_version=0)
    return url  # the server keeps serving (daemon thread) for replay


@served
@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
def test_recorded_session_converts_and_raw_logprobs_are_l206(model_dir: str, mode: str, tmp_path: Path) -> None:
    path = tmp_path / "dump" / "sessions.jsonl"  # convert refuses an output next to a file it reads
    url = _record(model_dir, mode, path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["request"]["return_token_ids"] and lines[0]["logprobs_mode"] == mode
    table = adapter.to_contract(read_dump(path), **dict(kv.split("=") for kv in IDENTITY))
    turns = table.column("turns").to_pylist()[0]
    assert [t["temperature"] for t in turns] == pytest.approx([0.7, 0.7])
    out = tmp_path / "log"
    assert cli("convert", "--from", "openai", path, out, *opts(IDENTITY)).exit_code == 0
    rep = ra.audit(str(out), config=Config(replay=64, replay_endpoints={"0": url}))
    codes = set(rep.findings["code"].to_list())
    if mode == "raw_logprobs":  # L206: the base softmax; L205 and L207 see the same gap from the other side
        assert {"L205", "L206"} <= codes <= {"L205", "L206", "L207"}, rep.render()
        l206 = rep.findings.filter(rep.findings["code"] == "L206").to_dicts()
        assert l206[0]["trajectory_id"] == "s0" and "match the base softmax" in l206[0]["message"]
    else:
        assert codes == set() and not set(rep.not_run) & set(REPLAY), rep.render()


def test_compliant_fixture_audits_clean_with_the_documented_not_run_list() -> None:
    rep = report([fixture("openai", "compliant")], "openai", IDENTITY)
    assert rep["findings"] == []
    assert {n["code"] for n in rep["not_run"]} == documented_not_run("openai")


def test_convert_then_check_equals_check_from(tmp_path: Path) -> None:
    same_after_convert("openai", "compliant", IDENTITY, tmp_path)
    assert finding_keys(report([fixture("openai", "compliant")], "openai", [])) == [("E801", None, None)]


def test_missing_prompt_token_ids_exits_2_naming_it(tmp_path: Path) -> None:
    recs = records("openai", "compliant")
    fails_naming("openai", [without(recs[0], ["response", "prompt_token_ids"])], "prompt_token_ids", tmp_path)


def test_what_the_server_cannot_know_comes_from_the_context() -> None:
    pairs = [r for r in records("openai", "compliant") if "end" not in r]
    declared = json.loads(adapter.to_contract(pairs).schema.metadata[b"rollout_log.not_recorded"])
    assert {"stop_reason", "reward", "turns.policy_version"} <= set(declared)
    row = adapter.to_contract(pairs, stop_reason="failure", reward="0.5", policy_version="2").to_pylist()[0]
    assert (row["stop_reason"], row["terminated"], row["reward"], row["turns"][0]["policy_version"]) == (
        "failure",
        True,
        0.5,
        2,
    )


@served
def test_check_from_replays_and_names_the_dump_records(
    model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check --from openai DUMP --replay N` replays the converted log (through a temporary log that is
    gone afterwards), and each finding names the dump file and the line of its session's first record."""
    import tempfile

    path = tmp_path / "dump" / "sessions.jsonl"
    url = _record(model_dir, "raw_logprobs", path)
    cfg = tmp_path / "audit.toml"
    cfg.write_text(f'replay_endpoints = {{"0" = "{url}"}}\n')
    private = tmp_path / "tmp"  # the process's temporary directory, where nothing else runs
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    res = cli("check", path, "--from", "openai", *opts(IDENTITY), "--replay", "64", "--config", cfg, "--format", "json")
    assert res.exit_code == 1, res.output + res.stderr
    assert list(private.iterdir()) == []
    found = json.loads(res.output)["findings"]
    assert "L206" in {f["code"] for f in found}
    first_line = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        first_line.setdefault(json.loads(line)["session"], n)
    for f in found:
        assert f["file"] == f"{path}:{first_line[f['trajectory_id']]}", f
    gh = cli(
        "check", path, "--from", "openai", *opts(IDENTITY), "--replay", "64", "--config", cfg, "--format", "github"
    )
    assert f"file={path}:1," in gh.output.replace("%3A", ":"), gh.output


def test_check_from_with_replay_and_no_replayer_exits_2(tmp_path: Path) -> None:
    res = cli("check", fixture("openai", "compliant"), "--from", "openai", *opts(IDENTITY), "--replay", "8")
    assert res.exit_code == 2, res.output + res.stderr
    assert (  # on stderr, naming the log, as every error is
        ": L205, L206, L207, L209, L211: replay of 8 trajectories was asked for and did not run: no replayer"
        in res.stderr
        and res.stderr.startswith("rollout-audit: error: ")
    )


@served
def test_a_context_that_does_not_extend_the_session_is_m108_counted_once(model_dir: str, tmp_path: Path) -> None:
    """A real agent loop whose next context holds another id for the turn's last control token than the
    one the server returned (the loop writes its canonical end-of-turn id, or the server returned a
    wrong one): the session is split where the trainer splits it, each split is M108 naming the position
    and both ids, and each episode's outcome counts once."""
    from tinyserver import serve
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt, obs = tok("you are an agent in a room")["input_ids"], tok("<obs> the door is stuck </obs>")["input_ids"]
    _, url = serve(model_dir, "processed_logprobs")
    path, sessions, expected, stops = tmp_path / "dump" / "sessions.jsonl", 3, {}, Counter()
    for n in range(sessions):
        rec = SessionRecorder(url, path, f"s{n}", logprobs_mode="processed_logprobs")
        sampled = rec.complete(prompt, temperature=0.7, top_p=1.0, max_tokens=4, seed=n)["choices"][0]["token_ids"]
        end_id = 0 if sampled[-1] != 0 else 1  # the id the loop writes instead of the one the server returned
        last = rec.complete(prompt + sampled[:-1] + [end_id] + obs, temperature=0.7, top_p=1.0, max_tokens=4, seed=n)
        stop = "max_tokens" if last["choices"][0]["finish_reason"] == "length" else "success"
        rec.end(stop_reason=stop, reward=None if stop == "max_tokens" else 1.0, policy_version=0)
        stops[stop] += 1
        expected[f"s{n}#1"] = (len(prompt) + len(sampled) - 1, sampled[-1], end_id)
    out = tmp_path / "log"
    converted = cli("convert", "--from", "openai", path, out, *opts(IDENTITY))
    assert converted.exit_code == 0 and 'not_recorded = ["reward"]' in converted.stderr, converted.stderr
    rep = ra.audit(str(out), config=Config(not_recorded=["reward"]))  # what the log cannot vouch for itself
    assert rep.findings.filter(rep.findings["severity"] == "error").is_empty(), rep.render()
    m108 = {r["trajectory_id"]: r for r in rep.findings.filter(rep.findings["code"] == "M108").to_dicts()}
    assert set(m108) == set(expected)
    for tid, (pos, had, got) in expected.items():
        assert m108[tid]["position"] == pos
        assert (
            f"at position {pos}: the sequence so far had id {had}, the next engine context had id {got}"
            in (m108[tid]["message"])
        )
    res = cli("stats", out, "--format", "json")
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout)
    assert stats["stop_reasons"] == dict(stops) and stats["split_episodes"] == sessions


def test_the_trainers_truncation_policy_is_context_never_assumed() -> None:
    """A server knows nothing of the trainer: without context no policy is stated (the configuration's
    applies); `--context trainer=prime-rl` or `--context truncation=...` states it, a contradiction or
    an unknown value is exit 2 on one line."""
    recs = list(read_dump(fixture("openai", "compliant")))
    assert b"rollout_audit.trainer_settings" not in (adapter.to_contract(recs).schema.metadata or {})
    said = json.loads(adapter.to_contract(recs, trainer="prime-rl").schema.metadata[b"rollout_audit.trainer_settings"])
    assert said["settings"] == {"truncation": "penalize"} and "prime-rl" in said["said"]
    said = json.loads(
        adapter.to_contract(recs, truncation="exclude").schema.metadata[b"rollout_audit.trainer_settings"]
    )
    assert said["settings"] == {"truncation": "exclude"}
    src = fixture("openai", "compliant")
    for kv, says in (("truncation=drop", "'drop'"), ("trainer=verl", "unknown trainer")):
        res = cli("check", "--from", "openai", src, "--context", kv)
        assert res.exit_code == 2 and says in res.stderr.strip(), res.stderr
    res = cli("check", "--from", "openai", src, "--context", "trainer=prime-rl", "--context", "truncation=exclude")
    assert res.exit_code == 2 and "prime-rl follows 'penalize'" in res.stderr
