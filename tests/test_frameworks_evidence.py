"""The contract 1.2 loss evidence on framework-shaped logs: each framework's compliant fixture,
converted by its adapter, given the evidence a compliant trainer records (token rewards, KL and
returns, one update with its numerator counts and group-statistics members) audits clean with
R411-R413, U607, U608 and T307 run; each fault modelled on a public report is caught on it, where
the fixture has what the fault breaks (named per framework below, not skipped silently)."""

from __future__ import annotations

import numpy as np
import pytest
from adapterhelp import CONTEXT, fixture

import rollout_audit as ra
from rollout_audit.adapters import load
from rollout_audit.adapters.base import read_dump
from rollout_audit.contract.config import Config
from rollout_audit.faults import FAULTS, apply
from rollout_audit.synth import grpo, record_loss_evidence

FRAMEWORKS = ("verl", "slime", "skyrl", "rllm", "verifiers", "openai")
EVIDENCE = {"R411", "R412", "R413", "U607", "U608", "T307"}
REPORTED = (
    "masked_tokens_in_numerator",
    "reward_on_padding_token",
    "kl_accumulated_over_tool_tokens",
    "rejected_in_group_statistics",
)
# what a fixture lacks for a fault: no excluded (null-reward) episode to reject (only rllm's has one)
NO_TARGET = {
    ("verl", "rejected_in_group_statistics"),
    ("slime", "rejected_in_group_statistics"),
    ("skyrl", "rejected_in_group_statistics"),
    ("verifiers", "rejected_in_group_statistics"),
    ("openai", "rejected_in_group_statistics"),
}
PENALIZE = {"truncation": "penalize", "truncation_penalty": 0.0}


def framework_log(name: str) -> tuple[list[dict], list[dict]]:
    """The converted compliant fixture and one GRPO update over its rewarded episodes, with the evidence."""
    trajs = load(name).to_contract(read_dump(fixture(name, "compliant")), **CONTEXT).to_pylist()
    batch = [t for t in trajs if t["reward"] is not None]
    adv = dict.fromkeys((t["trajectory_id"] for t in batch), 0.0)
    for g in {t["group_id"] for t in batch}:
        members = [t for t in batch if t["group_id"] == g]
        adv.update(zip([t["trajectory_id"] for t in members], grpo([t["reward"] for t in members])))
    update = {
        "update_step": 0,
        "trainer_version": 0,
        "trajectory_ids": [t["trajectory_id"] for t in batch],
        "reduction": "token",
        "loss_denominator": float(sum(sum(t["loss_mask"]) for t in batch)),
        "advantages": [adv[t["trajectory_id"]] for t in batch],
        "advantage_estimator": "grpo",
    }
    updates = [update]
    record_loss_evidence(trajs, updates)
    return trajs, updates


def serious(rep: ra.Report) -> set[str]:
    return rep.codes("error") | rep.codes("warning")


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_compliant_framework_log_with_evidence_is_clean(name):
    trajs, updates = framework_log(name)
    rep = ra.audit(trajs, updates, config=Config(**PENALIZE))
    assert not serious(rep) & (EVIDENCE | {"U601", "U603", "U604"}), rep.render()
    assert not (EVIDENCE - {"T307"}) & set(rep.not_run), rep.not_run


@pytest.mark.parametrize("fault", REPORTED)
@pytest.mark.parametrize("name", FRAMEWORKS)
def test_reported_fault_is_caught_on_the_framework_log(name, fault):
    caught(name, fault, EVIDENCE | {"U603"}, NO_TARGET)


def caught(name: str, fault: str, watched: set[str], no_target: set, **config) -> None:
    """`fault` on the framework's compliant log raises exactly its codes among `watched`, naming
    what it touched; or it finds nothing to break, where `no_target` says so."""
    trajs, updates = framework_log(name)
    try:
        (bt, bu), touched = apply(fault, trajs, updates)
    except ValueError:
        assert (name, fault) in no_target, f"{fault} found nothing to break in {name}'s fixture"
        return
    assert (name, fault) not in no_target
    rep = ra.audit(bt, bu, config=Config(**{**config, **FAULTS[fault].settings}))
    found = serious(rep) & watched
    assert found == set(FAULTS[fault].codes), rep.render()
    named = set(rep.findings.filter(rep.findings["code"].is_in(list(FAULTS[fault].codes)))["trajectory_id"].to_list())
    assert set(touched) <= named


def test_skyrl_episode_cut_at_the_generation_limit_and_paid_is_t307():
    """SkyRL without zero_reward_on_non_stop: an episode stopped by length keeps the environment's 1.0."""
    trajs, updates = framework_log("skyrl")
    paid = next(t for t in trajs if t["reward"] == 1.0)
    paid.update(terminated=False, truncated=True, stop_reason="max_tokens")
    failed = next(t for t in trajs if t["reward"] == 0.0)
    failed.update(task_id=paid["task_id"], stop_reason="failure")
    for cfg, fires in (
        ({"truncation": "penalize"}, True),
        (PENALIZE, True),
        ({"truncation": "penalize", "truncation_penalty": 1.0}, False),
    ):
        rep = ra.audit(trajs, updates, config=Config(**cfg))
        t307 = rep.findings.filter(rep.findings["code"] == "T307")
        assert (t307["trajectory_id"].to_list() == [paid["trajectory_id"]]) == fires, rep.render()
    assert np.isclose(paid["reward"], 1.0)
