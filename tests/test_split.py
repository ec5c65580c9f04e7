"""Split episodes (contract 1.2): a trainer that starts a new sequence when an engine context does
not extend the old one (rLLM, prime-rl, the OpenAI-compatible adapter) records where and why; M108
reports each split naming the position and both ids, recomputed from the segment; the episode's
outcome is carried by its last segment only, so `stats` and the T/R checks count it once."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import polars as pl
from adapterhelp import IDENTITY, cli, fixture, opts
from frameworks import rllm as rllm_fx

import rollout_audit as ra
from rollout_audit.adapters import openai, rllm
from rollout_audit.adapters.base import read_dump
from rollout_audit.adapters.steps import Call, divergence, merge
from rollout_audit.contract.config import Config

CONTEXT = dict(kv.split("=") for kv in IDENTITY)


def _errors(rep: ra.Report) -> pl.DataFrame:
    return rep.findings.filter(pl.col("severity") == "error")


def test_divergence_names_the_first_differing_position_and_both_ids():
    assert divergence([1, 2, 3, 4], [1, 2, 9, 4, 5]) == {
        "split_position": 2,
        "split_sequence_id": 3,
        "split_context_id": 9,
    }
    # a context shorter than the sequence (history truncated): it ends where the sequence goes on
    assert divergence([1, 2, 3], [1, 2]) == {"split_position": 2, "split_sequence_id": 3, "split_context_id": None}


def test_merge_keeps_the_split_evidence_on_the_segment_it_starts():
    calls = [Call([1, 2], [3, 4], None), Call([1, 2, 3, 4, 5], [6], None), Call([1, 2, 3, 7, 5], [8], None)]
    segs = merge(calls, "test")
    assert len(segs) == 2 and segs[0].split == {}
    assert segs[1].split == {"split_position": 3, "split_sequence_id": 4, "split_context_id": 7}
    assert segs[1].token_ids[:5] == [1, 2, 3, 7, 5]


def test_openai_retokenized_session_is_m108_and_its_success_counts_once(tmp_path: Path):
    out = tmp_path / "log"
    assert cli("convert", "--from", "openai", fixture("openai", "retokenized"), out, *opts(IDENTITY)).exit_code == 0
    res = cli("check", out, "--format", "json")
    assert res.exit_code == 0, res.output  # a warning: the trainer's split is faithful, and now visible
    found = [f for f in json.loads(res.stdout)["findings"] if f["severity"] != "info"]
    assert [(f["code"], f["trajectory_id"], f["position"]) for f in found] == [("M108", "episode-0#1", 12)]
    assert (
        "split from episode-0 at position 12: the sequence so far had id 51, the next engine context had id 52"
        in (found[0]["message"])
    )
    stats = json.loads(cli("stats", out, "--format", "json").stdout)
    assert stats["trajectories"] == 2 and stats["split_episodes"] == 1
    assert stats["stop_reasons"] == {"success": 1} and stats["reward_null"] == 0
    assert "split episodes: 1" in cli("stats", out).stdout


def test_only_the_last_segment_carries_the_outcome():
    table = openai.to_contract(read_dump(fixture("openai", "retokenized")), **CONTEXT)
    rows = table.select(["trajectory_id", "split_continues", "stop_reason", "reward", "terminated"]).to_pylist()
    assert rows == [
        {"trajectory_id": "episode-0#0", "split_continues": True, "stop_reason": None, "reward": None,
         "terminated": None},
        {"trajectory_id": "episode-0#1", "split_continues": False, "stop_reason": "success", "reward": 1.0,
         "terminated": True},
    ]  # fmt: skip
    # an unsplit session has none of the split columns: v1.1 logs and their audits are unchanged
    plain = openai.to_contract(read_dump(fixture("openai", "compliant")), **CONTEXT)
    assert not {c for c in plain.column_names if c.startswith("split_")}


def test_a_continuing_segment_that_carries_an_outcome_is_t301():
    table = openai.to_contract(read_dump(fixture("openai", "retokenized")), **CONTEXT)
    recs = table.to_pylist()
    recs[0] |= {"terminated": True, "truncated": False, "infra_error": False, "stop_reason": "success"}
    rep = ra.audit(recs, None)
    t301 = rep.findings.filter(pl.col("code") == "T301")
    assert t301["trajectory_id"].to_list() == ["episode-0#0"]
    assert "does not end its split episode" in t301["message"][0]


def test_m108_recomputes_the_context_id_from_the_segment():
    table = openai.to_contract(read_dump(fixture("openai", "retokenized")), **CONTEXT)
    recs = table.to_pylist()
    recs[1]["split_context_id"] = 53  # the evidence says 53, the segment's context has 52 there
    f = ra.audit(recs, None).findings.filter(pl.col("code") == "M108")
    assert f.height == 1 and "but this segment's context has id 52 there" in f["message"][0]
    recs[1]["split_context_id"] = recs[1]["split_sequence_id"] = 52
    f = ra.audit(recs, None).findings.filter(pl.col("code") == "M108")
    assert "both ids are the same" in f["message"][0]


def test_rllm_episode_split_by_its_transform_is_m108_and_counted_once():
    """rLLM's transform splits a trajectory whose step prompt does not extend the running sequence;
    the second step's prompt here re-renders the first action `51 52 2` as `51 53 2`."""
    ep = rllm_fx.compliant()[0]
    step = ep["trajectories"][0]["steps"][1]
    drifted = copy.deepcopy(step["model_output"]["prompt_ids"])
    at = len(rllm_fx.SYSTEM_USER) + 2
    assert drifted[at] == 52
    drifted[at] = 53
    step["model_output"]["prompt_ids"] = step["prompt_ids"] = drifted
    table = rllm.to_contract([ep], **CONTEXT)
    assert table.column("trajectory_id").to_pylist() == ["task-7:0/solver#0", "task-7:0/solver#1"]
    rep = ra.audit_tables(table, config=Config())
    assert _errors(rep).is_empty(), rep.render()
    m108 = rep.findings.filter(pl.col("code") == "M108").row(0, named=True)
    assert (m108["trajectory_id"], m108["position"]) == ("task-7:0/solver#1", at)
    assert (
        "split from task-7:0/solver" in m108["message"]
        and "had id 52, the next engine context had id 53" in (m108["message"])
    )
    # the verdict, stop cause and reward count once
    assert table.column("verifier_success").to_pylist() == [None, True]
    assert table.column("reward").to_pylist() == [None, 1.0]


