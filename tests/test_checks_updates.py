"""Updates and reduction: U601-U606 recompute each update's denominator, advantages and batch
membership from the trajectories it names."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import write_log

import rollout_audit as ra
from rollout_audit.contract.config import Config

U = {"U601", "U602", "U603", "U604", "U605", "U606"}


def blocking(rep) -> set[str]:
    return rep.codes("error") | rep.codes("warning")


def of(rep, code) -> pl.DataFrame:
    return rep.findings.filter(pl.col("code") == code)


def by_id(trajs):
    return {t["trajectory_id"]: t for t in trajs}


def recompute(rewards_by_group: dict[str, list[float]], estimator: str, eps: float = 1e-6) -> dict:
    """Independent numpy recomputation, per group: list of advantages in member order."""
    out = {}
    for g, rs in rewards_by_group.items():
        r = np.asarray(rs, dtype=np.float64)
        n = len(r)
        if estimator == "reinforce":
            a = r
        elif n < 2:
            a = np.zeros(n)
        elif estimator == "grpo":
            a = (r - r.mean()) / (r.std(ddof=1) + eps)
        elif estimator == "grpo_population_std":
            a = (r - r.mean()) / (r.std(ddof=0) + eps)
        elif estimator == "grpo_no_std":
            a = r - r.mean()
        elif estimator == "rloo":
            a = r - (r.sum() - r) / (n - 1)
        out[g] = list(a)
    return out


def set_advantages(trajs, update, estimator, key="group_id", eps=1e-6):
    tb = by_id(trajs)
    groups: dict[str, list[str]] = {}
    for tid in update["trajectory_ids"]:
        groups.setdefault(tb[tid][key] or tb[tid]["task_id"], []).append(tid)
    adv = {}
    for g, a in recompute({g: [tb[t]["reward"] for t in ids] for g, ids in groups.items()}, estimator, eps).items():
        adv.update(zip(groups[g], a))
    update["advantages"] = [adv[t] for t in update["trajectory_ids"]]
    update["advantage_estimator"] = estimator


def informative_member(trajs, update):
    """(index in batch, trajectory_id) of a member of a group whose rewards differ."""
    tb = by_id(trajs)
    groups: dict[str, set] = {}
    for tid in update["trajectory_ids"]:
        groups.setdefault(tb[tid]["group_id"], set()).add(tb[tid]["reward"])
    for k, tid in enumerate(update["trajectory_ids"]):
        if len(groups[tb[tid]["group_id"]]) > 1:
            return k, tid
    raise AssertionError("no informative group in the synthetic update")


def degenerate_member(trajs, update):
    tb = by_id(trajs)
    groups: dict[str, set] = {}
    for tid in update["trajectory_ids"]:
        groups.setdefault(tb[tid]["group_id"], set()).add(tb[tid]["reward"])
    for k, tid in enumerate(update["trajectory_ids"]):
        if len(groups[tb[tid]["group_id"]]) == 1:
            return k, tid
    raise AssertionError("no degenerate group in the synthetic update")


def trainable(trajs, ids):
    tb = by_id(trajs)
    return sum(sum(tb[t]["loss_mask"]) for t in ids)


# ---------------------------------------------------------------- compliant


def test_compliant_log_is_silent(records):
    rep = ra.audit(*records)
    assert not (rep.codes() & U)
    assert not blocking(rep)
    assert not (set(rep.not_run) & U)


# ---------------------------------------------------------------- U601


def test_u601_token_denominator_too_small(records):
    trajs, ups = records
    expected = trainable(trajs, ups[1]["trajectory_ids"])
    ups[1]["loss_denominator"] = float(expected - 10)
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U601"}
    f = of(rep, "U601")
    assert f.height == 1
    msg = f["message"][0]
    assert "update 1 (reduction token)" in msg
    assert f"loss_denominator {expected - 10} recorded, expected {expected}" in msg
    assert f["trajectory_id"][0] is None


def test_u601_turn_and_trajectory_reductions(records):
    trajs, ups = records
    tb = by_id(trajs)
    turns = sum(len(tb[t]["turns"]) for t in ups[0]["trajectory_ids"])  # every synthetic turn has policy tokens
    ups[0]["reduction"], ups[0]["loss_denominator"] = "turn", float(turns)
    ups[1]["reduction"], ups[1]["loss_denominator"] = "trajectory", float(len(ups[1]["trajectory_ids"]))
    assert not (ra.audit(trajs, ups).codes() & U)
    ups[0]["loss_denominator"] = float(turns + 3)
    ups[1]["loss_denominator"] = 1.0
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U601"}
    msgs = sorted(of(rep, "U601")["message"].to_list())
    assert f"expected {turns} = Σ turns with a trainable token" in msgs[0]
    assert f"loss_denominator 1 recorded, expected {len(ups[1]['trajectory_ids'])} = the batch size" in msgs[1]


def test_u601_turn_reduction_counts_only_turns_with_trainable_tokens(records):
    trajs, ups = records
    tb = by_id(trajs)
    tid = ups[0]["trajectory_ids"][0]
    t = tb[tid]
    # mask out every policy token of turn 0: that turn no longer counts, the recorded counts follow
    t["loss_mask"] = [m and tt != 0 for m, tt in zip(t["loss_mask"], t["token_turn"])]
    t["num_trainable_tokens"] = sum(t["loss_mask"])
    turns = sum(len(tb[x]["turns"]) for x in ups[0]["trajectory_ids"])
    ups[0]["reduction"], ups[0]["loss_denominator"] = "turn", float(turns)
    rep = ra.audit(trajs, ups, select=["U"])
    assert rep.codes() == {"U601"}
    assert f"loss_denominator {turns} recorded, expected {turns - 1}" in of(rep, "U601")["message"][0]


@pytest.mark.parametrize("value", [0.0, -4.0, float("nan"), float("inf")])
def test_u601_constant_needs_positive_finite(records, value):
    trajs, ups = records
    ups[0]["reduction"], ups[0]["loss_denominator"] = "constant", 4096.0
    assert not (ra.audit(trajs, ups).codes() & U)
    ups[0]["loss_denominator"] = value
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U601"}
    assert "is not a positive finite number" in of(rep, "U601")["message"][0]


def test_u601_empty_batch_recomputes_to_zero(records):
    trajs, ups = records
    ups.append(
        {
            "update_step": 2,
            "trainer_version": 2,
            "trajectory_ids": [],
            "reduction": "token",
            "loss_denominator": 0.0,
            "advantages": [],
            "advantage_estimator": "grpo",
            "max_policy_lag": 0,
        }
    )
    assert not (ra.audit(trajs, ups).codes() & U)
    ups[-1]["loss_denominator"] = 8.0
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U601"}
    assert "update 2 (reduction token): loss_denominator 8 recorded, expected 0" in of(rep, "U601")["message"][0]


def test_u601_unknown_reduction(records):
    trajs, ups = records
    ups[1]["reduction"] = "mean"
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U601"}
    assert "reduction mean is not one of token, token_window, turn, trajectory" in of(rep, "U601")["message"][0]


# ---------------------------------------------------------------- U602


def test_u602_denominator_counts_every_token(records):
    trajs, ups = records
    ids = ups[0]["trajectory_ids"]
    tb = by_id(trajs)
    total = sum(len(tb[t]["token_ids"]) for t in ids)
    pol = trainable(trajs, ids)
    ups[0]["loss_denominator"] = float(total)
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U601", "U602"}  # the same defect: wrong value, and diluted
    msg = of(rep, "U602")["message"][0]
    factor = round(total / pol, 2)
    assert f"{total}/{pol} = {factor:g}" in msg and f"scaled down {factor:g}x" in msg
    assert f"it equals every token of the {len(ids)} sequences, {total - pol} of them not sampled" in msg


def test_u602_silent_when_denominator_is_not_larger(records):
    trajs, ups = records
    ups[0]["loss_denominator"] = float(trainable(trajs, ups[0]["trajectory_ids"]) - 1)
    rep = ra.audit(trajs, ups)
    assert "U602" not in rep.codes() and "U601" in rep.codes()
    ups[0]["loss_denominator"] = float(trainable(trajs, ups[0]["trajectory_ids"]) + 7)
    ups[0]["reduction"] = "constant"  # a token count under another reduction is not a dilution claim
    assert not (ra.audit(trajs, ups).codes() & U)


# ---------------------------------------------------------------- U603


def test_u603_wrong_advantage_named(records):
    trajs, ups = records
    k, tid = informative_member(trajs, ups[1])
    ups[1]["advantages"][k] += 0.25
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U603"}
    f = of(rep, "U603")
    assert f["trajectory_id"].to_list() == [tid]
    assert "update 1 (grpo)" in f["message"][0] and "expected" in f["message"][0]


@pytest.mark.parametrize("estimator", ["grpo_no_std", "rloo", "reinforce", "grpo_population_std"])
def test_u603_other_estimators_recomputed(records, estimator):
    trajs, ups = records
    for u in ups:
        set_advantages(trajs, u, estimator)
    assert not (ra.audit(trajs, ups).codes() & U)
    ups[0]["advantage_estimator"] = "grpo"  # advantages of another estimator under the grpo label
    rep = ra.audit(trajs, ups)
    # reinforce's A = R is also non-zero in an all-success (degenerate) group: U604 joins in then
    assert blocking(rep) == ({"U603", "U604"} if estimator == "reinforce" else {"U603"})
    assert set(of(rep, "U603")["trajectory_id"]) <= set(ups[0]["trajectory_ids"])


def test_u603_population_std_singleton_groups(records):
    """rllm#776: every repeat of a prompt grouped alone, so each kept its raw reward as its
    advantage (the size-1 branch: mean 0, std 1) under GRPO with the population std."""
    trajs, ups = records
    for u in ups:
        set_advantages(trajs, u, "grpo_population_std")
    assert not (ra.audit(trajs, ups).codes() & U)
    tb = by_id(trajs)
    ups[1]["advantages"] = [tb[t]["reward"] for t in ups[1]["trajectory_ids"]]
    rep = ra.audit(trajs, ups)
    assert "U603" in blocking(rep)
    _, tid = informative_member(trajs, ups[1])
    assert tid in set(of(rep, "U603")["trajectory_id"]) <= set(ups[1]["trajectory_ids"])
    assert "grpo_population_std" in of(rep, "U603")["message"][0]


def test_u603_uses_configured_epsilon(records):
    trajs, ups = records
    for u in ups:
        set_advantages(trajs, u, "grpo", eps=0.5)
    assert "U603" in ra.audit(trajs, ups).codes()
    assert not (ra.audit(trajs, ups, config=ra.Config(grpo_epsilon=0.5)).codes() & U)


def test_u603_groups_fall_back_to_task_id(records):
    trajs, ups = records
    for t in trajs:
        t["group_id"] = None
    assert not (ra.audit(trajs, ups).codes() & U)  # one group per task per batch, as before
    # a task split into two groups: recorded advantages are now grouped by group_id
    tb = by_id(trajs)
    for tid in ups[1]["trajectory_ids"]:
        tb[tid]["group_id"] = f"{tb[tid]['task_id']}/{tid}"
    rep = ra.audit(trajs, ups)
    # every member is now a group of one (advantage 0 expected, and a group of one is degenerate)
    assert blocking(rep) == {"U603", "U604"}
    nonzero = {t for t, a in zip(ups[1]["trajectory_ids"], ups[1]["advantages"]) if abs(a) > 1e-4}
    assert nonzero and set(of(rep, "U603")["trajectory_id"]) == nonzero == set(of(rep, "U604")["trajectory_id"])


def test_u603_misaligned_and_unknown_estimator(records):
    trajs, ups = records
    ups[0]["advantages"] = ups[0]["advantages"][:-1]
    ups[1]["advantage_estimator"] = "ppo"
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U603"}
    msgs = sorted(of(rep, "U603")["message"].to_list())
    n = len(ups[0]["trajectory_ids"])
    assert msgs[0] == f"update 0: {n - 1} advantages for {n} trajectory_ids (they must be aligned)"
    assert "advantage_estimator ppo is not one of" in msgs[1]


def test_u603_u604_not_run_without_advantages(records):
    trajs, ups = records
    for u in ups:
        del u["advantages"], u["advantage_estimator"]
    rep = ra.audit(trajs, ups)
    assert {"U603", "U604"} <= set(rep.not_run)
    assert "updates.advantages" in rep.not_run["U603"]
    assert not blocking(rep)


# ---------------------------------------------------------------- U604


def test_u604_degenerate_group_with_nonzero_advantage(records):
    trajs, ups = records
    for u in ups:
        del u["advantage_estimator"]  # U603 cannot run; U604 still can
    k, tid = degenerate_member(trajs, ups[0])
    ups[0]["advantages"][k] = 0.3
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U604"}
    assert "U603" in rep.not_run
    f = of(rep, "U604")
    assert f["trajectory_id"].to_list() == [tid]
    assert "is degenerate" in f["message"][0] and "advantage 0.3 is recorded, expected 0" in f["message"][0]


def test_u604_fires_with_u603_and_skips_reinforce(records):
    trajs, ups = records
    k, tid = degenerate_member(trajs, ups[0])
    ups[0]["advantages"][k] = float("nan")
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U603", "U604"}
    assert of(rep, "U604")["trajectory_id"].to_list() == [tid]
    for u in ups:
        set_advantages(trajs, u, "reinforce")  # A = R: non-zero in all-success groups, by design
    assert not (ra.audit(trajs, ups).codes() & U)


# ---------------------------------------------------------------- U605, U606


def test_u605_unknown_trajectory(records):
    trajs, ups = records
    ups[1]["trajectory_ids"][2] = "ghost-17"
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U605"}  # denominator and advantages of that update are not recomputed
    f = of(rep, "U605")
    assert f["trajectory_id"].to_list() == ["ghost-17"]
    assert "update 1 names trajectory ghost-17 (batch position 2), which is not in the log" == f["message"][0]


def test_u605_is_no_cascade_when_no_trajectory_was_read(records):
    """Updates alone: nothing to audit (exit 2, one reason), not one U605 per batch member."""
    _, ups = records
    rep = ra.audit(None, ups, select=["U605"])
    assert rep.exit_code() == 2 and rep.unusable == "the log holds no trajectory records"
    assert of(rep, "U605").is_empty()


def test_u606_truncated_episode_in_update(records):
    trajs, ups = records
    trunc = next(
        t
        for t in trajs
        if t["truncated"]
        and t["trajectory_id"] not in ups[0]["trajectory_ids"]
        and t["trajectory_id"] < ups[1]["trajectory_ids"][0]
    )
    ups[0]["trajectory_ids"].append(trunc["trajectory_id"])
    ups[0]["advantages"].append(0.0)
    ups[0]["loss_denominator"] += sum(trunc["loss_mask"])
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U606"}
    f = of(rep, "U606")
    assert f["trajectory_id"].to_list() == [trunc["trajectory_id"]]
    assert "collector-truncated episode (stop_reason max_turns) under truncation = exclude" in f["message"][0]


def test_u606_infra_error_episode_in_update(records):
    trajs, ups = records
    tid = ups[1]["trajectory_ids"][0]
    t = by_id(trajs)[tid]
    t.update(terminated=False, infra_error=True, stop_reason="env_error", reward=None, verifier_success=False)
    rep = ra.audit(trajs, ups)
    assert "U606" in blocking(rep)
    assert blocking(rep) <= {"U606", "T303"}  # T303 reports the same infra_error episode from its side
    f = of(rep, "U606")
    assert f["trajectory_id"].to_list() == [tid]
    assert "infra_error episode (stop_reason env_error)" in f["message"][0]


def test_findings_name_the_update_file(tmp_path, records):
    trajs, ups = records
    ups[1]["trajectory_ids"][0] = "ghost"
    root = write_log(tmp_path / "log", trajs, ups, parts=2)
    rep = ra.audit(str(root))
    f = of(rep, "U605")
    assert f["file"].to_list() == [str(root / "updates" / "updates.parquet")]
    assert blocking(rep) == {"U605"}


# ---------------------------------------------------------------- contract 1.1 reductions


def test_u601_token_window_recomputed_over_the_window(records):
    trajs, ups = records
    window = ups[0]["trajectory_ids"] + ups[1]["trajectory_ids"]  # one generation batch, two updates
    scale = 0.5  # TRL dapo: GA 1 / steps_per_generation 2
    for u in ups[:2]:
        u.update(
            reduction="token_window",
            window_trajectory_ids=window,
            denominator_scale=scale,
            loss_denominator=trainable(trajs, window) * scale,
        )
    assert not (ra.audit(trajs, ups).codes() & U)
    ups[1]["loss_denominator"] = float(trainable(trajs, ups[1]["trajectory_ids"]))  # the update's own count
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U601"}
    msg = of(rep, "U601")["message"][0]
    assert f"expected {num(trainable(trajs, window) * scale)} = Σ trainable tokens over the {len(window)} " in msg
    assert "× denominator_scale 0.5" in msg and "recorded/expected = " in msg


def test_u601_token_window_as_a_count_and_without_a_window(records):
    trajs, ups = records
    ups[0].update(reduction="token_window", window_tokens=1000.0, denominator_scale=0.25, loss_denominator=250.0)
    assert not (ra.audit(trajs, ups).codes() & U)
    del ups[0]["window_tokens"]
    rep = ra.audit(trajs, ups)
    assert "neither window_trajectory_ids nor window_tokens is recorded" in of(rep, "U601")["message"][0]


@pytest.mark.parametrize("reduction", ["seq_mean_token_mean", "seq_mean_token_sum"])
def test_u601_per_sequence_reductions_with_scale(records, reduction):
    trajs, ups = records
    b = len(ups[0]["trajectory_ids"])
    ups[0].update(reduction=reduction, denominator_scale=4.0, loss_denominator=float(4 * b))  # TRL grpo with GA 4
    assert not (ra.audit(trajs, ups).codes() & U)
    ups[0]["loss_denominator"] = float(b)  # the /GA forgotten
    rep = ra.audit(trajs, ups)
    assert blocking(rep) == {"U601"}
    assert f"expected {4 * b} = the batch size × denominator_scale 4" in of(rep, "U601")["message"][0]


def test_u601_constant_with_a_declared_scale(records):
    trajs, ups = records
    b = len(ups[0]["trajectory_ids"])
    ups[0].update(reduction="constant", denominator_scale=512.0, loss_denominator=512.0 * b)  # Dr. GRPO
    assert not (ra.audit(trajs, ups).codes() & U)
    ups[0]["loss_denominator"] = 512.0
    assert blocking(ra.audit(trajs, ups)) == {"U601"}


def test_u603_groups_formed_in_the_window(records):
    trajs, ups = records
    window = ups[0]["trajectory_ids"]
    whole = {"trajectory_ids": window}
    set_advantages(trajs, whole, "grpo")  # normalised over the generation batch, as TRL does
    adv = dict(zip(window, whole["advantages"]))
    halves = [window[0::2], window[1::2]]  # trained in two updates: every group is split between them
    split = [
        {
            **ups[0],
            "update_step": k,
            "trajectory_ids": h,
            "advantages": [adv[t] for t in h],
            "advantage_estimator": "grpo",
            "reduction": "token_window",
            "window_trajectory_ids": window,
            "loss_denominator": float(trainable(trajs, window)),
        }
        for k, h in enumerate(halves)
    ]
    assert not (ra.audit(trajs, split).codes() & U)
    for u in split:  # without the window, each half is grouped on its own: the advantages do not recompute
        del u["window_trajectory_ids"]
        u["window_tokens"] = float(trainable(trajs, window))
    assert "U603" in ra.audit(trajs, split).codes()


def test_v1_update_audits_unchanged(records, tmp_path):
    trajs, ups = records
    path = write_log(tmp_path, trajs, ups)
    for f in path.rglob("*.parquet"):
        assert pq.read_schema(f).metadata[b"rollout_log.schema_version"] == b"1"  # no 1.1 column: a v1 file
    assert not (ra.audit(path).codes() & U)


def num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# ---------------------------------------------------------------- U607, U608 (contract 1.2 evidence)


def evidenced(records):
    from rollout_audit.synth import record_loss_evidence

    trajs, ups = records
    record_loss_evidence(trajs, ups)
    return trajs, ups


def test_u607_u608_silent_on_compliant_evidence_and_not_run_without_it(records):
    rep = ra.audit(*evidenced(records))
    assert not blocking(rep) and not {"U607", "U608"} & set(rep.not_run)
    bare = ra.audit(*make_bare(records))
    assert {"U607", "U608"} <= set(bare.not_run)


def make_bare(records):
    trajs, ups = records
    return trajs, [{k: v for k, v in u.items() if k not in ("numerator_tokens", "stat_trajectory_ids")} for u in ups]


def test_u607_numerator_summing_every_token(records):
    trajs, ups = evidenced(records)
    tid = ups[0]["trajectory_ids"][2]
    t = by_id(trajs)[tid]
    ups[0]["numerator_tokens"][2] = len(t["token_ids"])
    rep = ra.audit(trajs, ups)
    f = of(rep, "U607")
    assert blocking(rep) == {"U607"} and f["trajectory_id"].to_list() == [tid]
    outside = len(t["token_ids"]) - sum(t["loss_mask"])
    assert (
        f"expected {sum(t['loss_mask'])}" in f["message"][0]
        and f"{outside} token(s) outside the loss mask" in f["message"][0]
    )


def test_u607_missing_trainable_tokens_and_misaligned_list(records):
    trajs, ups = evidenced(records)
    ups[0]["numerator_tokens"][0] -= 1
    ups[1]["numerator_tokens"] = ups[1]["numerator_tokens"][:-1]
    f = of(ra.audit(trajs, ups), "U607")
    assert "1 trainable token(s) are missing" in f.filter(pl.col("trajectory_id").is_not_null())["message"][0]
    assert f.filter(pl.col("trajectory_id").is_null())["message"].str.contains("must be aligned").all()


def test_u608_excluded_episode_in_the_group_statistics(records):
    trajs, ups = evidenced(records)
    excluded = next(t for t in trajs if t["reward"] is None)["trajectory_id"]
    ups[0]["stat_trajectory_ids"].append(excluded)
    rep = ra.audit(trajs, ups)
    f = of(rep, "U608")
    assert blocking(rep) == {"U608"} and f["trajectory_id"].to_list() == [excluded]
    assert "collector-truncated episode" in f["message"][0] and "stat_trajectory_ids" in f["message"][0]


def test_u608_allows_a_valid_episode_counted_but_not_trained(records):
    """An episode in the statistics but masked out of the loss is a trainer's choice (TRL's masked
    truncation, SkyRL's overlong filtering), not an exclusion."""
    trajs, ups = evidenced(records)
    ups[0]["trajectory_ids"] = ups[0]["trajectory_ids"][1:]
    for c in ("advantages", "numerator_tokens"):
        ups[0][c] = ups[0][c][1:]
    ups[0]["loss_denominator"] = float(trainable(trajs, ups[0]["trajectory_ids"]))
    assert not {"U606", "U608"} & blocking(ra.audit(trajs, ups))


