"""The helpers faults mutate a log with keep every derived list consistent: tokens inserted with
`insert_tokens` (policy or not, at the start, inside a turn, before a later turn's context, at
the end) leave every per-token list aligned with token_ids, the nucleus offsets one longer, each
turn's counts, log-prob sum, sampled ids and contexts true, and the updates' counts right, so
that a compliant log stays compliant; `drop_token` undoes them."""

from __future__ import annotations

import copy

import polars as pl
import pytest

import rollout_audit as ra
from rollout_audit.contract.config import Config
from rollout_audit.contract.schema import context_sha256
from rollout_audit.dev.fixtures import FIXTURES
from rollout_audit.faults import read_records
from rollout_audit.faults.base import PER_TOKEN, Ctx, drop_token, insert_tokens, n_trainable, policy_positions

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


def test_policy_tokens_need_their_log_probs(agent_records):
    trajs, ups = copy.deepcopy(agent_records)
    with pytest.raises(ValueError, match="log-prob"):
        insert_tokens(Ctx(trajs, ups, 0), trajs[0], 0, [3], source=2, turn=0)
