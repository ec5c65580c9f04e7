"""The committed fixtures: the compliant agent log is clean, every broken log raises exactly
its manifest's codes naming the touched trajectories, and the fixtures match the generator."""

from __future__ import annotations

import json

import polars as pl
import pytest
from test_show import assert_show_marks_what_check_reports, checked

import rollout_audit as ra
from rollout_audit.dev.fixtures import FIXTURES, generate
from rollout_audit.faults import matrix_config

MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def serious(rep) -> pl.DataFrame:
    return rep.findings.filter(pl.col("severity").is_in(["error", "warning"]))


def test_compliant_agent_log_is_clean():
    rep = ra.audit(FIXTURES / "compliant")
    assert serious(rep).is_empty(), rep.render()
    # replay is off by default; R408 runs on the declaration, T306 on the collector's budget (the
    # pyproject.toml beside the log), M107 on the template render of each turn; the agent records its
    # token-level rewards, KL and returns (R411-R413), its loss weights (M110), the numerator and
    # group-statistics members of each update (U607, U608 run); it is no mixture of experts (P505)
    # and applies no overlong penalty (R414); it records the nucleus it sampled each action from (the
    # actions its mask and top-p kept: L210 runs) and never splits an episode (M111); it has no critic
    # (R416); no trainer temperature is stated apart from the turns' (L212) and no capture layer digested
    # its calls (M112); its updates state the ratio's anchor, the behaviour log-probs (U610 runs)
    not_run = {"L205", "L206", "L207", "L209", "L211", "P505", "R414", "M111", "R416", "L212", "M112"}
    assert set(rep.not_run) == not_run
    assert "U610" in rep.summary["checks_run"]
    assert rep.summary["configuration"].endswith("compliant/pyproject.toml [tool.rollout-audit]")
    assert rep.summary["rows_read"] > 100
    assert_show_marks_what_check_reports(FIXTURES / "compliant", *checked(FIXTURES / "compliant"))


# `show` runs check's whole audit again: compared on one broken fixture per check family
# the checks in preview run only with `check --preview`, which `show` does not take
PREVIEW = {c for c, r in ra.all_rules().items() if r.preview}
SHOWN = {
    min(n for n, e in MANIFEST["faults"].items() if e["codes"][0][0] == fam and not PREVIEW & set(e["codes"]))
    for fam in {e["codes"][0][0] for e in MANIFEST["faults"].values()}
}


