"""Hostile input, round 5: a log on disk cannot waive a required column on its own word
(`rollout_log.not_recorded`); only the user's configuration (`not_recorded`) or an adapter's
in-memory conversion is believed. Through the CLI, as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hostilehelp import cli

from rollout_audit.contract import schema as S

ROOT = Path(__file__).resolve().parent.parent
BROKEN = ROOT / "fixtures" / "broken"


def _waive_itself(log: Path, col: str) -> None:
    """Every trajectory file of `log` without `col`, declaring it not recorded in its own metadata."""
    for f in (log / "trajectories").glob("*.parquet"):
        t = pq.read_table(f).drop_columns([col])
        meta = {**(t.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps({col: "not recorded here"}).encode()}
        pq.write_table(t.replace_schema_metadata(meta), f)


@pytest.mark.parametrize(
    "name,col",
    [("positive_logprob", "behavior_logprobs"), ("stop_reason_contradicts_flag", "stop_reason")],
)
def test_a_log_cannot_waive_its_own_required_column(tmp_path, name, col):
    """The broken fixture with the column its finding reads dropped and declared not recorded: S001
    naming the column and the setting, until the user's own configuration says so."""
    log = tmp_path / name
    shutil.copytree(BROKEN / name, log)
    _waive_itself(log, col)
    r = cli("check", str(log), "--format", "concise")
    assert r.returncode == 1 and f"{col}: required column missing" in r.stdout, r.stdout
    assert f'not_recorded = ["{col}"]' in r.stdout, r.stdout
    own = (log / "pyproject.toml").read_text() if (log / "pyproject.toml").exists() else "[tool.rollout-audit]\n"
    (log / "pyproject.toml").write_text(own + f'not_recorded = ["{col}"]\n')
    r = cli("check", str(log))
    assert r.returncode == 2 and "not_recorded: refused" in r.stderr, r.stderr  # a log's own config cannot either
    (log / "pyproject.toml").write_text(own)
    mine = tmp_path / "mine.toml"
    mine.write_text(f'[tool.rollout-audit]\nnot_recorded = ["{col}"]\n')
    r = cli("check", str(log), "--config", str(mine), "--format", "json")
    rep = json.loads(r.stdout)
    assert "S001" not in {f["code"] for f in rep["findings"]}, r.stdout[-800:]
    assert "not recorded here" in {n["reason"] for n in rep["not_run"]}


