"""Faults the structure checks (S) must catch."""

from __future__ import annotations

import copy

from .base import Ctx, fault


@fault("missing_loss_mask", {"S001"}, group="tokens-1")
def missing_loss_mask(ctx: Ctx) -> list[str]:
    """The exporter dropped the loss_mask column (the trainer would rebuild it from roles)."""
    for t in ctx.trajs:
        del t["loss_mask"]
    return []


@fault("duplicate_shard_row", {"S002"}, group="tokens-1")
def duplicate_shard_row(ctx: Ctx) -> list[str]:
    """A retried writer emitted an excluded episode twice under the same trajectory_id."""
    t = ctx.pick(lambda t: t["reward"] is None, "excluded trajectory")
    ctx.trajs.append(copy.deepcopy(t))
    return [t["trajectory_id"]]


@fault("mask_length_mismatch", {"S003"}, group="tokens-2")
def mask_length_mismatch(ctx: Ctx) -> list[str]:
    """The loss mask was built from a different tokenization: one element short."""
    t = ctx.pick()
    t["loss_mask"] = t["loss_mask"][:-1]
    return [t["trajectory_id"]]


@fault("token_turn_out_of_range", {"S004"}, group="tokens-1")
def token_turn_out_of_range(ctx: Ctx) -> list[str]:
    """The last observation is tagged with a turn that does not exist."""
    t = ctx.pick()
    t["token_turn"][-1] = len(t["turns"]) + 1
    return [t["trajectory_id"]]


@fault("corrupt_file", {"S005", "U605"}, file_level=True)
def corrupt_file(ctx: Ctx) -> list[str]:
    """A shard was truncated mid-write (no atomic publish): the Parquet footer is gone.

    The updates still name the shard's trajectories, which the log no longer holds (U605).
    """
    return []
