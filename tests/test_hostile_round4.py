"""Hostile input, round 4: the trust boundary decided from the log's root on every path, keys a log
carries bounded to what a real trainer has, outputs that never reach an input, dumps read in full,
and no internal error or hang on the cases found by the attack. Through the CLI, as a user runs it."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import threading
import tracemalloc
from http.server import ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import tomllib
from hostilehelp import BigAnswer, assert_clean_exit, cli
from test_hostile import child

from rollout_audit import audit
from rollout_audit.contract import schema as S
from rollout_audit.contract.config import LOG_CONTEXT, load_config
from rollout_audit.contract.errors import ConfigError, UsageError
from rollout_audit.synth import make_log

ROOT = Path(__file__).resolve().parent.parent
BROKEN = ROOT / "fixtures" / "broken"
DUMPS = ROOT / "fixtures" / "frameworks"
CONTEXT = [f"--context={c}" for c in ("environment_id=doors", "environment_version=v1", "verifier_version=v1")]


def fixture(tmp_path: Path, name: str, config: str | None = None) -> Path:
    """A copy of the broken fixture `name`, with `config` as the `[tool.rollout-audit]` table of its
    own pyproject.toml (None: the fixture's own)."""
    out = tmp_path / name
    shutil.copytree(BROKEN / name, out)
    if config is not None:
        (out / "pyproject.toml").write_text(f"[tool.rollout-audit]\n{config}\n")
    return out


def codes(r) -> set[str]:
    return {f["code"] for f in json.loads(r.stdout)["findings"]}


# ---------------------------------------------------------------- 1. one trust rule, from the log's root


def _deeper(log: Path) -> Path:
    """The log's trajectory file moved into a sub-folder of trajectories/ (as a partitioned writer does)."""
    (log / "trajectories" / "step=0").mkdir()
    part = next((log / "trajectories").glob("*.parquet"))
    part.rename(log / "trajectories" / "step=0" / part.name)
    return log / "trajectories" / "step=0" / part.name


@pytest.mark.parametrize("how", ["root", "trajectories", "merge", "sub-folder file", "file uri"])
def test_a_log_config_that_weakens_the_audit_is_refused_whatever_path_names_the_log(tmp_path, how):
    log = fixture(tmp_path, "tool_tokens_trained", 'ignore = ["M"]')  # exit 1; obeyed, exit 0
    args = {
        "root": [log],
        "trajectories": [log / "trajectories"],
        "merge": ["--merge", log / "trajectories", log / "updates"],
        "sub-folder file": [_deeper(log) if how == "sub-folder file" else None],
        "file uri": [f"file://{log}"],
    }[how]
    r = cli("check", *map(str, args))
    assert r.returncode == 2 and "refused in a configuration inside the audited log" in r.stderr, r.stderr


def test_a_log_config_is_not_the_users_own_when_run_from_inside_the_log(tmp_path):
    """`cd LOG && check trajectories`: LOG/pyproject.toml came with the log, so its replay settings
    (a URL and a module the log names) are refused, and the module is never imported."""
    log = fixture(tmp_path, "policy_tokens_unmasked")
    (log / "evil_replayer.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').write('x')\n")
    (log / "pyproject.toml").write_text(
        '[tool.rollout-audit]\nreplay = 2\nreplayer = "evil_replayer:f"\n'
        'replay_endpoints = {"0" = "http://127.0.0.1:9/v1"}\n'
    )
    r = cli("check", "trajectories", cwd=log)
    assert r.returncode == 2 and "refused" in r.stderr and "replay" in r.stderr, r.stderr
    assert not (tmp_path / "imported").exists()


def test_the_users_project_config_above_the_log_still_sets_replay_keys_from_inside_the_log(tmp_path):
    project = tmp_path / "project"
    log = fixture(project, "policy_tokens_unmasked")
    (log / "pyproject.toml").unlink(missing_ok=True)
    (project / "pyproject.toml").write_text(
        '[tool.rollout-audit]\nreplay_endpoints = {"0" = "http://127.0.0.1:9/v1"}\n'
    )
    r = cli("check", "trajectories", "--show-settings", cwd=log)
    assert r.returncode == 0, r.stderr
    shown = tomllib.loads(r.stdout)["tool"]["rollout-audit"]
    assert shown["replay_endpoints"] == {"0": "http://127.0.0.1:9/v1"}


def test_a_file_uri_is_the_same_log_as_its_path_for_configuration(tmp_path):
    log = fixture(tmp_path, "budget_cut_logged_as_terminated")  # its own config states the response budget
    by_path = cli("check", str(log), "--format", "json", "--strict")
    by_uri = cli("check", f"file://{log}", "--format", "json", "--strict")
    assert by_path.returncode == by_uri.returncode == 1
    assert "T306" in codes(by_path) and codes(by_uri) == codes(by_path)


# ---------------------------------------------------------------- 2. a required column is required


def _drop(log: Path, kind: str, col: str, declared: dict[str, str]) -> None:
    f = next((log / kind).glob("*.parquet"))
    t = pq.read_table(f).drop_columns([col])
    meta = {**(t.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps(declared).encode()}
    pq.write_table(t.replace_schema_metadata(meta), f)


@pytest.mark.parametrize(
    "name,kind,col,declared",
    [
        ("loss_over_whole_transcript", "updates", "loss_denominator", {"loss_denominator": "x"}),
        ("tool_tokens_trained", "trajectories", "loss_mask", {"loss_mask": "x"}),
    ],
)
def test_not_recorded_cannot_waive_a_required_column(tmp_path, name, kind, col, declared):
    log = fixture(tmp_path, name)
    _drop(log, kind, col, declared)
    r = cli("check", str(log), "--format", "concise")
    assert r.returncode == 1 and col in r.stdout and "not waive it" in r.stdout, r.stdout


def test_the_contract_lists_what_may_be_waived_and_adapters_stay_within_it():
    from rollout_audit.adapters import openai, rllm, skyrl, slime, trl, verifiers, verl

    required = {*S.required("trajectories"), *S.required("updates"), *(f"turns.{c}" for c in S.required("turn"))}
    waivable = set(S.contract()["not_recorded_waivable"])
    for m in (trl, rllm, slime, openai, verifiers, verl, skyrl):
        for name in dir(m):
            lacks = getattr(m, name)
            if "LACKS" in name and isinstance(lacks, dict):
                said = {k.removeprefix("updates.") for k in lacks} & required
                assert said <= waivable, (m.__name__, name, said - waivable)
                declared = S.not_recorded({S.META_NOT_RECORDED: json.dumps(lacks).encode()}, S.waivable_names())
                assert declared.keys() == lacks.keys()
    # token_source may be declared not recorded (SkyRL and slime dumps without the engine calls carry no
    # provenance, which an adapter never derives from the mask under test): M101/M102 are then not run
    assert not waivable & {"loss_mask", "token_ids", "token_turn", "trajectory_id", "turns"}


def test_an_adapter_dump_still_audits_with_what_its_trainer_lacks(tmp_path):
    r = cli("check", "--from", "rllm", str(DUMPS / "rllm" / "compliant.jsonl"), *CONTEXT, "--context=reset_seed=0")
    assert r.returncode == 0, r.stdout + r.stderr


# as rLLM's adapter declares them: by column name, and as the checks name their inputs
NO_DENOMINATORS = {k: "not recorded here" for c in ("reduction", "loss_denominator") for k in (c, f"updates.{c}")}


def _user_says_no_denominators(tmp_path: Path) -> Path:
    mine = tmp_path / "mine.toml"
    mine.write_text("[tool.rollout-audit]\ndenominator_not_recorded = true\n")
    return mine


def test_a_log_cannot_waive_its_own_loss_denominators(tmp_path):
    """Update records that drop reduction and loss_denominator and declare both not recorded (what
    rLLM's converted updates say) are S005, as if undeclared, until the user says the trainer records
    neither: a log's own declaration or configuration would switch U601/U602 off on its own word."""
    log = tmp_path / "log"
    shutil.copytree(ROOT / "fixtures" / "compliant", log)
    for col in ("reduction", "loss_denominator"):
        _drop(log, "updates", col, NO_DENOMINATORS)
    r = cli("check", str(log), "--format", "concise")
    assert r.returncode == 1 and "S005" in r.stdout and "denominator_not_recorded = true" in r.stdout, r.stdout
    own = (log / "pyproject.toml").read_text()
    (log / "pyproject.toml").write_text(own + "denominator_not_recorded = true\n")
    r = cli("check", str(log))
    assert r.returncode == 2 and "denominator_not_recorded: refused" in r.stderr, r.stderr
    (log / "pyproject.toml").write_text(own)
    r = cli("check", str(log), "--config", str(_user_says_no_denominators(tmp_path)), "--format", "json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["findings"] == [], r.stdout[-600:]
    reasons = {n["code"]: n["reason"] for n in rep["not_run"]}
    assert reasons["U601"] == reasons["U602"] == "not recorded here"


@pytest.mark.parametrize("name", ["rllm", "verl"])
def test_the_adapter_of_a_conversion_vouches_for_what_its_trainer_does_not_record(tmp_path, name):
    """`check --from` audits a trainer that records no loss denominators clean (its adapter knows);
    the log `convert` writes does not carry that word: the user states it to audit the log alone."""
    src, ctx = str(DUMPS / name / "trainer_compliant.jsonl"), [*CONTEXT, "--context=reset_seed=0"]
    direct = cli("check", "--from", name, src, *ctx, "--format", "json")
    rep = json.loads(direct.stdout)
    assert direct.returncode == 0 and rep["findings"] == [], direct.stdout[-600:]
    assert {"U601", "U602"} <= {n["code"] for n in rep["not_run"]}
    out = tmp_path / "conv"
    conv = cli("convert", "--from", name, src, str(out), *ctx)
    assert conv.returncode == 0 and "denominator_not_recorded = true" in conv.stderr, conv.stderr
    assert cli("check", str(out)).returncode == 1
    mine = _user_says_no_denominators(tmp_path)
    said = re.findall(r"not_recorded = \[[^]]*\]", conv.stderr)  # the other columns the adapter vouched for
    mine.write_text(mine.read_text() + "".join(f"{x}\n" for x in said))
    after = cli("check", str(out), "--config", str(mine), "--format", "json")
    assert after.returncode == 0 and json.loads(after.stdout)["not_run"] == rep["not_run"], after.stdout[-600:]


# ---------------------------------------------------------------- 3. keys a log may carry, bounded

# Each key a log's own configuration may carry, at extreme values, on the broken fixture whose fault it
# could hide: an extreme value must never turn the fixture's failing audit into a pass (exit 0).
# (fixture, key, TOML value, extra lines)
EXTREMES = [
    ("truncation_paid_as_success", "truncation_penalty", "1e9", 'truncation = "penalize"'),
    ("truncation_paid_as_success", "truncation_penalty", "1.0", 'truncation = "penalize"'),
    ("truncation_paid_as_success", "truncation_penalty", "1e308", 'truncation = "penalize"'),
    ("truncation_paid_as_success", "truncation_penalty", "-1e9", 'truncation = "penalize"'),
    ("truncation_paid_as_success", "truncation", '"exclude"', ""),
    ("truncation_paid_as_success", "truncation", '"bootstrap"', ""),  # T308: an outcome paid at the cut
    ("first_visit_paid_twice", "first_visit_components", "[]", ""),
    ("first_visit_paid_twice", "first_visit_components", '["not_a_component"]', ""),
    ("budget_cut_logged_as_terminated", "max_response_tokens", "1048577", ""),
    ("budget_cut_logged_as_terminated", "max_response_tokens", "9223372036854775807", ""),
    ("stale_batch_beyond_lag", "max_policy_lag", "1025", ""),
    ("stale_batch_beyond_lag", "max_policy_lag", "1000000000", ""),
    ("advantages_population_std", "grpo_epsilon", "1e9", ""),
    ("advantages_population_std", "grpo_epsilon", "0.5", ""),
    ("stop_reason_contradicts_flag", "extra_stop_reasons", '{ failure = "terminated" }', ""),
    ("stop_reason_contradicts_flag", "extra_stop_reasons", '{ max_turns = "terminated" }', ""),
    ("policy_tokens_unmasked", "masked_ok_reasons", '["anything"]', ""),
    ("policy_tokens_unmasked", "compare_logprobs", '"behavior_logprobs"', ""),
    ("progress_bonus_not_potential", "reward_rule", '"binary"', ""),
    ("policy_tokens_unmasked", "max_examples", "0", ""),
    ("policy_tokens_unmasked", "atol", "inf", ""),
    ("overlong_penalty_counts_tool_tokens", "overlong_buffer", "1", ""),
    ("overlong_penalty_counts_tool_tokens", "overlong_buffer", "1000000000", ""),
    ("overlong_penalty_counts_tool_tokens", "overlong_penalty_factor", "0.0", ""),
    ("overlong_penalty_counts_tool_tokens", "overlong_penalty_factor", "1e300", ""),
    ("policy_tokens_unmasked", "trainer_temperature", "0.0", ""),  # at most adds L212, another fault
    ("policy_tokens_unmasked", "trainer_temperature", "1e300", ""),
]


def test_the_extremes_cover_every_key_a_log_may_carry():
    keys = {(c.values if hasattr(c, "values") else c)[1] for c in EXTREMES}
    assert keys >= set(LOG_CONTEXT)


def _id(case) -> str:
    _, k, v, _ = case.values if hasattr(case, "values") else case
    return f"{k}={v}"


@pytest.mark.parametrize("name,key,value,extra", EXTREMES, ids=[_id(c) for c in EXTREMES])
def test_an_extreme_value_in_a_log_config_never_passes_a_broken_log(tmp_path, name, key, value, extra):
    log = fixture(tmp_path, name)
    own = (log / "pyproject.toml").read_text() if (log / "pyproject.toml").exists() else "[tool.rollout-audit]\n"
    kept = [x for x in own.splitlines()[1:] if not x.startswith((key, "truncation ="))]
    (log / "pyproject.toml").write_text("\n".join(["[tool.rollout-audit]", *kept, extra, f"{key} = {value}", ""]))
    assert cli("check", str(BROKEN / name), "--strict").returncode == 1  # the fixture fails as shipped
    r = cli("check", str(log), "--strict")
    assert_clean_exit(r)
    assert r.returncode != 0, (key, value, r.stdout[-600:])


def test_first_visit_components_inside_the_log_adds_to_the_file_metadata(tmp_path):
    log = fixture(tmp_path, "first_visit_paid_twice", "first_visit_components = []")
    r = cli("check", str(log), "--format", "json")
    assert r.returncode == 1 and "R408" in codes(r)
    # the user's own configuration still decides
    user = tmp_path / "mine.toml"
    user.write_text("[tool.rollout-audit]\nfirst_visit_components = []\n")
    r = cli("check", str(log), "--config", str(user), "--format", "json")
    assert "R408" not in codes(r)


@pytest.mark.parametrize(
    "line", ["atol = inf", "rtol = nan", "logprob_atol = inf", "replay_atol = nan", "overlong_penalty_factor = inf"]
)
def test_a_non_finite_tolerance_is_refused(tmp_path, line):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[tool.rollout-audit]\n{line}\n")
    r = cli("check", str(BROKEN / "policy_tokens_unmasked"), "--config", str(cfg))
    assert r.returncode == 2 and line.split()[0] in r.stderr and "finite" in r.stderr, r.stderr
    with pytest.raises(ConfigError, match="finite"):
        load_config(cfg)


def test_a_nan_temperature_is_s001_as_infinity_is():
    trajs = make_log(n_tasks=2, group_size=2, n_versions=1, seed=3)[0]
    trajs = [dict(t, turns=[dict(x) for x in t["turns"]]) for t in trajs]
    trajs[1]["turns"][0]["temperature"] = float("nan")
    s001 = audit(trajs).findings.filter(pl.col("code") == "S001")
    assert trajs[1]["trajectory_id"] in s001["trajectory_id"].to_list()
    assert any("temperature" in m for m in s001["message"].to_list())


# ---------------------------------------------------------------- 4. outputs never reach inputs


def _steps(tmp_path: Path) -> Path:
    d = tmp_path / "watched"
    shutil.copytree(BROKEN / "policy_tokens_unmasked" / "trajectories", d)
    return d


def _digest(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("opt", ["--status", "--metrics"])
def test_watch_never_writes_onto_a_step(tmp_path, opt):
    d = _steps(tmp_path)
    step = next(d.glob("*.parquet"))
    link = tmp_path / "linked.jsonl"
    os.link(step, link)
    before = _digest(d)
    for target in (step, link):
        r = cli("watch", str(d), opt, str(target), "--interval", "0.01", "--max-steps", "1", "--idle", "1")
        assert r.returncode == 2 and "audited" in r.stderr, r.stderr
    assert _digest(d) == before


def test_write_baseline_through_a_link_to_another_file_of_the_log_is_refused(tmp_path):
    log = fixture(tmp_path, "policy_tokens_unmasked")
    other = log / "updates" / "updates.parquet"
    link = tmp_path / "baseline.json"
    os.link(other, link)
    before = _digest(log)
    r = cli("check", str(log / "trajectories" / "part-0000.parquet"), "--write-baseline", str(link))
    assert r.returncode == 2 and "hard link" in r.stderr, r.stderr
    assert _digest(log) == before


@pytest.mark.parametrize("out", ["LOG/filtered", ""])
def test_filter_never_writes_into_the_log_or_the_working_directory(tmp_path, out):
    log = fixture(tmp_path, "policy_tokens_unmasked")
    target = out.replace("LOG", str(log))
    before = _digest(log)
    r = cli("filter", str(log / "trajectories" / "part-0000.parquet"), target, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert _digest(log) == before and sorted(p.name for p in tmp_path.iterdir()) == [log.name]


@pytest.mark.parametrize(
    "args",
    [
        ["check", "LOG", "--write-baseline", "FIFO"],
        ["check", "LOG", "-o", "FIFO"],
        ["watch", "STEPS", "--metrics", "FIFO", "--interval", "0.01", "--max-steps", "1", "--idle", "1"],
        ["watch", "STEPS", "--status", "FIFO", "--interval", "0.01", "--max-steps", "1", "--idle", "1"],
    ],
)
def test_an_output_that_is_a_fifo_is_refused_not_blocked_on(tmp_path, args):
    log = fixture(tmp_path, "policy_tokens_unmasked")
    steps = _steps(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    swap = {"LOG": str(log), "STEPS": str(steps), "FIFO": str(fifo)}
    r = child(*[swap.get(a, a) for a in args], timeout=60)
    assert r.returncode == 2 and "FIFO" in r.stderr, (r.returncode, r.stderr)


def test_a_directory_output_appears_whole_or_not_at_all(tmp_path):
    from rollout_audit.reporting.outputs import atomic_directory

    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_directory(out) as tmp:
        (tmp / "trajectories").mkdir()
        (tmp / "trajectories" / "part-0000.parquet").write_bytes(b"half")
        raise RuntimeError("killed part-way")
    assert list(tmp_path.iterdir()) == []
    with atomic_directory(out) as tmp:
        (tmp / "a").write_text("x")
    assert [p.name for p in out.iterdir()] == ["a"] and [p.name for p in tmp_path.iterdir()] == ["out"]
    with pytest.raises(UsageError), atomic_directory(out):
        pass  # not empty: never written into


def test_convert_and_faults_apply_write_their_directory_whole(tmp_path):
    out = tmp_path / "conv"
    r = cli("convert", "--from", "rllm", str(DUMPS / "rllm" / "compliant.jsonl"), str(out), *CONTEXT)
    assert r.returncode == 0 and (out / "trajectories" / "part-0000.parquet").exists(), r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["conv"]  # no temporary left beside it
    dst = tmp_path / "broken"
    r = cli("faults", "apply", "tool_tokens_trained", str(ROOT / "fixtures" / "compliant"), str(dst))
    assert r.returncode == 0 and (dst / "trajectories").is_dir(), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "conv"]


# ---------------------------------------------------------------- 5. dumps read in full, or not silently


def test_a_dump_directory_is_read_in_full_and_the_summary_counts_the_files(tmp_path):
    d = tmp_path / "dump"
    (d / "rank1").mkdir(parents=True)
    lines = (DUMPS / "verl" / "compliant.jsonl").read_text().splitlines()
    half = len(lines) // 2
    (d / "step_1.jsonl").write_text("\n".join(lines[:half]) + "\n")
    with gzip.open(d / "step_2.JSONL.GZ", "wt") as fh:
        fh.write("\n".join(lines[half:]) + "\n")
    (d / "rank1" / "step_1.Jsonl").write_text("")  # an empty rank file still counts as read
    (d / "notes.txt").write_text("not a dump")
    r = cli("check", "--from", "verl", str(d), *CONTEXT, "--context=reset_seed=0", "--format", "json")
    whole = cli("check", "--from", "verl", str(DUMPS / "verl" / "compliant.jsonl"), *CONTEXT, "--context=reset_seed=0")
    summary = json.loads(r.stdout)["summary"]
    assert summary["dump_files"] == 3 and summary["dump_files_not_read"] == [str(d / "notes.txt")]
    assert "notes.txt: not a dump file" in r.stderr
    assert r.returncode == whole.returncode and summary["rows_read"] == len(lines)
    text = cli("check", "--from", "verl", str(d), *CONTEXT, "--context=reset_seed=0")
    assert "read from 3 dump files (1 other files not read)" in text.stdout


@pytest.mark.parametrize("name", ["step_2.jsonl.zst", "step_3.jsonl.1", "rank0/step.parquet.bz2"])
def test_a_dump_in_a_form_not_read_is_named_exit_2(tmp_path, name):
    d = tmp_path / "dump"
    d.mkdir()
    shutil.copy(DUMPS / "verl" / "compliant.jsonl", d / "step_1.jsonl")
    (d / name).parent.mkdir(exist_ok=True)
    (d / name).write_bytes(b"\x28\xb5\x2f\xfd")
    r = cli("check", "--from", "verl", str(d), *CONTEXT)
    assert r.returncode == 2 and name.split("/")[-1] in r.stderr and "not read" in r.stderr, r.stderr


def test_a_compressed_dump_is_bounded_as_a_plain_one(tmp_path, monkeypatch):
    import rollout_audit.adapters.base as base

    monkeypatch.setattr(base, "MAX_DUMP_BYTES", 1000)
    with gzip.open(tmp_path / "bomb.jsonl.gz", "wt") as fh:
        fh.write(("{}\n") * 10_000)
    with pytest.raises(Exception, match="decompresses to more than 1000 bytes"):
        base.read_dump(tmp_path / "bomb.jsonl.gz")


# ---------------------------------------------------------------- 6. internal errors and hangs


def test_a_baseline_whose_findings_is_an_object_is_one_line(tmp_path):
    log = fixture(tmp_path, "policy_tokens_unmasked")
    base = tmp_path / "b.json"
    assert cli("check", str(log), "--write-baseline", str(base)).returncode == 0
    doc = json.loads(base.read_text())
    doc["findings"] = {"code": "M101"}
    base.write_text(json.dumps(doc))
    r = cli("check", str(log), "--baseline", str(base))
    assert r.returncode == 2 and "findings: expected a list" in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize("uri", ["gs:///x", "gs://bucket/x?y=1", "GS:///x"])
def test_a_malformed_object_store_uri_is_one_line(uri):
    r = cli("check", uri)
    assert r.returncode == 2 and "internal error" not in r.stderr and "not a usable object-store URI" in r.stderr


@pytest.mark.parametrize("cmd", ["stats", "diff", "show"])
def test_statistics_of_a_log_without_a_required_column_are_not_an_internal_error(tmp_path, cmd):
    log = fixture(tmp_path, "policy_tokens_unmasked")
    _drop(log, "trajectories", "loss_mask", {})
    tid = pq.read_table(next((log / "trajectories").glob("*.parquet")), columns=["trajectory_id"])[0][0].as_py()
    args = {"stats": [log], "diff": [log, log], "show": [log, tid]}[cmd]
    r = cli(cmd, *map(str, args))
    assert_clean_exit(r)
    assert "internal error" not in r.stderr and r.returncode in (0, 1), r.stderr


def test_a_file_name_that_is_not_utf8_is_s005_and_the_rest_is_audited(tmp_path):
    log = fixture(tmp_path, "tool_tokens_trained")
    part = log / "trajectories" / "part-0000.parquet"
    shutil.copy(part, os.fsdecode(os.fsencode(str(log / "trajectories")) + b"/b\xfe.parquet"))
    for fmt in ("text", "json", "junit", "github"):
        r = cli("check", str(log), "--format", fmt)
        assert r.returncode == 1 and "UnicodeEncodeError" not in r.stdout + r.stderr, r.stdout[-800:]
        assert "xfe.parquet" in r.stdout and "not UTF-8" in r.stdout
    r = cli("stats", str(log))
    assert r.returncode == 0 and "not UTF-8" in r.stderr


def test_a_replay_answer_just_under_the_cap_costs_about_twice_its_size():
    from rollout_audit.replay.http import HTTPReplayer

    size = 8 << 20
    BigAnswer.body = json.dumps({"x": "a" * (size - 10)}).encode()
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
    assert len(got["x"]) == size - 10
    assert peak < 2.5 * len(BigAnswer.body), peak / len(
        BigAnswer.body
    )  # the answer's bytes, its text, the parsed value
