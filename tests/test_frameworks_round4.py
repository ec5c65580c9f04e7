"""Contract 1.3 on framework-shaped logs: each framework's compliant fixture, converted by its
adapter, with the 1.3 evidence a compliant trainer records (expert routes, prime-rl's echo stream
and per-token weights, GRPO with the population std, the overlong penalty) audits clean on the new
rules, and each of their faults is caught on it, where the fixture has what the fault breaks."""

from __future__ import annotations

import copy

import pytest
from test_frameworks_evidence import FRAMEWORKS, PENALIZE, caught, framework_log, serious

import rollout_audit as ra
from rollout_audit.contract.config import Config
from rollout_audit.faults.base import Ctx
from rollout_audit.faults.masks import echo_stream
from rollout_audit.faults.updates import _population_std_advantages
from rollout_audit.faults.versions import record_routes

NEW = {"P505", "M101", "M110", "U603", "G703", "R414"}
FAULTS_13 = (
    "routes_resumed_duplicated",
    "routes_of_resumed_weights",
    "echo_stream_takes_next_action",
    "loss_weight_on_masked_token",
    "advantages_singleton_groups",
)
# what a fixture lacks for a fault: verifiers records no policy version (no route can be tied to one)
NO_TARGET = {("verifiers", "routes_resumed_duplicated"), ("verifiers", "routes_of_resumed_weights")}


def evidenced(name: str) -> tuple[list[dict], list[dict]]:
    trajs, updates = framework_log(name)
    ctx = Ctx(copy.deepcopy(trajs), copy.deepcopy(updates), 0)
    for t in ctx.trajs:
        record_routes(t)
    try:
        echo_stream(ctx)
    except ValueError:
        pass  # no tool reply to echo in this fixture
    _population_std_advantages(ctx)
    return ctx.trajs, ctx.updates


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_compliant_framework_log_with_13_evidence_is_clean(name):
    trajs, updates = evidenced(name)
    rep = ra.audit(trajs, updates, config=Config(**PENALIZE))
    assert not serious(rep) & NEW, rep.render()
    ran = {"M110", "U603"} | ({"P505"} if name != "verifiers" else set())
    assert not ran & set(rep.not_run), rep.not_run


@pytest.mark.parametrize("fault", FAULTS_13)
@pytest.mark.parametrize("name", FRAMEWORKS)
def test_13_fault_is_caught_on_the_framework_log(name, fault):
    caught(name, fault, NEW, NO_TARGET, **PENALIZE)
