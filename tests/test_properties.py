"""Property tests: random compliant logs audit clean; a random fault from the library is caught.

CI runs 25 derandomized examples per property (a red CI must be reproducible); for a longer
random search: RA_EXAMPLES=300 python -m pytest tests/test_properties.py (passed 2026-11-29).
"""

from __future__ import annotations

import os

import polars as pl
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import rollout_audit as ra
from rollout_audit import schema as S
from rollout_audit.config import Config
from rollout_audit.faults import FAULTS, apply
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
    for t in trajs:
        for c in drop:
            t.pop(c, None)
        for tr in t["turns"]:
            for f in drop_turn:
                tr.pop(f, None)
    rep = ra.audit(trajs, ups if with_updates else None)
    assert serious(rep).is_empty(), serious(rep)
    # an absent input is reported as not run, never silently passed
    for code, rule in rep.rules.items():
        missing = [
            q for q in rule.requires if q.split(".")[0] in drop or (q.startswith("turns.") and q[6:] in drop_turn)
        ]
        if missing and rule.scope == "batch":
            assert code in rep.not_run, (code, missing)


@SETTINGS
@given(
    log=logs, name=st.sampled_from(sorted(n for n, f in FAULTS.items() if not f.file_level)), seed=st.integers(0, 1000)
)
def test_random_fault_is_caught(log, name, seed):
    trajs, ups = log
    try:
        (bt, bu), touched = apply(name, trajs, ups, seed=seed)
    except ValueError:  # this random log has no target for the fault (e.g. no truncated episode)
        assume(False)
    f = FAULTS[name]
    rep = ra.audit(bt, bu, config=Config.from_mapping(f.config))
    found = set(serious(rep)["code"].to_list())
    assert f.codes & found, f"{name}: expected {sorted(f.codes)}, found {sorted(found)}"
    named = set(serious(rep).filter(pl.col("code").is_in(list(f.codes)))["trajectory_id"].drop_nulls().to_list())
    assert set(touched) <= named or name.startswith("update_names"), (touched, named)
