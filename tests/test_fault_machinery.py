"""The machinery a fault is written with, as docs/writing-checks.md describes it.

- `insert_tokens` (policy or not, at the start, inside a turn, before a later turn's context, at
  the end) leaves every per-token list aligned with token_ids, the nucleus offsets one longer,
  each turn's counts, log-prob sum, sampled ids and contexts true, and the updates' counts right,
  so that a compliant log stays compliant; `drop_token` undoes it.
- A fault's `config` is how the run was produced, carried inside its log: only keys a log may
  carry are accepted. What the user alone states is its `user_config`: a file beside the broken
  fixture's log, named in the manifest, that `check --config` applies and that the log itself
  can never state.
- A fault that finds no target is one line naming the fault and the log, exit 2, from
  `python -m rollout_audit.dev generate` and from `rollout-audit faults apply`/`matrix`, and
  generate then leaves the committed fixtures as they were."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import generate_on_a_copy

import rollout_audit as ra
from rollout_audit.contract.config import Config
from rollout_audit.contract.schema import context_sha256
from rollout_audit.dev.fixtures import FIXTURES
from rollout_audit.faults import FAULTS, fault, read_records
from rollout_audit.faults.base import (
    PER_TOKEN,
    Ctx,
    drop_token,
    insert_tokens,
    n_trainable,
    policy_positions,
    remove_tokens,
)

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())

TOKEN_LISTS = ("token_ids", "token_source", "token_turn", "loss_mask", "behavior_logprobs")


@pytest.fixture(scope="module")
def agent_records():
    return read_records(FIXTURES / "compliant")


def serious(trajs, updates) -> pl.DataFrame:
    rep = ra.audit(trajs, updates, config=Config(preview=True))
    assert rep.complete, rep.render()
    return rep.findings.filter(pl.col("severity").is_in(["error", "warning"]))


def assert_aligned(t: dict, updates: list[dict]) -> None:
    n = len(t["token_ids"])
    for c in (*TOKEN_LISTS, *PER_TOKEN):
        if t.get(c) is not None:
            assert len(t[c]) == n, c
    if t.get("nucleus_offsets") is not None:
        assert len(t["nucleus_offsets"]) == n + 1 and t["nucleus_offsets"][-1] == len(t["nucleus_ids"])
    assert t["num_trainable_tokens"] == n_trainable(t)
    for k, tr in enumerate(t["turns"]):
        own = policy_positions(t, turn=k)
        assert tr["num_policy_tokens"] == len(own)
        assert tr["logprob"] == pytest.approx(sum(t["behavior_logprobs"][i] for i in own), abs=1e-5)
        if tr.get("sampled_token_ids") is not None:
            assert tr["sampled_token_ids"] == [t["token_ids"][i] for i in own]
        for length, sha in (
            ("context_length", "context_sha256"),
            ("template_context_length", "template_context_sha256"),
        ):
            if tr.get(length) is not None:
                assert tr[sha] == context_sha256(t["token_ids"], tr[length])
    for u in updates:
        if t["trajectory_id"] in u["trajectory_ids"] and u.get("numerator_tokens") is not None:
            assert u["numerator_tokens"][u["trajectory_ids"].index(t["trajectory_id"])] == n_trainable(t)


def _places(t: dict) -> dict[str, tuple[int, int, int]]:
    """Where to insert (position, source, turn): in the first and the last action, before the
    second turn's context ends (an observation token), at the very start and at the end."""
    first, last = policy_positions(t, turn=0), policy_positions(t)
    second = policy_positions(t, turn=1)[0] if len(t["turns"]) > 1 else None
    out = {
        "inside the first action": (first[-1], 2, 0),
        "after the last action": (last[-1] + 1, 2, t["token_turn"][last[-1]]),
        "before everything": (0, 0, -1),
        "at the end": (len(t["token_ids"]), 4, t["token_turn"][-1]),
    }
    if second is not None:
        out["an observation before turn 1"] = (second - 1, 3, 0)
    return out


@pytest.mark.parametrize("log", ["agent", "synthetic"])
def test_inserted_tokens_keep_every_derived_list_aligned_and_the_log_compliant(log, agent_records, clean_records):
    trajs, ups = copy.deepcopy(agent_records if log == "agent" else clean_records)
    assert serious(trajs, ups).is_empty()
    ctx = Ctx(trajs, ups, seed=0)
    used = ctx.used()
    cands = [t for t in trajs if len(t["turns"]) >= 2 and t["trajectory_id"] in used]
    places = list(_places(cands[0]))
    assert len(cands) >= len(places) == 5
    for t, what in zip(cands, places):  # each place in a trajectory of its own
        pos, source, turn = _places(t)[what]
        before = len(t["token_ids"])
        lps = [-0.5, -1.25] if source == 2 else None
        insert_tokens(ctx, t, pos, [t["token_ids"][min(pos, before - 1)], 7], source=source, turn=turn, logprobs=lps)
        assert len(t["token_ids"]) == before + 2, what
        assert t["token_source"][pos : pos + 2] == [source, source] and t["token_turn"][pos : pos + 2] == [turn, turn]
        assert_aligned(t, ups)
    assert serious(trajs, ups).is_empty(), serious(trajs, ups)