def test_u603_fault_singleton_groups_caught(records):
    from rollout_audit.faults import apply

    trajs, ups = records
    (t2, u2), touched = apply("advantages_singleton_groups", trajs, ups)
    rep = ra.audit(t2, u2)
    assert "U603" in blocking(rep) and set(touched) <= set(of(rep, "U603")["trajectory_id"])


# ---------------------------------------------------------------- U609 (in preview), U610 (contract 1.4)

PREVIEW = Config(preview=True)


def with_reducer(trajs, ups, mode="token_mean_step"):
    """Every update records the divisor a compliant reducer of `mode` applies."""
    for u in ups:
        ids = u["trajectory_ids"]
        u["reducer_mode"] = mode
        u["reducer_divisor"] = float(trainable(trajs, ids) if mode.startswith("token") else len(ids))
    return trajs, ups


def with_anchor(trajs, ups, anchor="current", correction="none"):
    for u in ups:
        u.update(ratio_anchor=anchor, ratio_correction=correction, ratio_clipping=True)
    return trajs, ups


def stale(trajs, update, every=3):
    """Every `every`-th member of `update` sampled one version before the update's weights."""
    tb = by_id(trajs)
    ids = update["trajectory_ids"][::every]
    for tid in ids:
        for tr in tb[tid]["turns"]:
            tr["policy_version"] = update["trainer_version"] - 1
    update["max_policy_lag"] = 1
    return ids


