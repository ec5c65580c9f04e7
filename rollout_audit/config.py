"""Audit configuration: `[tool.rollout-audit]` in pyproject.toml, or a `--config` TOML file."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class Config:
    """Every tunable of the audit, with its default. Tolerances compare in float64."""

    select: list[str] = field(default_factory=list)  # codes or prefixes; empty = all
    ignore: list[str] = field(default_factory=list)
    # |found - expected| <= atol + rtol * |expected|
    atol: float = 1e-4
    rtol: float = 1e-5
    logprob_atol: float = 1e-3  # L202: float32 token log-probs summed in float64
    truncation: str = "exclude"  # exclude | bootstrap | penalize
    extra_stop_reasons: dict[str, str] = field(default_factory=dict)  # reason -> flag
    first_visit_components: list[str] = field(default_factory=list)
    loop_length: int = 4
    max_policy_lag: int | None = None  # used when an update does not state its bound
    reward_rule: str = "monotone"  # monotone | binary
    grpo_epsilon: float = 1e-6
    difficulty_band: tuple[float, float] = (0.05, 0.95)
    max_examples: int = 20  # findings shown per code in text output
    masked_ok_reasons: list[str] = field(default_factory=list)  # M102: finish reasons that may mask policy tokens
    # Replay (L205-L207): trajectories replayed, stratified by policy version; 0 = off (`check --replay N`)
    replay: int = 0
    replayer: str | None = None  # "module:factory" returning a replayer, e.g. "reference_agent.replay:replayer"
    # version -> local checkpoint (a {"3": "ckpt/step-3"} table, or a template "ckpt/step-{version}")
    replay_checkpoints: dict[str, str] | str | None = None
    replay_endpoints: dict[str, str] = field(default_factory=dict)  # version -> OpenAI-compatible base URL (…/v1)
    replay_batch_size: int = 8  # trajectories per forward pass / request
    replay_atol: float = 1e-3  # L205/L206: per-token |replayed - recorded| tolerance (float32 engines)
    replay_max_share: float = 0.0  # L205: share of replayed tokens allowed over the tolerance
    compare_logprobs: str | None = None  # L207: a second per-token log-prob column (e.g. the trainer's recomputation)
    max_turn_log_ratio: float = 0.6931  # L207: |log π_other/π_beh| of a turn above this (ln 2) is extreme

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> Config:
        known = {f.name for f in fields(cls)}
        norm = {k.replace("-", "_"): v for k, v in data.items()}
        unknown = sorted(set(norm) - known)
        if unknown:
            raise ValueError(f"unknown configuration key(s): {', '.join(unknown)}")
        cfg = cls(**norm)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.truncation not in ("exclude", "bootstrap", "penalize"):
            raise ValueError(f"truncation must be exclude, bootstrap or penalize, not {self.truncation!r}")
        if self.reward_rule not in ("monotone", "binary"):
            raise ValueError(f"reward_rule must be monotone or binary, not {self.reward_rule!r}")
        bad = {k: v for k, v in self.extra_stop_reasons.items() if v not in ("terminated", "truncated", "infra_error")}
        if bad:
            raise ValueError(f"extra_stop_reasons must map to terminated, truncated or infra_error: {bad}")
        if self.loop_length < 2:
            raise ValueError("loop_length must be at least 2")
        self.difficulty_band = tuple(self.difficulty_band)  # type: ignore[assignment]

    def tol(self) -> tuple[float, float]:
        return self.atol, self.rtol


def load_config(path: str | Path | None = None, start: str | Path = ".") -> Config:
    """Read `path` (a TOML file: a `[tool.rollout-audit]` table or top-level keys), or the
    nearest pyproject.toml above `start` that has the table; defaults otherwise."""
    if path is not None:
        data = tomllib.loads(Path(path).read_text())
        table = data.get("tool", {}).get("rollout-audit", data)
        return Config.from_mapping(table)
    here = Path(start).resolve()
    for d in (here, *here.parents):
        pp = d / "pyproject.toml"
        if pp.is_file():
            try:
                data = tomllib.loads(pp.read_text())
            except (tomllib.TOMLDecodeError, OSError):
                continue
            if "rollout-audit" in data.get("tool", {}):
                return Config.from_mapping(data["tool"]["rollout-audit"])
    return Config()
