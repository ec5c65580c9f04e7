"""`rollout-audit show`: decoding with a local Hugging Face tokenizer or the vocabulary a log declares,
fitting the width with indented wrapped lines, and marking tokens that break a rule."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_log

from rollout_audit import RolloutWriter
from rollout_audit.cli import main
from rollout_audit.contract.schema import POLICY

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` lives at the repo root

OBSERVATION = 3
WORDS = ["open", "the", "red", "door", "take", "blue", "key", "is", "stuck", "call", "one", "tool"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _with_words(trajs: list[dict], vocab_size: int) -> list[dict]:
    """Token ids folded into a small vocabulary (ids >= 1, so none is a special token of the tiny tokenizer)."""
    for t in trajs:
        t["token_ids"] = [4 + i % (vocab_size - 4) for i in t["token_ids"]]
    return trajs


def _declared_log(tmp_path, trajs) -> Path:
    root = tmp_path / "log" / "trajectories"
    with RolloutWriter(
        root / "part-0.parquet", validate=False, tokenizer={"name": "words-1", "vocabulary": WORDS}
    ) as w:
        w.write(trajs)
    return tmp_path / "log"


def test_show_decodes_with_a_local_hf_tokenizer_and_fits_the_width(tmp_path, records):
    pytest.importorskip("transformers")
    from benchmarks.tinylm import tokenizer

    tok = tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    trajs = _with_words(records[0], len(tok))
    t = trajs[0]
    root = write_log(tmp_path / "log", trajs)
    out = run("show", root, t["trajectory_id"], "--tokenizer", tmp_path / "tok", "--no-color", "--width", 60).output
    assert "decoded with" in out
    words = [tok.decode([i]) for i in t["token_ids"][:5]]
    assert all(w in out for w in words)
    lines = out.splitlines()
    assert max(map(len, lines)) <= 60 and not any(line.endswith(" ") for line in lines)
    turn_lines = [i for i, line in enumerate(lines) if line.startswith(("turn ", "prompt"))]
    body = [line for line in lines[turn_lines[0] :] if line and not line.startswith(("turn ", "prompt"))]
    assert len(body) > 2 * len(turn_lines) and all(line.startswith("  ") for line in body)  # wrapped, still indented
    ids = run("show", root, t["trajectory_id"], "--tokenizer", tmp_path / "tok", "--ids", "--no-color").output
    assert f"{words[0].strip()}#{t['token_ids'][0]}" in ids
    bad = run("show", root, t["trajectory_id"], "--tokenizer", tmp_path / "nope")
    assert bad.exit_code == 2 and "not a directory" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_show_without_transformers_says_so_in_one_line(tmp_path, records, monkeypatch):
    root = write_log(tmp_path / "log", records[0])
    (tmp_path / "tok").mkdir()
    monkeypatch.setitem(sys.modules, "transformers", None)  # what an install without the extra sees
    r = run("show", root, records[0][0]["trajectory_id"], "--tokenizer", tmp_path / "tok")
    assert r.exit_code == 2 and "pip install transformers" in r.output and "Traceback" not in r.output


def test_show_uses_the_declared_vocabulary_and_rounds_headers(tmp_path, records):
    trajs = _with_words(records[0], len(WORDS) + 4)
    for t in trajs:
        t["token_ids"] = [i - 4 for i in t["token_ids"]]
    t = trajs[0]
    out = run("show", _declared_log(tmp_path, trajs), t["trajectory_id"], "--no-color", "--width", 200).output
    assert "declares (words-1)" in out
    assert " ".join(WORDS[i] for i in t["token_ids"][:3]) in out
    assert not re.search(r"\d\.\d{6,}", out)  # log-probs and rewards to 4 significant digits
    assert "lp =" not in out and "!token" not in out  # the legend lists only what appears
    assert "observation: " in out or not any(x.get("observation_text") for x in t["turns"])


def test_show_flags_trained_non_policy_tokens_with_the_finding_code(tmp_path, records):
    trajs = records[0]
    t = trajs[0]
    pos = t["token_source"].index(OBSERVATION)
    t["loss_mask"][pos] = True
    t["num_trainable_tokens"] += 1
    root = write_log(tmp_path / "log", trajs)
    plain = run("show", root, t["trajectory_id"], "--no-color", "--width", 300).output
    assert f"!{t['token_ids'][pos]}⟨M101⟩" in plain
    assert "= in the loss but not sampled by the policy" in plain and "⟨CODE⟩" in plain
    policy_pos = t["token_source"].index(POLICY)
    assert f"!{t['token_ids'][policy_pos]}" not in plain
    colour = run("show", root, t["trajectory_id"], "--color", "--width", 300).output
    assert "\x1b[1;37;41m" in colour  # bold white on red: stands out in a terminal too


def test_show_decodes_the_reference_agent_fixture_without_a_tokenizer_option():
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "compliant"
    import polars as pl

    import rollout_audit as ra

    tid = ra.scan(fixture).trajectories.select(pl.col("trajectory_id").first()).collect().item()
    out = run("show", fixture, tid, "--no-color", "--width", 120).output
    assert "declares (keydoor-words-v1-" in out and "<sys>" in out and "observation: " in out


def test_a_tokenizer_whose_regex_backtracks_is_one_line_not_a_rust_panic(tmp_path, records):
    """A tokenizer.json whose regular expressions backtrack past the regex engine's limit on one of
    its own vocabulary entries: the Rust library panics (and prints a backtrace to the process's
    stderr); `show` exits 2 with one line naming the file, and no panic text, even under RUST_BACKTRACE=1."""
    pytest.importorskip("transformers")
    import json
    import os
    import subprocess

    from benchmarks.tinylm import tokenizer

    tok = tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    trajs = _with_words(records[0], len(tok))
    t = trajs[0]
    spec = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())
    backtracks = {"Regex": "(a|aa)+(a|aa)+(a|aa)+(a|aa)+b"}  # exponential on a run of a's with no b
    long_word = "a" * 60 + "c"
    spec["model"]["vocab"] = {long_word if i == t["token_ids"][0] else w: i for w, i in spec["model"]["vocab"].items()}
    spec["pre_tokenizer"] = {"type": "Split", "pattern": backtracks, "behavior": "Isolated", "invert": False}
    spec["decoder"] = {"type": "Replace", "pattern": backtracks, "content": ""}
    (tmp_path / "tok" / "tokenizer.json").write_text(json.dumps(spec))
    root = write_log(tmp_path / "log", trajs)
    cmd = [
        sys.executable,
        "-m",
        "rollout_audit.cli",
        "show",
        str(root),
        t["trajectory_id"],
        "--tokenizer",
        str(tmp_path / "tok"),
    ]
    env = {**os.environ, "RUST_BACKTRACE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    assert str(tmp_path / "tok" / "tokenizer.json") in lines[0] and "backtracks" in lines[0], lines[0]
    assert "panicked" not in r.stderr and "Traceback" not in r.stderr


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MARK = re.compile(r"⟨([A-Z]\d{3})⟩")  # a finding's code as show prints it (the legend's ⟨CODE⟩ is not one)


def shown_codes(log, trajectory_id) -> set[str]:
    """The codes `show` prints for one trajectory: at tokens, at turns, and for the whole of it."""
    res = run("show", log, trajectory_id, "--no-color", "--width", 1000)
    assert res.exit_code == 0, res.output
    return set(MARK.findall(res.stdout))


def checked(log, *options: str) -> tuple[dict, int]:
    """`check --format json` (and `options`) on the log: its report, and its exit code."""
    import json

    res = run("check", log, "--format", "json", *options)
    return json.loads(res.stdout), res.exit_code


def per_trajectory(doc: dict) -> dict[str, set[str]]:
    """The codes a check report names on each trajectory."""
    per: dict[str, set[str]] = {}
    for f in doc["findings"]:
        if f["trajectory_id"] is not None:
            per.setdefault(f["trajectory_id"], set()).add(f["code"])
    return per


def assert_show_marks_what_check_reports(log, doc: dict, code: int) -> None:
    """On the trajectory of the log the check report `doc` names most codes on (on a clean log: its
    first), `show` prints exactly those codes; on a log check cannot read, show exits 2 too."""
    import rollout_audit as ra

    if code == 2 and doc["unusable"] is not None:
        assert run("show", log, "any").exit_code == 2
        return
    per = per_trajectory(doc)
    ids = ra.scan(log).trajectories.select("trajectory_id").collect()["trajectory_id"].to_list()
    present = [t for t in per if t in set(ids)]  # a finding may name a trajectory the log lacks (U605)
    tid = min(present, key=lambda t: (-len(per[t]), t)) if present else ids[0]
    assert shown_codes(log, tid) == per.get(tid, set()), (log, tid)


def test_show_on_a_trl_log_marks_what_check_reports(tmp_path):
    """A log as the TRL guard writes it: TRL does not record behaviour log-probs, and the file says so
    (rollout_log.not_recorded); `check` reports no S001 for it, and neither does `show`."""
    import numpy as np

    from rollout_audit.adapters.trl import records_from_batch

    tok = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 9, "name_or_path": "tiny", "chat_template": "{{ x }}"})
    batch = {
        "prompt_ids": np.array([[0, 5, 6], [7, 8, 6]]),
        "prompt_mask": np.array([[0, 1, 1], [1, 1, 1]]),
        "completion_ids": np.array([[11, 12, 40, 41, 13, 9], [21, 22, 23, 24, 25, 26]]),
        "completion_mask": np.ones((2, 6), dtype=np.int64),
        "tool_mask": np.array([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1]]),
        "advantages": np.array([0.5, -0.5]),
    }
    table = records_from_batch(batch, tokenizer=tok, policy_version=0, batch_id="gen00000", group_size=2,
                               rewards=[1.0, 0.0], temperature=0.7, top_p=1.0)  # fmt: skip
    assert "behavior_logprobs" not in table.column_names
    with RolloutWriter(tmp_path / "log" / "trajectories" / "gen00000.parquet", validate=False) as w:
        w.write(table)
    doc, code = checked(tmp_path / "log")
    per = per_trajectory(doc)
    assert code in (0, 1) and not any("S001" in codes for codes in per.values())
    for tid in ("gen00000/0", "gen00000/1"):
        assert shown_codes(tmp_path / "log", tid) == per.get(tid, set())


def test_an_unknown_id_is_refused_with_the_closest_ids_of_the_log():
    res = CliRunner().invoke(main, ["show", "fixtures/compliant", "s0-i0000-g00-e0x"])
    assert res.exit_code == 2
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("rollout-audit: error: trajectory 's0-i0000-g00-e0x' is not in the log; did you mean ")
    assert "'s0-i0000-g00-e0'" in line
    far = CliRunner().invoke(main, ["show", "fixtures/compliant", "zzz"])
    assert far.exit_code == 2 and "(128 trajectories, e.g. 's0-i0000-g00-e0')" in far.stderr
