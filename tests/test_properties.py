"""Property tests: random compliant logs audit clean; a random fault from the library is caught.

CI runs 25 derandomized examples per property (a red CI must be reproducible); for a longer
random search: RA_EXAMPLES=300 python -m pytest tests/test_properties.py.
"""

from __future__ import annotations

import ast
import copy
import os
from pathlib import Path

import polars as pl
from checkhelp import only
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import rollout_audit as ra
from rollout_audit.contract import schema as S
from rollout_audit.faults import FAULTS, NoTarget, apply, matrix_config
from rollout_audit.synth import make_log

OPTIONAL_COLUMNS = [c.name for c in S.columns("trajectories") if c.requirement != "R"]
OPTIONAL_TURN_FIELDS = [c.name for c in S.columns("turn") if c.requirement != "R"]

logs = st.builds(
    make_log,
    n_tasks=st.integers(1, 5),
    group_size=st.integers(1, 6),
    n_versions=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    truncated_share=st.sampled_from([0.0, 0.2, 0.5]),
    gamma=st.sampled_from([1.0, 0.99, 0.9]),
)
SETTINGS = settings(
    max_examples=int(os.environ.get("RA_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=not os.environ.get("RA_EXAMPLES"),
)


def serious(rep) -> pl.DataFrame:
    return rep.findings.filter(pl.col("severity") != "info")


# What each check needs, written from the rules in docs/checks.md, independently of the
# declarations in the code: a check listed here is not run exactly when one of these is absent.
# A check not listed here carries its own not-run test instead (test_every_check_has_a_not_run_oracle).
_TOKENS = {"token_source", "loss_mask", "behavior_logprobs", "token_turn", "token_ids"}
NEEDS: dict[str, set[str]] = {
    "S001": set(),
    "S002": {"trajectory_id"},
    "S003": {"token_source"},
    "S004": {"turns", "token_turn"},
    "S005": set(),
    "T301": {"terminated", "truncated", "infra_error"},
    "T302": {"terminated", "truncated", "infra_error", "stop_reason"},
    "T303": {"trajectory_id", "infra_error", "reward"},
    "T304": {"truncated", "reward"},
    "T305": {"terminated", "turns.finish_reason"},
    "T306": {"terminated", "token_turn", "max_response_tokens (configuration)"},
    "T307": {"trajectory_id", "task_id", "truncated", "terminated", "reward", "stop_reason"},
    "L201": {"loss_mask", "behavior_logprobs", "token_source"},
    "L202": {"turns.logprob", "behavior_logprobs", "token_source", "token_turn"},
    "L203": {"behavior_logprobs", "token_source"},
    "L205": {"replay (configuration)"},
    "L206": {"replay (configuration)"},
    "L207": {"replay (configuration)"},
    "L209": {"replay (configuration)"},
    "L208": {"loss_mask", "behavior_logprobs", "token_source", "token_turn", "turns.temperature", "turns.top_p"},
    "L204": {"turns.temperature", "turns.top_p"},
    "M101": {"loss_mask", "token_source"},
    "M102": {"loss_mask", "token_source"},
    "M103": {"num_trainable_tokens", "loss_mask"},
    "M104": {"turns.num_policy_tokens", "token_source", "token_turn"},
    "M105": {"token_ids", "token_source", "token_turn", "turns.context_length", "turns.context_sha256"},
    "M107": {
        "token_ids",
        "token_source",
        "token_turn",
        "turns.template_context_length",
        "turns.template_context_sha256",
    },
    "M106": {"token_ids", "token_source", "token_turn", "turns.sampled_token_ids"},
    "M108": {"token_ids"},
    "M109": {"loss_mask"},
    "R401": {"turns.reward", "turns.reward_components"},
    "R402": {"turns.shaping", "turns.potential_before", "turns.potential_after"},
    "R403": {"turns.potential_before", "turns.potential_after"},
    "R404": {"turns.shaping", "turns.potential_before", "turns.potential_after"},
    "R405": {"terminated", "turns.potential_after"},
    "R406": {"turns.td_residual", "turns.value", "turns.reward", "final_value"},
    "R407": {"discounted_return", "turns.reward"},
    "R408": {"first_visit_components (configuration)"},
    "R409": {"turns.parsed_action"},
    "R410": {"task_id", "reward", "verifier_success"},
    "R411": {"token_reward", "token_source", "token_turn"},
    "R412": {"token_kl", "token_source"},
    "R413": {"token_returns", "token_reward", "token_source"},
    "E801": {"trajectory_id"},
    "E802": {"trajectory_id", "initial_state_checksum", "environment_id", "environment_version", "reset_seed"},
    "G701": {"task_id", "reward"},
    "G702": {"task_id", "reward"},
    "G703": {"task_id", "reward"},
    "P501": {"turns.policy_version"},
    "P502": {"turns.policy_version"},
    "P503": {"updates", "turns.policy_version"},
    "P504": {"turns.policy_version"},
    "U601": {"updates", "trajectory_id"},
    "U602": {"updates", "trajectory_id"},
    "U603": {"updates", "trajectory_id", "task_id", "reward"},
    "U604": {"updates", "trajectory_id", "task_id", "reward"},
    "U605": {"updates"},
    "U606": {"updates", "trajectory_id", "reward", "truncated", "infra_error"},
    "U607": {"updates", "updates.numerator_tokens", "trajectory_id", "loss_mask"},
    "U608": {"updates", "updates.stat_trajectory_ids", "trajectory_id", "reward"},
}
# the contract 1.2 loss evidence, which synthetic logs do not record
EVIDENCE = {"token_reward", "token_kl", "token_returns", "updates.numerator_tokens", "updates.stat_trajectory_ids"}
ALL_COLUMNS = [c.name for c in S.columns("trajectories")]
ALL_TURN_FIELDS = [c.name for c in S.columns("turn")]


def _drop(trajs: list[dict], drop: set[str], drop_turn: set[str]) -> None:
    for t in trajs:
        for c in drop:
            t.pop(c, None)
        for tr in t.get("turns") or []:
            for f in drop_turn:
                tr.pop(f, None)


def expected_not_run(drop: set[str], drop_turn: set[str], with_updates: bool) -> set[str]:
    """Codes that cannot run, from NEEDS and what was dropped."""
    absent = set(drop) | {f"turns.{f}" for f in drop_turn}
    if "turns" in drop:
        absent |= {f"turns.{f}" for f in ALL_TURN_FIELDS}
    if not with_updates:
        absent.add("updates")
    absent |= {
        "first_visit_components (configuration)",
        "replay (configuration)",
        "max_response_tokens (configuration)",
    }
    absent |= {"turns.template_context_length", "turns.template_context_sha256"}  # no template render in synth logs
    absent |= EVIDENCE
    return {code for code, needs in NEEDS.items() if needs & absent}


def _not_run(rep) -> set[str]:
    """The checks of NEEDS that were not run (the table is the oracle for these only)."""
    return set(rep.not_run) & set(NEEDS)


def _tests_naming_not_run() -> set[str]:
    """Codes named (as a string) in a test function of tests/ that reads `not_run`."""
    out: set[str] = set()
    for path in Path(__file__).resolve().parent.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                if "not_run" in names:
                    out |= {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return out


def test_every_check_has_a_not_run_oracle():
    """A check is in NEEDS (the independent table above), or a test of its own names its code
    and reads `not_run` (the check's test on a log without its inputs)."""
    assert set(NEEDS) <= set(ra.all_rules()), sorted(set(NEEDS) - set(ra.all_rules()))
    named = _tests_naming_not_run()
    lacking = sorted(c for c in ra.all_rules() if c not in NEEDS and c not in named)
    assert not lacking, f"{lacking}: test the check on a log without its inputs (see docs/writing-checks.md)"


@SETTINGS
@given(
    log=logs,
    drop=st.sets(st.sampled_from(OPTIONAL_COLUMNS)),
    drop_turn=st.sets(st.sampled_from(OPTIONAL_TURN_FIELDS)),
    with_updates=st.booleans(),
)
def test_random_compliant_logs_audit_clean(log, drop, drop_turn, with_updates):
    trajs, ups = log
    if trajs[0]["gamma"] != 1.0:
        drop = drop - {"gamma"}  # gamma defaults to 1.0 when absent: only drop it when that is true
    if "shaping" in drop_turn:  # a pipeline without shaping has no shaped TD residuals or returns either
        drop_turn = drop_turn | {"td_residual"}
        drop = drop | {"discounted_return"}
    _drop(trajs, drop, drop_turn)
    rep = ra.audit(trajs, ups if with_updates else None)
    assert serious(rep).is_empty(), serious(rep)
    assert _not_run(rep) == expected_not_run(drop, drop_turn, with_updates), rep.not_run
    assert rep.complete and not rep.partial


@SETTINGS
@given(
    log=logs,
    drop=st.sets(st.sampled_from(ALL_COLUMNS), max_size=4),
    drop_turn=st.sets(st.sampled_from(ALL_TURN_FIELDS), max_size=4),
    with_updates=st.booleans(),
)
def test_dropping_any_input_gives_exactly_the_expected_not_run(log, drop, drop_turn, with_updates):
    """Required inputs too: the audit never crashes, never passes a log that lacks a required
    input, and lists exactly the checks that lost an input as not run."""
    trajs, ups = log
    _drop(trajs, drop, drop_turn)
    rep = ra.audit(trajs, ups if with_updates else None)
    assert not rep.crashes, rep.crashes
    required = set(S.required("trajectories")) | {f"turns.{c.name}" for c in S.columns("turn") if c.requirement == "R"}
    if (drop | {f"turns.{f}" for f in drop_turn}) & required:
        assert rep.exit_code() != 0, "a log without a required input passed"
    assert _not_run(rep) == expected_not_run(drop, drop_turn, with_updates), rep.not_run


@SETTINGS
@given(
    log=logs, name=st.sampled_from(sorted(n for n, f in FAULTS.items() if not f.file_level)), seed=st.integers(0, 1000)
)
def test_random_fault_is_caught(log, name, seed):
    trajs, ups = log
    try:
        (bt, bu), touched = apply(name, trajs, ups, seed=seed)
    except NoTarget:  # this random log has no target for the fault (e.g. no truncated episode)
        assume(False)
    f = FAULTS[name]
    rep = ra.audit(bt, bu, config=matrix_config(f.settings))  # a preview check is held to its own fault
    found = set(serious(rep)["code"].to_list())
    assert f.codes <= found, f"{name}: expected {sorted(f.codes)}, found {sorted(found)}"
    named = set(serious(rep).filter(pl.col("code").is_in(list(f.codes)))["trajectory_id"].drop_nulls().to_list())
    assert set(touched) <= named or name.startswith("update_names"), (touched, named)


@given(data=st.data())
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_m106_mixes_longer_engine_turns_with_differing_ids(clean_records, data):
    """Any mix of turns whose engine sampled more ids than the trainer kept (a cut last turn) and
    turns whose ids differ: one M106 finding per touched turn, whatever the mix, never a crash."""
    trajs, ups = copy.deepcopy(clean_records)
    touched = set()
    for k in data.draw(st.lists(st.integers(0, len(trajs) - 1), min_size=1, max_size=6, unique=True)):
        turns = [t for t in trajs[k]["turns"] if t["sampled_token_ids"]]
        for i in data.draw(st.lists(st.integers(0, len(turns) - 1), min_size=1, max_size=3, unique=True)):
            samp = turns[i]["sampled_token_ids"]
            if data.draw(st.booleans()):
                samp.append(7)  # the engine sampled more than the trainer holds
            else:
                samp[data.draw(st.integers(0, len(samp) - 1))] += 1000
            touched.add((trajs[k]["trajectory_id"], trajs[k]["turns"].index(turns[i])))
    rep = ra.audit(trajs, ups, select=["M106"])
    assert rep.crashes == [] and rep.exit_code() == 1
    assert set(only(rep, "M106").select("trajectory_id", "turn").rows()) == touched