def test_drop_token_undoes_an_inserted_token(agent_records):
    trajs, ups = copy.deepcopy(agent_records)
    ctx = Ctx(trajs, ups, seed=0)
    t = next(t for t in trajs if len(t["turns"]) >= 2)
    old = copy.deepcopy(t)
    at = policy_positions(t, turn=1)[0] - 1  # an observation token of turn 0
    insert_tokens(ctx, t, at, [5], source=3, turn=0)
    drop_token(t, at)
    assert {c: t[c] for c in (*TOKEN_LISTS, *PER_TOKEN, "nucleus_offsets", "nucleus_ids") if c in t} == {
        c: old[c] for c in (*TOKEN_LISTS, *PER_TOKEN, "nucleus_offsets", "nucleus_ids") if c in old
    }


@pytest.mark.parametrize("log", ["agent", "synthetic"])
def test_remove_tokens_undoes_insert_tokens_everywhere(log, agent_records, clean_records):
    """Tokens inserted at each place and removed again leave every record as it was, the turns'
    counts, contexts, rewards and the updates' denominators included."""
    trajs, ups = copy.deepcopy(agent_records if log == "agent" else clean_records)
    ctx = Ctx(trajs, ups, seed=0)
    used = ctx.used()
    cands = [t for t in trajs if len(t["turns"]) >= 2 and t["trajectory_id"] in used]
    old = copy.deepcopy((trajs, ups))
    for t, what in zip(cands, _places(cands[0])):
        pos, source, turn = _places(t)[what]
        lps = [-0.5, -1.25] if source == 2 else None
        insert_tokens(
            ctx, t, pos, [t["token_ids"][min(pos, len(t["token_ids"]) - 1)], 7], source=source, turn=turn, logprobs=lps
        )
        remove_tokens(ctx, t, pos, 2)
        assert_aligned(t, ups)
    assert (trajs, ups) == old


def test_removed_policy_tokens_leave_a_compliant_log(agent_records):
    """A stripped last action (the turn keeps its first token) or an observation token removed
    before a later turn: only the record the fault meant to change changes, nothing fires."""
    trajs, ups = copy.deepcopy(agent_records)
    ctx = Ctx(trajs, ups, seed=0)
    t, u = [t for t in trajs if len(t["turns"]) >= 2 and t["trajectory_id"] in ctx.used()][:2]
    end = policy_positions(t)[-1]
    insert_tokens(ctx, t, end, [10], source=2, turn=t["token_turn"][end], logprobs=[-0.75])
    remove_tokens(ctx, t, end + 1)  # the last action's own token goes: the reward moves to the new last
    remove_tokens(ctx, u, policy_positions(u, turn=1)[0] - 1)  # an observation token of turn 0
    for x in (t, u):
        assert_aligned(x, ups)
    assert serious(trajs, ups).is_empty(), serious(trajs, ups)


def test_policy_tokens_need_their_log_probs(agent_records):
    trajs, ups = copy.deepcopy(agent_records)
    with pytest.raises(ValueError, match="log-prob"):
        insert_tokens(Ctx(trajs, ups, 0), trajs[0], 0, [3], source=2, turn=0)


# ---------------------------------------------------------------- where a fault's settings live


def test_a_fault_config_key_must_be_one_a_log_may_carry():
    with pytest.raises(ValueError, match=r"'loop_length' is not one a log may carry.*user_config="):
        fault("loop_in_the_log", {"R409"}, config={"loop_length": 3})
    with pytest.raises(ValueError, match="'truncation' is how the run was produced: it goes in config="):
        fault("truncation_from_the_user", {"T307"}, user_config={"truncation": "penalize"})
    with pytest.raises(ValueError, match="'loop_lenght' is not a configuration key"):
        fault("misspelt", {"R409"}, user_config={"loop_lenght": 3})
    assert not {"loop_in_the_log", "truncation_from_the_user", "misspelt"} & set(FAULTS)