def test_m108_is_silent_on_a_log_without_splits(records):
    rep = ra.audit(*records)
    assert "M108" in rep.summary["checks_run"] and rep.findings.filter(pl.col("code") == "M108").is_empty()


def test_segments_of_a_split_episode_are_one_group_member_trained_with_its_advantage():
    """rLLM trains every segment with the episode's advantage: the group holds the episode once (its
    last segment's reward), and each segment's recorded advantage is recomputed from it (U603)."""
    eps = rllm_fx.compliant()[:2]  # solved (1.0) and failed (0.0)
    step = eps[0]["trajectories"][0]["steps"][1]
    at = len(rllm_fx.SYSTEM_USER) + 2
    step["model_output"]["prompt_ids"] = step["prompt_ids"] = [
        *step["prompt_ids"][:at],
        53,
        *step["prompt_ids"][at + 1 :],
    ]
    table = rllm.to_contract(eps, **CONTEXT)
    ids = table.column("trajectory_id").to_pylist()
    assert ids == ["task-7:0/solver#0", "task-7:0/solver#1", "task-7:1/solver"]
    adv = 0.5 / (2**-0.5 + 1e-6)  # grpo over rewards (1, 0): one member per episode
    update = {
        "update_step": 0,
        "trainer_version": 3,
        "trajectory_ids": ids,
        "reduction": "trajectory",
        "loss_denominator": 3.0,
        "advantages": [adv, adv, -adv],
        "advantage_estimator": "grpo",
        "max_policy_lag": 0,
    }
    rep = ra.audit(table, [update])
    assert not rep.codes("error") and "U603" in rep.summary["checks_run"], rep.render()
    # counted as two members (1.0 twice against 0.0) the advantages would be others: U603 recomputes
    wrong = dict(update, advantages=[2 / 3 / 0.57735, 2 / 3 / 0.57735, -4 / 3 / 0.57735])
    assert "U603" in ra.audit(table, [wrong]).codes("error")


def test_m108_on_hostile_split_evidence_names_it_without_crashing():
    table = openai.to_contract(read_dump(fixture("openai", "retokenized")), **CONTEXT)
    recs = table.to_pylist()
    recs[1]["split_position"] = 10**6
    recs[1]["split_sequence_id"] = None
    f = ra.audit(recs, None).findings.filter(pl.col("code") == "M108").row(0, named=True)
    assert f["position"] is None and "split_position lies outside the trajectory's tokens" in f["message"]
    assert "had id (not recorded)" in f["message"]