@pytest.mark.parametrize("mode", ["token_mean_step", "token_mean", "seq_mean_step", "seq_mean"])
def test_u609_u610_silent_on_compliant_evidence(records, mode):
    trajs, ups = with_anchor(*with_reducer(*records, mode))
    rep = ra.audit(trajs, ups, config=PREVIEW)
    assert not rep.codes() & {"U609", "U610"} and not {"U609", "U610"} & set(rep.not_run)


def test_u609_u610_not_run_without_their_columns(records):
    rep = ra.audit(*records, config=PREVIEW)
    assert {"U609", "U610"} <= set(rep.not_run)


def test_u609_removed_sample_counted_as_one_token(records):
    trajs, ups = with_reducer(*records)
    tid = ups[1]["trajectory_ids"][4]
    t = by_id(trajs)[tid]
    t["loss_mask"] = [False] * len(t["loss_mask"])
    t["loss_excluded"], t["num_trainable_tokens"] = True, 0
    ups[1]["loss_denominator"] = float(trainable(trajs, ups[1]["trajectory_ids"]))
    right = trainable(trajs, ups[1]["trajectory_ids"])
    ups[1]["reducer_divisor"] = float(right + 1)  # max(|I_i|, 1) per sample
    rep = ra.audit(trajs, ups, config=PREVIEW)
    f = of(rep, "U609")
    assert blocking(rep) == {"U609"} and f["trajectory_id"].to_list() == [tid]
    msg = f["message"][0]
    assert f"reducer_divisor {right + 1} recorded, expected {right}" in msg and "one token" in msg


