"""The named faults grouped into shared logs, for tests that need every fault under a costly
setting (a log split in partitions, streamed in small batches, one file per trajectory): the
faults of a group expect disjoint codes and break different trajectories, so one audit of the
group's log shows each fault's codes on the trajectories it touched and nothing else.

A fault declares its group (`@fault(..., group=...)`); one that declares none has a log of its
own. A fault joins a group only where `problems` stays empty on the synthetic log (one file and
three partitions) and on the compliant fixture (two and three partitions).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from rollout_audit.contract.config import Config
from rollout_audit.faults import FAULTS, apply, groups, matrix_config, write_records

GROUPS = groups()  # from each fault's declared `group`
RECORD_GROUPS = tuple(g for g in GROUPS if not any(FAULTS[n].file_level for n in g))  # no truncated file


def group_id(group: tuple[str, ...]) -> str:
    return group[0] if len(group) == 1 else f"{group[0]}+{len(group) - 1}"


def config(group: tuple[str, ...]) -> Config:
    """The audit configuration every fault of the group needs (their settings do not overlap)."""
    return matrix_config({k: v for n in group for k, v in FAULTS[n].settings.items()})


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