def test_the_user_cannot_waive_what_the_contract_requires_of_everyone(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('[tool.rollout-audit]\nnot_recorded = ["loss_mask"]\n')
    r = cli("check", str(ROOT / "fixtures" / "compliant"), "--config", str(mine))
    assert r.returncode == 2 and "'loss_mask' cannot be left out" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_l207_names_the_same_turn_in_every_run_when_ratios_are_nan(tmp_path):
    """A second log-prob column of NaN for one trajectory: every turn of it is beyond the bound
    (NaN is no ratio), and the finding names its first turn, whatever order the turns were summed in."""
    import numpy as np
    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    import rollout_audit as ra
    from rollout_audit.contract.config import Config

    src = sorted(Path("fixtures/compliant/trajectories").glob("*.parquet"))[0]
    table = pq.read_table(src)
    lp = table.column("behavior_logprobs").combine_chunks()
    lengths = pc.list_value_length(lp).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(lp).to_numpy(zero_copy_only=False).astype(np.float64)
    owner = np.repeat(np.arange(table.num_rows), lengths)
    flat = np.where((owner == 3) & ~np.isnan(flat), np.nan, flat)  # NaN values, not nulls
    other = pa.ListArray.from_arrays(lp.offsets, pa.array(flat, pa.float32(), from_pandas=False))
    (tmp_path / "trajectories").mkdir()
    pq.write_table(table.append_column("old_logprobs", other), tmp_path / "trajectories" / "p.parquet")
    turns = set()
    for workers in (1, 2, 1):
        rep = ra.audit(str(tmp_path), config=Config(compare_logprobs="old_logprobs"), select=["L207"], workers=workers)
        found = rep.findings.filter(pl.col("code") == "L207")
        assert found["trajectory_id"].to_list() == [table.column("trajectory_id")[3].as_py()], rep.render()
        turns.add(found["turn"][0])
    assert len(turns) == 1


# ---------------------------------------------------------------- a dump folder's own truncation penalty

SKYRL = ROOT / "fixtures" / "frameworks" / "skyrl" / "compliant.jsonl"
SKYRL_CONTEXT = {"environment_version": "1", "verifier_version": "1", "reset_seed": "0"}
CONTEXT_ARGS = [a for k, v in SKYRL_CONTEXT.items() for a in ("--context", f"{k}={v}")]


def _skyrl_dump(tmp_path: Path, cut: set[int], penalty: str | None) -> Path:
    """The compliant SkyRL dump in a folder of its own, with the episodes at `cut` stopped by the
    generation limit (they keep the environment's reward, SkyRL's default), and a pyproject.toml
    beside it that states `truncation = "penalize"` and, when given, the penalty."""
    d = tmp_path / "dump"
    d.mkdir()
    rows = [json.loads(line) for line in SKYRL.read_text().splitlines()]
    for i in cut:
        rows[i]["stop_reasons"] = "length"
    (d / "dump.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    own = '[tool.rollout-audit]\ntruncation = "penalize"\n'
    (d / "pyproject.toml").write_text(own + ("" if penalty is None else f"truncation_penalty = {penalty}\n"))
    return d


def _one_line(r, *words: str) -> None:
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert all(w in errors[0] for w in words), errors[0]


@pytest.mark.parametrize("penalty", ["1e9", "1.0", "1e308"])
def test_a_dump_folder_cannot_set_a_penalty_that_pays_a_cut_episode(tmp_path, penalty):
    """Episode 1 (reward 1.0) cut at the generation limit: T307 under the folder's penalty 0.0; a
    penalty the folder sets at or beyond the best reward of the uncut episodes is refused in one
    line naming the file and the key, through `check --from` and `audit(framework=)`."""
    import rollout_audit as ra
    from rollout_audit.contract.errors import ConfigError

    d = _skyrl_dump(tmp_path, {1}, "0.0")
    r = cli("check", "--from", "skyrl", str(d), *CONTEXT_ARGS, "--format", "concise")
    assert r.returncode == 1 and "T307" in r.stdout, r.stdout + r.stderr
    (d / "pyproject.toml").write_text(
        f'[tool.rollout-audit]\ntruncation = "penalize"\ntruncation_penalty = {penalty}\n'
    )
    r = cli("check", "--from", "skyrl", str(d), *CONTEXT_ARGS)
    _one_line(r, "pyproject.toml", "truncation_penalty", "lies outside the rewards")
    with pytest.raises(ConfigError, match="pyproject.toml: truncation_penalty = .* lies outside"):
        ra.audit(str(d), framework="skyrl", context=SKYRL_CONTEXT)


def test_the_users_own_penalty_is_believed_for_a_dump(tmp_path):
    """The same penalty in the user's --config is their trainer's word: the cut episode is paid
    what their trainer pays, T307 is silent."""
    d = _skyrl_dump(tmp_path, {1}, None)
    mine = tmp_path / "mine.toml"
    mine.write_text('[tool.rollout-audit]\ntruncation = "penalize"\ntruncation_penalty = 1.0\n')
    r = cli("check", "--from", "skyrl", str(d), *CONTEXT_ARGS, "--config", str(mine), "--format", "json")
    assert r.returncode == 0, r.stdout[-800:] + r.stderr
    assert "T307" not in {f["code"] for f in json.loads(r.stdout)["findings"]}


def test_a_compliant_dump_with_a_reasonable_penalty_audits_clean(tmp_path):
    """Episode 0 (reward 0.0) cut and paid the folder's penalty 0.0, within the uncut rewards: the
    penalty is believed, T307 runs, compares the cut episode, and holds."""
    d = _skyrl_dump(tmp_path, {0}, "0.0")
    r = cli("check", "--from", "skyrl", str(d), *CONTEXT_ARGS, "--format", "json")
    assert r.returncode == 0, r.stdout[-800:] + r.stderr
    rep = json.loads(r.stdout)
    assert rep["findings"] == [] and "T307" in rep["summary"]["checks_run"], r.stdout[-800:]
    assert rep["summary"]["statistics"]["T307"]["truncated_rewarded"] == 1


@pytest.mark.parametrize("convert_first", [False, True])
def test_a_log_whose_episodes_were_all_cut_cannot_state_its_penalty(tmp_path, convert_first):
    """Every episode cut: no reward of an uncut episode bounds the penalty, so the log's own is not
    believed (exit 2, one line naming file and key), as a dump and as the contract log `convert`
    wrote of it; the user's --config still sets it."""
    d = _skyrl_dump(tmp_path, {0, 1, 2, 3}, "1e9")
    if convert_first:
        log = tmp_path / "log"
        r = cli("convert", "--from", "skyrl", str(d / "dump.jsonl"), str(log), *CONTEXT_ARGS)
        assert r.returncode == 0, r.stderr
        shutil.copy(d / "pyproject.toml", log / "pyproject.toml")
        args = ["check", str(log)]
    else:
        args = ["check", "--from", "skyrl", str(d), *CONTEXT_ARGS]
    r = cli(*args)
    _one_line(r, "pyproject.toml", "truncation_penalty", "were all truncated")
    mine = tmp_path / "mine.toml"
    mine.write_text('[tool.rollout-audit]\ntruncation = "penalize"\ntruncation_penalty = 0.0\n')
    r = cli(*args, "--config", str(mine), "--format", "concise")
    assert r.returncode == 1 and "T307" in r.stdout, r.stdout + r.stderr  # the two paid 1.0 exceed the user's 0


# ------------------------------------------------------------------ every command reads under check's caps

BOMB_TOKENS = 20_000_000  # one trajectory: about 1 GB once decoded, about 130 KB on disk
# address space of the command: `check`'s audit of the bomb fits in it; decoding the bomb does not
# (`report` and `show` aborted under it before they read under the caps)
ADDRESS_SPACE = 4 << 30


@pytest.fixture(scope="module")
def bomb_log(tmp_path_factory) -> Path:
    """A small log with a compression bomb beside it: a file whose one row group holds a trajectory
    over `max_tokens_per_trajectory`."""
    import random

    from fuzzlib import _bomb

    from rollout_audit.faults import write_records
    from rollout_audit.synth import make_log

    root = tmp_path_factory.mktemp("bomb") / "log"
    records = make_log(n_tasks=2, group_size=2, n_versions=1, seed=3)
    write_records(root, *records)
    _bomb(root, records, random.Random(0), n=BOMB_TOKENS)
    return root


def _bounded(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`rollout-audit ARGS` in a child process whose address space is capped at ADDRESS_SPACE."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    # the address space a process reserves grows with its threads (stacks, malloc arenas): pinned,
    # so that the cap means the same on a machine of any size
    env = {**os.environ, "POLARS_MAX_THREADS": "2", "MALLOC_ARENA_MAX": "2"}
    cmd = [sys.executable, "-m", "rollout_audit.cli", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, preexec_fn=cap, timeout=300)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS bounds the address space on Linux only")
@pytest.mark.slow  # a 20M-token bomb under a capped child process per command, about 8 s each
@pytest.mark.parametrize(
    "command",
    [["stats"], ["show", "bomb"], ["report", "-o", "page.html"], ["diff", str(ROOT / "fixtures" / "compliant")]],
)
def test_a_command_that_reads_every_row_refuses_a_bomb_in_one_line(bomb_log, tmp_path, command):
    """`stats`, `show`, `report` and `diff` read every row of a log: on a row group the audit does not read
    they stop before decoding it, in one line naming the file and the cap, exit 2, within bounded
    memory (they decoded it whole, and `report` and `show` aborted, before)."""
    bomb = bomb_log / "trajectories" / "z-bomb.parquet"
    assert bomb.stat().st_size < 300_000
    r = _bounded([command[0], str(bomb_log), *command[1:]], tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr[-2000:]
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"rollout-audit: error: {bomb}: row 0 (trajectory bomb): 20,000,000 tokens"), line
    assert "above max_tokens_per_trajectory (8,000,000)" in line and f"`{command[0]}` reads every row" in line
    assert not (tmp_path / "page.html").exists()  # no page that would pass off the log's statistics as whole


def test_a_vllm_replay_answer_is_parsed_within_a_bounded_multiple_of_its_size():
    """vLLM's prompt_logprobs (an entry {"logprob", "rank", "decoded_token"} per token id per position)
    parsed into a dict per entry cost 5x its bytes; each distribution is parsed into two arrays now."""
    import threading
    import tracemalloc
    from http.server import ThreadingHTTPServer

    from hostilehelp import BigAnswer

    from rollout_audit.replay.http import HTTPReplayer

    vocab, positions = 2000, 20
    dist = {str(k): {"logprob": -1.0 - k / vocab, "rank": k + 1, "decoded_token": "ab"} for k in range(vocab)}
    BigAnswer.body = json.dumps({"choices": [{"index": 0, "prompt_logprobs": [None] + [dist] * positions}]}).encode()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), BigAnswer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        rep = HTTPReplayer({}, max_bytes=len(BigAnswer.body) + 1)
        tracemalloc.start()
        got = rep._fetch(f"http://127.0.0.1:{srv.server_port}/")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        srv.shutdown()
    first = got["choices"][0]["prompt_logprobs"][1]
    assert first.ids.tolist() == list(range(vocab)) and first.logprobs[0] == -1.0
    assert peak < 2.5 * len(BigAnswer.body), peak / len(
        BigAnswer.body
    )  # the answer's bytes, its text, two arrays a position


@pytest.mark.parametrize("target", ["empty folder", "dangling", "folder with a file"])
def test_convert_never_writes_through_a_link(tmp_path, target):
    """DST a symlink (to an empty folder, to nothing, to a folder with a file): one line naming DST, exit
    2, and nothing written where the link points (a bare "[Errno 20] Not a directory" before)."""
    where = tmp_path / "elsewhere"
    if target != "dangling":
        where.mkdir()
    if target == "folder with a file":
        (where / "keep.txt").write_text("x")
    link = tmp_path / "dst"
    link.symlink_to(where)
    src = ROOT / "fixtures" / "frameworks" / "openai" / "compliant.jsonl"
    r = cli("convert", "--from", "openai", str(src), str(link))
    assert r.returncode == 2 and f"{link}: is a" in r.stderr and "symlink" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Errno" not in r.stderr and "Traceback" not in r.stderr
    assert (
        link.is_symlink()
        and sorted(p.name for p in where.iterdir()) == (["keep.txt"] if target == "folder with a file" else [])
        if where.exists()
        else not where.exists()
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no hidden temp directory left


def test_a_dump_named_like_a_replacement_template_is_named_as_it_is(tmp_path):
    """`$1`, `${0}` and `\\1` in the dump's path are the path, never expanded as a regex replacement
    when the temporary log's files named in a message are relabelled to the dump."""
    import polars as pl

    from rollout_audit.adapters.convert import convert
    from rollout_audit.contract.config import Config
    from rollout_audit.reading.read import MEMORY
    from rollout_audit.running.engine import run_audit
    from rollout_audit.session.dumps import in_memory, relabel

    where = tmp_path / "a$1b${0}c\\1d"
    where.mkdir()
    dump = where / "compliant.jsonl"
    shutil.copy(ROOT / "fixtures" / "frameworks" / "openai" / "compliant.jsonl", dump)
    r = cli("check", "--from", "openai", str(dump), "--format", "json")
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    files = {f["file"] for f in json.loads(r.stdout)["findings"]}
    assert files == {str(dump)}, files  # E801: the dump records no identities, named literally
    conv = convert("openai", [str(dump)], {})
    rep = run_audit(in_memory(conv), Config())
    said = pl.DataFrame({"code": ["S005"], "file": [MEMORY], "message": [f"see {MEMORY}, here"]})
    rep.findings = pl.concat([rep.findings, said], how="diagonal_relaxed")
    out = relabel(rep, conv)
    assert f"see {dump}, here" in out.findings["message"].to_list(), out.findings["message"].to_list()


def test_a_killed_writers_staging_directory_is_reported_not_read_as_data(tmp_path):
    """`convert` killed inside `atomic_directory` leaves a hidden `.DST.XXXXXXXX.tmp/` holding a whole
    log: `check` of the folder around it audited it as one more run (every trajectory twice) where
    `watch` and pyarrow's own dataset discovery skip hidden entries. It is one line naming it now,
    and the verdict covers the run that was read; inside a log, the same directory is S005."""
    import signal

    runs = tmp_path / "runs"
    shutil.copytree(ROOT / "fixtures" / "compliant", runs / "log")
    script = (
        "import os, shutil, signal, sys\n"
        "from rollout_audit.reporting.outputs import atomic_directory\n"
        "with atomic_directory(sys.argv[1]) as tmp:\n"
        "    shutil.copytree(sys.argv[2], tmp, dirs_exist_ok=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, "-c", script, str(runs / "dst"), str(runs / "log")], env=env)
    assert killed.returncode == -signal.SIGKILL
    (left,) = [p for p in runs.iterdir() if p.name.startswith(".dst.")]
    assert (left / "trajectories").is_dir()  # a whole log, hidden
    alone = json.loads(cli("check", str(runs / "log"), "--format", "json").stdout)["summary"]
    r = cli("check", str(runs), "--format", "json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"{left}: temporary directory of an unfinished write" in r.stderr, r.stderr
    assert json.loads(r.stdout)["summary"]["rows_read"] == alone["rows_read"]
    shutil.move(str(left), runs / "log" / left.name)  # inside the log: its own files, unfinished
    r = cli("check", str(runs / "log"), "--format", "json")
    rep = json.loads(r.stdout)
    assert r.returncode == 1 and [(f["code"], f["file"]) for f in rep["findings"]] == [
        ("S005", str(runs / "log" / left.name))
    ], rep["findings"]
    assert rep["summary"]["rows_read"] == alone["rows_read"]


def test_a_token_id_past_the_declared_vocabulary_is_s001_naming_row_and_position(tmp_path):
    """A file that declares its tokenizer's vocabulary (rollout_log.tokenizer) and holds an id at or
    past its size: S001 naming the trajectory, the first such position and id; a vocabulary that
    covers every id stays silent, and the user's own vocabulary_size is what counts when set."""
    from rollout_audit import RolloutWriter
    from rollout_audit.synth import make_log

    trajs, _ = make_log(n_tasks=2, group_size=2, n_versions=1)
    top = max(max(t["token_ids"]) for t in trajs)
    holding = sum(top in t["token_ids"] for t in trajs)
    for size, expect in ((top + 1, 0), (top, holding)):
        log = tmp_path / f"v{size}"
        w = RolloutWriter(log / "trajectories" / "p.parquet", tokenizer={"name": "t", "vocabulary": ["w"] * size})
        w.write(trajs)
        w.close()
        r = cli("check", str(log), "--select", "S001", "--format", "json")
        found = [f for f in json.loads(r.stdout)["findings"] if "vocabulary_size" in f["message"]]
        assert len(found) == expect, found
    hit = found[0]
    row = next(t for t in trajs if t["trajectory_id"] == hit["trajectory_id"])
    assert row["token_ids"][hit["position"]] == top and row["token_ids"].index(top) == hit["position"]
    assert f"past the tokenizer's {top} ids" in hit["message"] and f"(first: {top})" in hit["message"]
    mine = tmp_path / "mine.toml"
    mine.write_text(f"[tool.rollout-audit]\nvocabulary_size = {top + 1}\n")  # the user knows better
    r = cli("check", str(tmp_path / f"v{top}"), "--select", "S001", "--config", str(mine), "--format", "json")
    assert not [f for f in json.loads(r.stdout)["findings"] if "vocabulary_size" in f["message"]]
