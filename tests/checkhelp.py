"""Helpers shared by the check-family tests (M, L, P): which codes fired, token positions
by provenance, and the compliant trajectory the mask edits use."""

from __future__ import annotations

import polars as pl

import rollout_audit as ra
from rollout_audit.contract.config import Config

# t000013 of the `records` fixture: 6 turns, version 0, collector-truncated, in no update, so
# editing its mask or counts leaves the update checks (U601/U602) alone
EXCLUDED = 13


def loud(rep) -> set[str]:
    """Codes of error and warning findings."""
    return rep.codes("error") | rep.codes("warning")


def only(rep, code: str) -> pl.DataFrame:
    """The findings of `code`, asserting that no other error or warning code fired."""
    assert loud(rep) == {code}, rep.render()
    return rep.findings.filter(pl.col("code") == code)


def positions(tr: dict, source: int, turn: int | None = None) -> list[int]:
    """Token positions of a trajectory record with token_source `source` (and token_turn `turn`)."""
    return [
        i
        for i, (s, t) in enumerate(zip(tr["token_source"], tr["token_turn"]))
        if s == source and (turn is None or t == turn)
    ]


def drop_turn_field(trajs: list[dict], name: str) -> None:
    for tr in trajs:
        for t in tr["turns"]:
            del t[name]


def audit(trajs, updates, **cfg):
    """Audit in-memory records with configuration keys as keyword arguments."""
    return ra.audit(trajs, updates, config=Config(**cfg))


def rows(rep, code: str) -> pl.DataFrame:
    """The findings of `code`."""
    return rep.findings.filter(pl.col("code") == code)