def test_u609_step_wide_divisor_spans_every_record_of_the_step(records):
    """Two micro-batch records of one optimizer step, each carrying the step's divisor: silent;
    a record carrying its own micro-batch count under token_mean_step is a finding."""
    trajs, ups = records
    ids = ups[0]["trajectory_ids"]
    half = len(ids) // 2
    second = {**ups[0], "trajectory_ids": ids[half:], "advantages": ups[0]["advantages"][half:]}
    first = {**ups[0], "trajectory_ids": ids[:half], "advantages": ups[0]["advantages"][:half]}
    for u in (first, second):
        u["loss_denominator"] = float(trainable(trajs, u["trajectory_ids"]))
        u["reducer_mode"], u["reducer_divisor"] = "token_mean_step", float(trainable(trajs, ids))
    ups = [first, second]
    assert "U609" not in ra.audit(trajs, ups, config=PREVIEW).codes()
    second["reducer_divisor"] = float(trainable(trajs, second["trajectory_ids"]))
    msg = of(ra.audit(trajs, ups, config=PREVIEW), "U609")["message"].to_list()
    assert len(msg) == 1 and "2 different reducer_divisor values" in msg[0]


def test_u609_seq_mean_counts_sequences_and_bad_values(records):
    trajs, ups = with_reducer(*records, "seq_mean")
    ups[0]["reducer_divisor"] = float(trainable(trajs, ups[0]["trajectory_ids"]))  # tokens, not sequences
    ups[1]["reducer_mode"] = "token-mean"  # a framework's spelling, not the contract's
    msgs = of(ra.audit(trajs, ups, config=PREVIEW), "U609")["message"].to_list()
    assert any(f"expected {len(ups[0]['trajectory_ids'])} = the " in m for m in msgs)
    assert any("reducer_mode token-mean is not one of" in m for m in msgs)


