"""The named faults grouped into shared logs, for tests that need every fault under a costly
setting (a log split in partitions, streamed in small batches, one file per trajectory): the
faults of a group expect disjoint codes and break different trajectories, so one audit of the
group's log shows each fault's codes on the trajectories it touched and nothing else.

The groups were found by applying faults together and keeping a fault in a group only where
`problems` stays empty on the synthetic log (one file and three partitions) and on the
compliant fixture (two and three partitions). A new fault goes into a group, or its own.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from rollout_audit.contract.config import Config
from rollout_audit.faults import FAULTS, apply, write_records

GROUPS: tuple[tuple[str, ...], ...] = (
    (
        "missing_loss_mask",
        "duplicate_shard_row",
        "token_turn_out_of_range",
        "turn_policy_count_off_by_one",
        "turn_separator_dropped",
        "retokenized_from_text",
        "turn_logprob_from_base_softmax",
        "logprob_on_template_tokens",
    ),
    (
        "mask_length_mismatch",
        "tool_tokens_trained",
        "policy_tokens_unmasked",
        "trainable_count_whole_transcript",
        "template_reapplied_drops_separator",
        "positive_logprob",
        "placeholder_logprob_on_eos",
        "decoding_params_dropped",
    ),
    ("corrupt_file",),
    (
        "two_stop_flags",
        "stop_reason_contradicts_flag",
        "engine_crash_scored_zero",
        "truncation_scored_as_failure",
        "length_cap_logged_as_success",
        "budget_cut_logged_as_terminated",
        "reward_components_mismatch",
        "progress_bonus_not_potential",
    ),
    (
        "potential_chain_broken",
        "terminal_potential_nonzero",
        "td_terminal_value_zeroed",
        "return_without_shaping",
        "action_loop",
        "verifier_inverted",
        "policy_version_missing",
        "policy_version_decreasing",
    ),
    (
        "first_visit_paid_twice",
        "stale_batch_beyond_lag",
        "denominator_batch_size_for_token_reduction",
        "advantages_population_std",
        "update_names_missing_trajectory",
        "environment_version_missing",
        "reset_not_reproducible",
    ),
    ("loss_over_whole_transcript", "advantages_on_degenerate_group"),
    ("excluded_trajectory_trained",),
    ("masked_tokens_in_numerator", "reward_on_padding_token", "rejected_in_group_statistics"),
    ("truncation_paid_as_success", "kl_accumulated_over_tool_tokens"),
)
RECORD_GROUPS = tuple(g for g in GROUPS if not any(FAULTS[n].file_level for n in g))  # no truncated file


def group_id(group: tuple[str, ...]) -> str:
    return group[0] if len(group) == 1 else f"{group[0]}+{len(group) - 1}"


def config(group: tuple[str, ...]) -> Config:
    """The audit configuration every fault of the group needs (their settings do not overlap)."""
    return Config.from_mapping({k: v for n in group for k, v in FAULTS[n].config.items()})


def write_group(
    dst: Path, group: tuple[str, ...], trajs: list[dict], updates: list[dict], parts: int = 1
) -> tuple[list[dict], dict[str, list[str]]]:
    """Apply the group's faults in turn (the k-th with seed k, so that they pick different
    targets), write the log under `dst`; the broken trajectories and each fault's touched ids."""
    touched = {}
    for k, name in enumerate(group):
        (trajs, updates), touched[name] = apply(name, trajs, updates, seed=k)
    declares = {c: how for n in group for c, how in FAULTS[n].declares.items()}
    corrupt = any(FAULTS[n].file_level for n in group)
    write_records(dst, trajs, updates, parts=parts, corrupt=corrupt, reward_components=declares)
    return trajs, touched


def problems(group: tuple[str, ...], findings: pl.DataFrame, trajs: list[dict], touched: dict) -> list[str]:
    """How the group's audit differs from each fault caught exactly on its own: a fault's code
    missing, a touched trajectory not named by its fault's codes, a code no fault of the group
    expects, or a finding on a trajectory that no fault expecting that code touched (E802 names
    every episode of the broken reset key)."""
    serious = findings.filter(pl.col("severity").is_in(["error", "warning"]))
    found = set(serious["code"].to_list())
    out = [f"unexpected {c}" for c in sorted(found - set().union(*(FAULTS[n].codes for n in group)))]
    scope = {n: _reset_peers(trajs, touched[n]) if "E802" in FAULTS[n].codes else set(touched[n]) for n in group}
    for n in group:
        codes = FAULTS[n].codes
        out += [f"{n}: missed {c}" for c in sorted(codes - found)]
        named = set(serious.filter(pl.col("code").is_in(list(codes)))["trajectory_id"].drop_nulls().to_list())
        out += [f"{n}: {t} not named" for t in sorted(set(touched[n]) - named)]
    for code, tid in serious.select("code", "trajectory_id").unique().iter_rows():
        if tid is not None and not any(code in FAULTS[n].codes and tid in scope[n] for n in group):
            out.append(f"{code} on {tid}, which no fault expecting it touched")
    return out


def _reset_peers(trajs: list[dict], ids: list[str]) -> set[str]:
    """The trajectories sharing a reset key (environment, version, seed) with any of `ids`."""
    key = lambda t: (t["environment_id"], t["environment_version"], t["reset_seed"])
    keys = {key(t) for t in trajs if t["trajectory_id"] in ids}
    return {t["trajectory_id"] for t in trajs if key(t) in keys}
