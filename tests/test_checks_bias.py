"""L211: a consistent signed bias between the behaviour log-probs and a second log-prob column, judged per
decoding setting over turns with a minimum effect: silent on compliant logs whose second column differs by
float32 noise or bf16 arithmetic, firing on a top-p sampler against a full-vocabulary trainer (synthetic,
and in verifiers' own record shape), not run where it cannot judge."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from adapterhelp import cli, fixture

import rollout_audit as ra
from rollout_audit.checks.replay import MIN_BIAS_TURNS, t_quantile
from rollout_audit.contract.config import Config
from rollout_audit.faults import FAULTS, apply, write_records
from rollout_audit.synth import SECOND_PRECISIONS, bf16, make_log, second_logprobs

COLUMN = "trainer_logprobs"
FAULT = "top_p_against_full_vocab_trainer"
CFG = {"preview": True, "select": ["L211", "L207"], "compare_logprobs": COLUMN}
VERIFIERS = [
    "--context",
    "environment_id=doors",
    "--context",
    "environment_version=v1",
    "--context",
    "verifier_version=v1",
    "--context",
    "reset_seed=0",
    "--context",
    "policy_version=3",
]


def _audit(tmp_path: Path, trajs: list[dict], ups: list[dict], **cfg) -> ra.Report:
    write_records(tmp_path / "log", trajs, ups)
    return ra.audit(tmp_path / "log", config=Config.from_mapping({**CFG, **cfg}))


def _base() -> tuple[list[dict], list[dict]]:
    return make_log(n_tasks=4, group_size=4, n_versions=2, seed=0)


@pytest.mark.parametrize("precision", SECOND_PRECISIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_silent_on_compliant_second_columns(tmp_path, precision, seed):
    """float32 noise, bf16 rounding of the trainer's column, a bf16 engine against a bf16 trainer: the
    test runs on every decoding setting and reports nothing (nor does L207)."""
    trajs, ups = make_log(n_tasks=4, group_size=4, n_versions=2, seed=seed)
    second_logprobs(trajs, precision, seed=seed, column=COLUMN)
    rep = _audit(tmp_path, trajs, ups)
    assert rep.complete and "L211" not in rep.not_run, rep.not_run
    assert rep.findings.is_empty(), rep.findings
    stats = rep.summary["statistics"]["L211"]
    assert stats and all(abs(s["lo"]) < 0.01 and abs(s["hi"]) < 0.01 for s in stats), stats


def test_fires_on_a_top_p_sampler_against_a_full_vocabulary_trainer(tmp_path):
    (trajs, ups), touched = apply(FAULT, *_base())
    rep = _audit(tmp_path, trajs, ups)
    l211 = rep.findings.filter(pl.col("code") == "L211")
    assert set(l211["trajectory_id"]) == set(touched) and set(rep.findings["code"]) == {"L211"}
    assert l211["severity"].unique().to_list() == ["warning"]
    msg = l211["message"][0]
    assert "top_p 0.95" in msg and "π_trainer_logprobs − log π_beh -0.0" in msg, msg
    (st,) = [s for s in rep.summary["statistics"]["L211"] if s["top_p"] < 1]
    mass = math.exp(st["m"])  # the nucleus mass the bias is explained by: between 0.95 and 0.99 by construction
    assert 0.95 < mass < 0.99 and f"over a nucleus of mass {mass:.3g}" in msg, msg
    assert st["hi"] < -0.01 and f"over {st['n']} turns" in msg


def test_the_sign_says_which_side_is_renormalised(tmp_path):
    """A second column renormalised over a nucleus the behaviour log-probs are not (replay applying the
    logged top-p to a log whose engine returned raw log-probs): m > 0, and the message says so."""
    trajs, ups = _base()
    for t in trajs:
        t[COLUMN] = [None if lp is None else min(lp - math.log(0.9), 0.0) for lp in t["behavior_logprobs"]]
    rep = _audit(tmp_path, trajs, ups, select=["L211"])
    msg = rep.findings["message"][0]
    assert len(rep.findings) == len(trajs) and "renormalising π_trainer_logprobs over a nucleus of mass" in msg


def test_an_outlier_is_l207_s_and_not_a_consistent_bias(tmp_path):
    """One trajectory 1.5 nats off on each token, the rest exact: L207 names it, L211 does not (the interval
    over turns holds 0)."""
    trajs, ups = _base()
    for t in trajs:
        t[COLUMN] = list(t["behavior_logprobs"])
    trajs[3][COLUMN] = [None if lp is None else lp - 1.5 for lp in trajs[3]["behavior_logprobs"]]
    rep = _audit(tmp_path, trajs, ups)
    assert set(rep.findings["code"]) == {"L207"}, rep.findings


def test_not_run_without_a_second_column_or_enough_turns(tmp_path):
    trajs, ups = _base()
    write_records(tmp_path / "plain", trajs, ups)
    rep = ra.audit(tmp_path / "plain", config=Config.from_mapping({"preview": True}))
    assert "compare_logprobs" in rep.not_run["L211"]
    few = [t for t in trajs if len(t["turns"]) == 1][: MIN_BIAS_TURNS - 1]
    for t in few:
        t[COLUMN] = [None if lp is None else lp - 0.5 for lp in t["behavior_logprobs"]]
    rep = _audit(tmp_path, few, [], select=["L211"])
    assert rep.not_run["L211"] == (
        f"needs at least {MIN_BIAS_TURNS} turns of one decoding setting with both log-probs; the most in one "
        f"setting: {len(few)}"
    )


def test_the_bundled_fault_through_the_cli():
    """`check --preview` on the bundled broken log (its pyproject.toml names the column) warns with L211."""
    res = cli("check", "fixtures/broken/" + FAULT, "--preview", "--format", "json")
    assert res.exit_code == 0, res.output
    found = json.loads(res.stdout)["findings"]
    assert {f["code"] for f in found} == {"L211"}
    assert {f["trajectory_id"] for f in found} == set(
        json.loads(Path("fixtures/manifest.json").read_text())["faults"][FAULT]["touched"]
    )
    assert FAULTS[FAULT].config == {"compare_logprobs": COLUMN}


@pytest.mark.parametrize(
    ("case", "named"),
    [
        ("compliant_v1_trainer_logprobs", set()),
        ("v1_top_p_against_full_vocab_trainer", {f"trace-{n}" for n in range(4)}),
    ],
)
def test_in_verifiers_own_record_shape(case, named):
    """verifiers 0.4.0 traces whose nodes carry `trainer_logprobs`: a bf16 trainer at top_p 1 is silent, a
    full-vocabulary trainer against top-p 0.9 processed log-probs is L211 on every trace (L207 silent)."""
    res = cli("check", "--from", "verifiers", fixture("verifiers", case), *VERIFIERS, "--preview", "--format", "json")
    rep = json.loads(res.stdout)
    assert res.exit_code == 0 and not {"L207", "L211"} & {n["code"] for n in rep["not_run"]}, res.output
    assert {f["trajectory_id"] for f in rep["findings"]} == named and {f["code"] for f in rep["findings"]} <= {"L211"}
    if named:
        assert "mass 0.919" in rep["findings"][0]["message"]


def _t_exact(df: int, p: float) -> float:
    """Student's t quantile by integrating its density (trapezoids) and bisection: the reference."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float) -> float:
        g = np.linspace(0.0, x, 20001)
        return 0.5 + float(np.trapezoid(c * (1 + g * g / df) ** (-(df + 1) / 2), g))

    lo, hi = 0.0, 50.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("df", [7, 9, 10, 20, 60, 500])
def test_the_quantile_is_students_t(df):
    assert t_quantile(df) == pytest.approx(_t_exact(df, 0.9995), rel=1e-3)


def test_bf16_rounds_to_eight_significant_bits():
    x = np.array([-2.3, -0.0123456, -1.0000001, 0.0], np.float32)
    assert bf16(x).tolist() == [-2.296875, -0.0123291015625, -1.0, 0.0]


def test_the_fpr_benchmark_runs():
    """benchmarks/bias_fpr.py, one run per precision: no false positive, the fault caught."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import bias_fpr

    assert bias_fpr.main(["--runs", "1"]) == 0
