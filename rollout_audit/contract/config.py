"""Audit configuration: `[tool.rollout-audit]` in pyproject.toml, or a `--config` TOML file.

Validated with pydantic (already installed with pandera): every key typed, unknown keys and
wrong types rejected with the key and the expected type, never coerced from strings.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class Config(BaseModel):
    """Every tunable of the audit, with its default. Tolerances compare in float64."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, frozen=False)

    select: list[str] = Field(default_factory=list, description="codes or prefixes to run; empty = all")
    ignore: list[str] = Field(default_factory=list, description="codes or prefixes to skip")
    atol: float = Field(1e-4, ge=0, description="|found - expected| <= atol + rtol * |expected|")
    rtol: float = Field(1e-5, ge=0)
    logprob_atol: float = Field(1e-3, ge=0, description="L202: float32 token log-probs summed in float64")
    truncation: Literal["exclude", "bootstrap", "penalize"] = "exclude"
    truncation_penalty: float | None = Field(
        None, description="T307: under truncation = penalize, the most a truncated episode may be paid"
    )
    extra_stop_reasons: dict[str, str] = Field(default_factory=dict, description="stop_reason -> its stop flag")
    first_visit_components: list[str] = Field(default_factory=list)
    loop_length: int = Field(4, ge=2)
    max_response_tokens: int | None = Field(
        None, ge=1, description="T306: the trainer's response budget (tokens from the first agent turn on)"
    )
    max_policy_lag: int | None = Field(None, ge=0, description="used when an update does not state its bound")
    reward_rule: Literal["monotone", "binary"] = "monotone"
    grpo_epsilon: float = Field(1e-6, ge=0)
    difficulty_band: tuple[float, float] = (0.05, 0.95)
    max_examples: int = Field(20, ge=0, description="findings shown per code in text output")
    masked_ok_reasons: list[str] = Field(default_factory=list, description="M102: finish reasons that may mask")
    # resource caps against hostile files: a row group whose footer states more uncompressed bytes
    # is not read (S005); a trajectory with more tokens is not audited (S001)
    max_row_group_bytes: int = Field(2 * 2**30, ge=1)
    max_tokens_per_trajectory: int = Field(1_000_000, ge=1)
    # Replay (L205-L207, L209): trajectories replayed, stratified by policy version; 0 = off (`check --replay N`)
    replay: int = Field(0, ge=0)
    replayer: str | None = None  # "module:factory" returning a replayer, e.g. "reference_agent.replay:replayer"
    # version -> local checkpoint (a {"3": "ckpt/step-3"} table, or a template "ckpt/step-{version}")
    replay_checkpoints: dict[str, str] | str | None = None
    replay_endpoints: dict[str, str] = Field(default_factory=dict)  # version -> OpenAI-compatible base URL (…/v1)
    replay_batch_size: int = Field(8, ge=1)  # trajectories per forward pass / request
    replay_atol: float = Field(1e-3, ge=0)  # L205/L206: per-token |replayed - recorded| tolerance
    replay_max_share: float = Field(0.0, ge=0, le=1)  # L205: share of replayed tokens allowed over the tolerance
    compare_logprobs: str | None = None  # L207: a second per-token log-prob column (the trainer's recomputation)
    max_turn_log_ratio: float = Field(0.6931, gt=0)  # L207: |log π_other/π_beh| of a turn above this is extreme

    @field_validator(
        "atol",
        "rtol",
        "logprob_atol",
        "grpo_epsilon",
        "replay_atol",
        "replay_max_share",
        "max_turn_log_ratio",
        "truncation_penalty",
        mode="before",
    )
    @classmethod
    def _int_is_a_float(cls, v: Any) -> Any:
        """TOML writes `atol = 0` as an integer: accept integers for floats, nothing else."""
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("extra_stop_reasons")
    @classmethod
    def _a_stop_flag(cls, v: dict[str, str]) -> dict[str, str]:
        from .schema import STOP_FLAGS

        bad = sorted(f for f in v.values() if f not in STOP_FLAGS)
        if bad:
            raise ValueError(f"{bad[0]!r} is not a stop flag ({', '.join(STOP_FLAGS)})")
        return v

    @field_validator("difficulty_band", mode="before")
    @classmethod
    def _band(cls, v: Any) -> Any:
        if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return tuple(float(x) for x in v)
        return v

    @classmethod
    def from_mapping(cls, data: dict[str, Any], source: str = "configuration") -> Config:
        """Validate a table of settings (keys may use - or _)."""
        norm = {str(k).replace("-", "_"): v for k, v in data.items()}
        try:
            return cls.model_validate(norm)
        except ValidationError as e:
            raise ConfigError(f"{source}: {_explain(e)}") from None

    def tol(self) -> tuple[float, float]:
        return self.atol, self.rtol

    def settings(self) -> dict[str, Any]:
        """Every key with its value (for `--show-settings`)."""
        return self.model_dump()


def _explain(e: ValidationError) -> str:
    """'atol: expected a number, got str '1e-4'' for each error, joined."""
    out = []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            out.append(f"unknown key {key!r} (see `rollout-audit check --show-settings`)")
        else:
            got = err.get("input")
            shown = f"{type(got).__name__} {got!r}" if not isinstance(got, dict) else "a table"
            out.append(f"{key}: {err['msg'].lower()}, got {shown[:80]}")
    return "; ".join(out)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: TOML syntax error: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None


def load_config(path: str | Path | None = None, start: str | Path = ".") -> Config:
    """Read `path` (a TOML file: a `[tool.rollout-audit]` table, or top-level keys when it has
    no `tool` table), or the nearest pyproject.toml at or above `start` (the audited path, as
    ruff looks next to the files checked) that has the table; defaults otherwise. A broken
    pyproject.toml on the way is an error, never skipped."""
    return find_config(path, start)[0]


def find_config(path: str | Path | None = None, start: str | Path = ".") -> tuple[Config, str]:
    """`load_config`, and where the configuration came from (a file, or "defaults")."""
    if path is not None:
        p = Path(path)
        data = _read_toml(p)
        if "tool" in data:
            table = data["tool"].get("rollout-audit", {}) if isinstance(data["tool"], dict) else {}
        else:
            table = data
        return Config.from_mapping(table, str(p)), str(p)
    here = Path(start).resolve()
    if here.is_file():
        here = here.parent
    for d in (here, *here.parents):
        pp = d / "pyproject.toml"
        if pp.is_file():
            data = _read_toml(pp)
            tool = data.get("tool", {})
            if isinstance(tool, dict) and "rollout-audit" in tool:
                return Config.from_mapping(tool["rollout-audit"], f"{pp} [tool.rollout-audit]"), str(pp)
    return Config(), "defaults (no pyproject.toml with [tool.rollout-audit] at or above the audited path)"