@pytest.mark.parametrize("name", sorted(MANIFEST["faults"]))
def test_broken_fixture_raises_its_codes(name):
    """`check --format json`, as a user runs it (the log's own configuration found inside it; the
    user's own, where the manifest names one beside the log, with --config), raises exactly the
    manifest's codes on the trajectories the fault touched; and (one fixture per family) `show`
    marks on a trajectory exactly the codes that report names on it."""
    entry = MANIFEST["faults"][name]
    user = ["--config", str(FIXTURES / entry["user_config_file"])] if "user_config_file" in entry else []
    doc, code = checked(FIXTURES / "broken" / name, *(["--preview"] if PREVIEW & set(entry["codes"]) else []), *user)
    found = [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
    assert {f["code"] for f in found} == set(entry["codes"]), doc
    named = {f["trajectory_id"] for f in found if f["code"] in entry["codes"] and f["trajectory_id"] is not None}
    assert set(entry["touched"]) <= named
    if name in SHOWN:
        assert_show_marks_what_check_reports(FIXTURES / "broken" / name, doc, code)


# What the users of the broken fixtures state, together: every check that reads a setting the user
# alone states runs, under it, on every fixture (the detection matrix audits each log with its
# own fault's settings only, so such a check would be held to its own fault's log alone).
USER_SETTINGS = {k: v for e in MANIFEST["faults"].values() for k, v in e.get("user_config", {}).items()}


@pytest.mark.slow  # every fixture audited once more (about 11 s)
def test_user_only_settings_leave_every_other_fixture_as_the_manifest_says():
    """Under every fault's user-only settings at once (preview on), the compliant log stays clean
    with the checks that read them run, and each broken log raises exactly its manifest's codes."""
    clashing = [
        (n, k)
        for n, e in MANIFEST["faults"].items()
        for k, v in e.get("user_config", {}).items()
        if USER_SETTINGS[k] != v
    ]
    assert USER_SETTINGS and not clashing, clashing  # two faults stating one key differently need two runs
    readers = {c for c, r in ra.all_rules().items() if set(r.config) & set(USER_SETTINGS)}
    rep = ra.audit(FIXTURES / "compliant", config=matrix_config(USER_SETTINGS))
    assert serious(rep).is_empty(), rep.render()
    assert readers and not readers & set(rep.not_run), rep.not_run
    for name, entry in sorted(MANIFEST["faults"].items()):
        if not (FIXTURES / "broken" / name).is_dir():
            continue  # a file-level fault: its log is not a directory of records
        rep = ra.audit(FIXTURES / "broken" / name, config=matrix_config(USER_SETTINGS))
        assert set(serious(rep)["code"]) == set(entry["codes"]), (name, rep.render())


def test_every_fault_has_a_fixture():
    from rollout_audit.faults import FAULTS

    assert set(MANIFEST["faults"]) == set(FAULTS)


def _stable(manifest: dict) -> dict:
    """The manifest without the touched trajectory ids (chosen among trajectories of a trained policy)."""
    return {
        **manifest,
        "faults": {n: {k: v for k, v in e.items() if k != "touched"} for n, e in manifest["faults"].items()},
    }


def test_a_fresh_generation_audits_as_the_manifest_says(tmp_path):
    """Regenerating the fixtures here gives logs that audit as the committed manifest says: the
    compliant log clean, each broken log caught by exactly its codes on the trajectories it touched.

    What this compares does not depend on the bits of floating-point results. The agent's behaviour
    log-probs differ in their last digits across CPUs and instruction sets (measured: up to 4.5e-6
    between AVX-512 and AVX2 machines; ATEN_CPU_CAPABILITY=default against avx2 on one machine, see
    `rollout_audit.dev.fixtures.drift`), and one flipped sample changes the rest of a training run.
    The committed files themselves are compared, with that tolerance, by
    `python -m rollout_audit.dev fixtures --check`; `python -m rollout_audit.dev generate --fixtures`
    regenerates them."""
    pytest.importorskip("torch")
    fresh = generate(tmp_path)
    assert _stable(fresh) == _stable(MANIFEST)
    rep = ra.audit(tmp_path / "compliant")
    assert serious(rep).is_empty() and rep.complete, rep.render()
    for name, entry in fresh["faults"].items():
        rep = ra.audit(tmp_path / "broken" / name, config=matrix_config(entry["user_config"]))
        found = serious(rep)
        assert set(found["code"].to_list()) == set(entry["codes"]), (name, rep.render())
        named = set(found.filter(pl.col("code").is_in(entry["codes"]))["trajectory_id"].drop_nulls().to_list())
        assert set(entry["touched"]) <= named, name


FLOATS = ("behavior_logprobs", "logprob", "value", "td_residual", "final_value", "potential_before", "potential_after")


def _jitter(x, rng, scale):
    """`x` with every float under a FLOATS key moved by up to ±scale (nested lists and dicts walked)."""
    if isinstance(x, dict):
        return {k: (_noise(v, rng, scale) if k in FLOATS else _jitter(v, rng, scale)) for k, v in x.items()}
    if isinstance(x, list):
        return [_jitter(v, rng, scale) for v in x]
    return x


def _noise(v, rng, scale):
    if isinstance(v, float):  # relative, as float32 kernels differ: a certain token's 0.0 stays 0.0
        return v * (1 + float(rng.uniform(-scale, scale)))
    if isinstance(v, list):
        return [_noise(e, rng, scale) for e in v]
    return v


def test_verdicts_hold_when_the_generator_floats_move(tmp_path):
    """Another CPU's floats: every float the agent computes (log-probs, values, TD residuals,
    potentials) moved by up to ±1e-5 of its magnitude, each independently (the largest cross-CPU
    difference measured is 5.2e-6 on values of magnitude >= 1). The compliant log stays clean and each fault is still caught exactly, so the
    fixtures' verdicts do not hang on this machine's bits."""
    import numpy as np

    from rollout_audit.faults import FAULTS, declared_components, detect, read_records, write_records

    rng = np.random.default_rng(0)
    trajs, ups = (_jitter(r, rng, 1e-5) for r in read_records(FIXTURES / "compliant"))
    write_records(tmp_path / "compliant", trajs, ups, reward_components=declared_components(FIXTURES / "compliant"))
    assert serious(ra.audit(tmp_path / "compliant")).is_empty()
    for name in FAULTS:
        row = detect(name, trajs, ups, tmp_path)
        assert not row.missed and not row.unexpected and row.named, (name, row)