def test_u610_ratio_on_current_weights_with_a_stale_batch(records):
    trajs, ups = with_anchor(*records)
    ids = stale(trajs, ups[1])
    rep = ra.audit(trajs, ups, config=PREVIEW)
    f = of(rep, "U610")
    assert blocking(rep) == {"U610"} and sorted(f["trajectory_id"].to_list()) == sorted(ids)
    assert "weights at version 1" in f["message"][0] and "sampled at version 0" in f["message"][0]


@pytest.mark.parametrize(
    ("anchor", "correction"), [("behavior", "none"), ("current", "truncated_is"), ("proximal", "masked_is")]
)
def test_u610_silent_when_the_ratio_sees_or_corrects_the_lag(records, anchor, correction):
    trajs, ups = with_anchor(*records, anchor, correction)
    stale(trajs, ups[1])
    assert "U610" not in ra.audit(trajs, ups, config=PREVIEW).codes()


def test_u610_proximal_anchor_of_unknown_version_on_a_batch_of_two_versions(records):
    """Without the anchor's version, one recomputation anchors at most one of the batch's versions:
    the members below the newest are named."""
    trajs, ups = with_anchor(*records, "proximal")
    ids = stale(trajs, ups[1])
    f = of(ra.audit(trajs, ups, config=PREVIEW), "U610")
    assert sorted(f["trajectory_id"].to_list()) == sorted(ids) and "version not recorded" in f["message"][0]
    ups[1]["ratio_anchor_version"] = 0  # the weights that sampled the stale members: the others are named
    f = of(ra.audit(trajs, ups, config=PREVIEW), "U610")
    assert set(f["trajectory_id"]) == set(ups[1]["trajectory_ids"]) - set(ids)