def check(*args: str) -> tuple[int, dict]:
    from click.testing import CliRunner

    from rollout_audit.cli import main

    res = CliRunner().invoke(main, ["check", *args, "--format", "json"])
    return res.exit_code, (json.loads(res.stdout) if res.stdout.startswith("{") else {"stderr": res.stderr})


@pytest.mark.parametrize("name", sorted(n for n, e in MANIFEST["faults"].items() if e["user_config"]))
def test_a_user_only_setting_is_a_file_beside_the_fixture_never_inside_the_log(tmp_path, name):
    """Each fault's code (R409's loop of three, T309's stop list) is caught under the user's own
    setting (the manifest's file, with --config), unreported under the default, and refused (exit 2)
    when the log itself states it."""
    entry = MANIFEST["faults"][name]
    user, log = FIXTURES / entry["user_config_file"], FIXTURES / "broken" / name
    assert entry["config"] == {} and user.parent == FIXTURES / "broken" and not (log / "pyproject.toml").exists()
    assert user.read_text().startswith("[tool.rollout-audit]\n")
    codes = set(entry["codes"])
    code, doc = check(str(log), "--strict", "--preview", "--config", str(user))
    caught = [f for f in doc["findings"] if f["code"] in codes]
    assert code == 1 and {f["trajectory_id"] for f in caught} == set(entry["touched"]), doc
    assert {f["code"] for f in doc["findings"] if f["severity"] in ("error", "warning")} == codes
    code, doc = check(str(log), "--strict", "--preview")
    assert code == 0 and not [f for f in doc["findings"] if f["code"] in codes]
    inside = tmp_path / "log"
    shutil.copytree(log, inside)
    shutil.copy(user, inside / "pyproject.toml")  # the log vouching for its own setting
    code, doc = check(str(inside))
    key = next(iter(entry["user_config"]))
    assert code == 2 and f"{key}: refused in a configuration inside the audited log" in doc["stderr"], doc


# ---------------------------------------------------------------- a fault that finds no target

NO_TARGET = """
from rollout_audit.faults import fault


@fault("ten_doors_opened", {"R409"})
def ten_doors_opened(ctx):
    \"\"\"A trajectory with ten turns repeats its door: the agent's log has none.\"\"\"
    t = ctx.pick(lambda t: len(t["turns"]) >= 10, "trajectory with ten turns")
    return [t["trajectory_id"]]
"""

RUN = """
import importlib.util, sys

spec = importlib.util.spec_from_file_location("nodoors", sys.argv[2])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
from rollout_audit.dev.generate import main

sys.exit(main(["generate", "--root", sys.argv[1]]))
"""


@pytest.mark.slow  # every registered fault is applied before the one that finds no target (about 20 s)
def test_generate_refuses_a_fault_with_no_target_in_one_line_and_writes_nothing(tmp_path):
    copy_ = tmp_path / "repo"
    before = sorted(p.relative_to(ROOT).as_posix() for d in ("docs", "fixtures") for p in (ROOT / d).rglob("*"))
    res = generate_on_a_copy(tmp_path, RUN, NO_TARGET)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(
        f"generate: error: {copy_.resolve() / 'fixtures' / 'compliant'}: fault ten_doors_opened"
    )
    assert "finds no target: the log has no trajectory with ten turns this fault can break" in res.stderr
    after = sorted(p.relative_to(copy_).as_posix() for d in ("docs", "fixtures") for p in (copy_ / d).rglob("*"))
    assert after == before  # nothing written, nothing removed


def test_faults_apply_and_matrix_refuse_a_fault_with_no_target(tmp_path):
    from click.testing import CliRunner

    from rollout_audit.cli import main

    catalogue = dict(FAULTS)
    FAULTS.clear()  # the matrix of a catalogue of this one fault: the others are audited elsewhere

    @fault("ten_doors_opened", {"R409"})
    def ten_doors_opened(ctx):
        """A trajectory with ten turns repeats its door."""
        ctx.pick(lambda t: len(t["turns"]) >= 10, "trajectory with ten turns")
        return []

    try:
        for args in (
            ["faults", "apply", "ten_doors_opened", str(FIXTURES / "compliant"), str(tmp_path / "out")],
            ["faults", "matrix", str(FIXTURES / "compliant")],
        ):
            res = CliRunner().invoke(main, args)
            assert res.exit_code == 2 and isinstance(res.exception, (SystemExit, type(None))), res.output
            line = [x for x in res.stderr.splitlines() if x.strip()]
            assert len(line) == 1 and "fault ten_doors_opened finds no target" in line[0], res.stderr
            assert str(FIXTURES / "compliant") in line[0]
        assert not (tmp_path / "out").exists()
    finally:
        FAULTS.clear()
        FAULTS.update(catalogue)