def test_u610_a_masked_stale_turn_trains_nothing(records):
    trajs, ups = with_anchor(*records)
    for tid in stale(trajs, ups[1]):
        t = by_id(trajs)[tid]
        t["loss_mask"] = [False] * len(t["loss_mask"])
        t["loss_excluded"], t["num_trainable_tokens"] = True, 0
    ups[1]["loss_denominator"] = float(trainable(trajs, ups[1]["trajectory_ids"]))
    assert "U610" not in ra.audit(trajs, ups, config=PREVIEW).codes()


def test_u609_u610_bad_values_are_findings_not_crashes(records):
    trajs, ups = with_anchor(*with_reducer(*records))
    ups[0]["reducer_divisor"] = float("nan")
    ups[1]["ratio_anchor"] = "::error x::"
    ups[1]["ratio_anchor_version"] = 2**63 - 1
    rep = ra.audit(trajs, ups, config=PREVIEW)
    assert "reducer_divisor NaN is not a positive finite number" in of(rep, "U609")["message"][0]
    assert of(rep, "U610")["message"].str.contains("is not one of behavior, current, proximal").any()


def test_contract_1_4_update_columns_are_versioned(records, tmp_path):
    """A file with a 1.4 update column states 1.4; one without states what it uses and audits as
    before (the 1.4 columns are optional)."""
    from rollout_audit.contract import schema as S

    added = {"reducer_mode", "reducer_divisor", "ratio_anchor", "ratio_anchor_version"}
    added |= {"ratio_correction", "ratio_correction_cap", "ratio_clipping"}
    assert {c.name for c in S.columns("updates") if c.since == "1.4"} == added
    assert S.version_for("updates", ["update_step", "reducer_divisor"]) == "1.4"
    assert S.version_for("updates", ["update_step", "numerator_tokens"]) == "1.2"
    assert not added & set(S.arrow_schema("updates", "1.3").names) and added <= set(
        S.arrow_schema("updates", "1.4").names
    )
    trajs, ups = with_anchor(*with_reducer(*records))
    log = write_log(tmp_path / "log", trajs, ups)
    meta = pq.read_schema(next((log / "updates").iterdir())).metadata
    assert meta[b"rollout_log.schema_version"] == b"1.4"
    assert not ra.audit(str(log), config=PREVIEW).codes() & {"U609", "U610"}


# The update checks share the frames they derive from a view (the update records, the per-trajectory
# inputs, the batch members: each built once per set of declared inputs). What each of them finds
# beside every other check is what it finds alone, on logs where several of them fire.
@pytest.mark.parametrize("name", ["engine_crash_scored_zero", "loss_over_whole_transcript"])
def test_each_update_check_finds_alone_what_it_finds_beside_the_others(name):
    from pathlib import Path

    import rollout_audit.checks  # noqa: F401  (registers the checks)
    from rollout_audit.contract.registry import registered

    path = Path(__file__).resolve().parent.parent / "fixtures" / "broken" / name
    codes = sorted(
        c for c, r in registered().items() if r.func.__module__ == "rollout_audit.checks.updates" and not r.preview
    )
    full = ra.audit(path)
    assert len(full.codes() & set(codes)) >= 2, full.codes()  # several update checks fire together
    for code in codes:
        alone = ra.audit(path, select=[code])
        assert of(alone, code).sort(pl.all()).to_dicts() == of(full, code).sort(pl.all()).to_dicts(), code
