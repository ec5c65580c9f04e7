"""Audit configuration: `[tool.rollout-audit]` in pyproject.toml, or a `--config` TOML file.

Validated with pydantic (already installed with pandera): every key typed, unknown keys and
wrong types rejected with the key and the expected type, never coerced from strings. The pydantic
model is built from `Config`'s declarations the first time a value is validated (a file's table, a
keyword, an assignment) or its fields are described: an audit on the defaults never imports
pydantic (about 0.09 s of CPU in a fresh process).
"""

from __future__ import annotations

import difflib
import math
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, get_type_hints

from .errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError
    from pydantic.fields import FieldInfo

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# Settings that run code (`replayer`) or send the log's tokens over the network (replay): only the
# user sets them (command line, `--config FILE`, the project's pyproject.toml found from the working
# directory), never a configuration that came with the audited log.
TRUSTED_ONLY = ("replay", "replayer", "replay_checkpoints", "replay_endpoints")
# What a configuration inside the audited directory may set: how the run was produced (the trainer's
# truncation policy and penalty, its stop reasons, its response budget, its staleness bound, its reward
# rule, its GRPO epsilon, the finish reasons it masks, the column of its own log-prob recomputation),
# which the checks then verify the log against; and `max_examples`, which only changes what is shown.
# Every other key decides which checks run, how much they tolerate, what is accepted or how much is
# read: a log cannot vouch for itself. A list of what is allowed, so that a key added to Config is
# refused inside a log until it is decided to be context.
LOG_CONTEXT = (
    "truncation",
    "truncation_penalty",
    "extra_stop_reasons",
    "first_visit_components",
    "max_response_tokens",
    "overlong_buffer",
    "overlong_penalty_factor",
    "max_policy_lag",
    "reward_rule",
    "grpo_epsilon",
    "masked_ok_reasons",
    "compare_logprobs",
    "trainer_temperature",
    "max_examples",
)
# The most a configuration inside the log may state for a key, a bound no real trainer comes near
# (GRPO's epsilon is 1e-6 to 1e-4, an asynchronous trainer's staleness a handful of versions, a
# response budget some thousands of tokens): beyond it the key would only switch its check off.
LOG_BOUNDS: dict[str, float] = {"grpo_epsilon": 1e-2, "max_policy_lag": 1024, "max_response_tokens": 1 << 20}
# A configuration file larger than this is refused unread (a device or a huge file never fills memory)
MAX_CONFIG_BYTES = int(os.environ.get("ROLLOUT_AUDIT_MAX_CONFIG_BYTES", str(1 << 20)))


# The float settings: TOML writes `atol = 0` as an integer (accepted for them), and each must be finite
FLOAT_KEYS = (
    "atol",
    "rtol",
    "logprob_atol",
    "grpo_epsilon",
    "replay_atol",
    "replay_max_share",
    "max_turn_log_ratio",
    "min_logprob_bias",
    "truncation_penalty",
    "trainer_temperature",
    "overlong_penalty_factor",
    "replay_connect_timeout",
    "replay_timeout",
    "storage_connect_timeout",
    "storage_request_timeout",
)


class _Key:
    """One key of `Config` as declared: pydantic's `Field` arguments, kept until the model is built."""

    __slots__ = ("args", "kwargs")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs

    def default(self) -> Any:
        factory = self.kwargs.get("default_factory")
        return factory() if factory is not None else self.args[0]


def Field(*args: Any, **kwargs: Any) -> Any:  # pydantic's name and signature
    """A key of `Config`: its default (or `default_factory`), bounds and description, as pydantic's
    `Field` takes them; handed to pydantic when the model is built."""
    return _Key(args, kwargs)


_F = TypeVar("_F")
# (fields, mode, classmethod) of each of Config's validators, in declaration order
_VALIDATORS: list[tuple[tuple[str, ...], str, Any]] = []


def field_validator(*fields: str, mode: str = "after") -> Callable[[_F], _F]:
    """pydantic's `field_validator`, applied when the model is built."""

    def mark(f: _F) -> _F:
        _VALIDATORS.append((fields, mode, f))
        return f

    return mark


class _Fields:
    """`Config.model_fields`: the pydantic model's fields (type, default, description)."""

    def __get__(self, obj: object, owner: type | None = None) -> dict[str, FieldInfo]:
        return _model().model_fields


class Config:
    """Every tunable of the audit, with its default. Tolerances compare in float64."""

    # what pydantic's model is built with: no unknown key, no coercion, every assignment validated
    model_config: ClassVar[dict[str, Any]] = {"extra": "forbid", "strict": True, "validate_assignment": True}
    model_fields: ClassVar[_Fields] = _Fields()
    # the keys, in declaration order (set after the class body from its `Field`s)
    key_names: ClassVar[tuple[str, ...]] = ()

    # Each key's description is its entry in docs/configuration.md and `rollout-audit config KEY`.
    select: list[str] = Field(default_factory=list, description="Codes or prefixes of the checks to run; empty: all.")
    ignore: list[str] = Field(
        default_factory=list, description="Codes or prefixes of the checks to skip (wins over select)."
    )
    preview: bool = Field(False, description="Also run the checks in preview (new checks not yet stable).")
    atol: float = Field(
        1e-4,
        ge=0,
        description="Absolute tolerance of every recomputed float: |found - expected| <= atol + rtol * |expected|.",
    )
    rtol: float = Field(1e-5, ge=0, description="Relative tolerance of every recomputed float (see atol).")
    logprob_atol: float = Field(
        1e-3,
        ge=0,
        description="Tolerance of a turn's log-prob against the sum of its float32 token log-probs (float64).",
    )
    truncation: Literal["exclude", "bootstrap", "penalize"] = Field(
        "exclude",
        description="The trainer's policy for an episode cut by a budget: exclude it from the loss, bootstrap its "
        "return from a value estimate, or penalize it (train it with the reward it was given).",
    )
    truncation_penalty: float | None = Field(
        None, description="Under truncation = penalize, the most a truncated episode may be paid."
    )
    extra_stop_reasons: dict[str, str] = Field(
        default_factory=dict,
        description="The producer's own stop reasons, each mapped to the stop flag it sets "
        '(e.g. {"budget_exhausted" = "truncated"}).',
    )
    first_visit_components: list[str] = Field(
        default_factory=list, description="Reward components paid once per episode (first visit to a state)."
    )
    loop_length: int = Field(4, ge=2, description="Identical consecutive tool calls that make a loop.")
    max_response_tokens: int | None = Field(
        None, ge=1, description="The trainer's response budget (tokens from the first agent turn on)."
    )
    max_policy_lag: int | None = Field(
        None, ge=0, description="The staleness bound in policy versions, used when an update does not state its own."
    )
    overlong_buffer: int | None = Field(
        None,
        ge=1,
        description="The trainer's overlong buffer: the tokens before max_response_tokens over which its "
        "DAPO-style overlong penalty grows.",
    )
    overlong_penalty_factor: float | None = Field(
        None, ge=0, description="The trainer's overlong penalty at max_response_tokens (DAPO's factor)."
    )
    reward_rule: Literal["monotone", "binary"] = Field(
        "monotone", description="How the verifier pays: monotone in success, or binary (0 or 1)."
    )
    grpo_epsilon: float = Field(1e-6, ge=0, description="The epsilon GRPO adds to the group's standard deviation.")
    difficulty_band: tuple[float, float] = Field(
        (0.05, 0.95), description="The success rates between which a group of tasks carries relative signal."
    )
    max_examples: int = Field(20, ge=0, description="Findings shown per code in text output.")
    masked_ok_reasons: list[str] = Field(
        default_factory=list, description="Engine finish reasons whose turn the trainer masks on purpose."
    )
    stop_token_ids: list[int] = Field(
        default_factory=list,
        description="The token ids your inference engine stops on (its EOS and stop_token_ids): a turn it ended "
        "with finish_reason stop must end on one of them in the trainer's sequence (T309).",
    )
    max_row_group_bytes: int = Field(
        4 * 2**30,
        ge=1,
        description="A row group that decodes to more bytes (judged from the footer, before decoding) is not read.",
    )
    max_tokens_per_trajectory: int = Field(
        8_000_000, ge=1, description="A trajectory with more tokens is not audited, nor the rest of its row group."
    )
    vocabulary_size: int | None = Field(
        None,
        ge=1,
        description="The tokenizer's number of token ids: an id at or past it is S001. Unset, the largest "
        "vocabulary a file of the log declares (rollout_log.tokenizer) is used; a declaration only adds findings.",
    )
    storage_connect_timeout: float = Field(
        10.0, gt=0, description="Object storage: seconds to connect before the audit gives up (exit 2)."
    )
    storage_request_timeout: float = Field(
        30.0, gt=0, description="Object storage: seconds per request before the audit gives up (exit 2)."
    )
    replay: int = Field(0, ge=0, description="Trajectories replayed, stratified by policy version; 0: off.")
    replayer: str | None = Field(
        None, description='"module:factory" returning a replayer, e.g. "reference_agent.replay:replayer".'
    )
    replay_checkpoints: dict[str, str] | str | None = Field(
        None,
        description='Policy version -> local checkpoint: a table {"3" = "ckpt/step-3"} or a template "ckpt/step-{version}".',
    )
    replay_endpoints: dict[str, str] = Field(
        default_factory=dict, description="Policy version -> base URL of an OpenAI-compatible server (…/v1)."
    )
    replay_batch_size: int = Field(8, ge=1, description="Trajectories per forward pass or request.")
    replay_connect_timeout: float = Field(
        10.0, gt=0, description="Replay over HTTP: seconds to connect, and the longest silence."
    )
    replay_timeout: float = Field(300.0, gt=0, description="Replay over HTTP: seconds per request in all.")
    replay_max_response_bytes: int = Field(1 << 30, ge=1, description="Replay over HTTP: bytes per answer at most.")
    replay_max_bytes: int = Field(
        1 << 30,
        ge=1,
        description="Replay: bytes of scores held at once at most (a forward pass's logits, the dense distributions "
        "scored together); a trajectory whose logits alone need more is refused (exit 2).",
    )
    replay_atol: float = Field(1e-3, ge=0, description="Per-token |replayed - recorded| log-prob tolerance.")
    replay_max_share: float = Field(0.0, ge=0, le=1, description="Share of replayed tokens allowed over replay_atol.")
    compare_logprobs: str | None = Field(
        None, description="A second per-token log-prob column (the trainer's recomputation) to compare with."
    )
    trainer_temperature: float | None = Field(
        None,
        ge=0,
        description="The temperature the trainer recomputes log-probs at and records as the sampler's (verl "
        "actor_rollout_ref.rollout.temperature, its batch's meta_info temperature): L212 compares every turn's "
        "sampled temperature with it.",
    )
    denominator_not_recorded: bool = Field(
        False,
        description="The trainer records neither its loss reduction nor its denominator (rLLM; `check --from rllm` "
        "sets it): a log whose update files declare both not recorded (rollout_log.not_recorded) is audited without "
        "them. Never from a configuration inside the log: a log cannot waive its own denominators.",
    )
    not_recorded: list[str] = Field(
        default_factory=list,
        description='Required columns the trainer does not record (e.g. ["behavior_logprobs", "reward"]; '
        "`turns.policy_version` for a turn field), each one the contract lets a producer leave out "
        "(not_recorded_waivable): a file that declares such a column not recorded (rollout_log.not_recorded) "
        "is audited without it. Never from a configuration inside the log: a log cannot waive its own columns.",
    )
    max_turn_log_ratio: float = Field(
        0.6931, gt=0, description="|log pi_other / pi_behaviour| of a turn above which it is extreme."
    )
    min_logprob_bias: float = Field(
        0.01,
        gt=0,
        description="Mean per-token |log pi_other - log pi_behaviour| (nats) a consistent bias must exceed, with "
        "its whole 99.9% interval, to be reported (0.01: a nucleus of mass 0.99 on one side only).",
    )
    baseline: str | None = Field(
        None,
        description="A baseline file (`check --write-baseline`): findings recorded there do not fail the audit; "
        "a relative path is read from the configuration file's directory.",
    )
    tolerated_share: dict[str, float] = Field(
        default_factory=dict,
        description="Code -> share of trajectories that may carry its findings before they count as errors; "
        "up to it, they are warnings.",
    )
    # where these settings came from (a file, "defaults", or code): every report names it
    _source: str
    # the keys a configuration inside the audited log set (not the user's: they never narrow what is
    # checked, e.g. they add to what the log's file metadata declares instead of replacing it)
    _log_keys: frozenset[str]
    # the file inside the audited log those keys were read from (None: the log set none)
    _log_file: str | None
    # the keys given explicitly (pydantic's `model_fields_set`)
    _given: set[str]

    def __init__(self, **data: Any) -> None:
        """The defaults, and each key of `data` validated (pydantic's ValidationError otherwise)."""
        values = _model().model_validate(data).__dict__ if data else {k: _KEYS[k].default() for k in self.key_names}
        self._init(values, set(data))

    def _init(self, values: dict[str, Any], given: set[str]) -> None:
        self.__dict__.update(values)
        self.__dict__.update(
            _source="a Config object given in code", _log_keys=frozenset(), _log_file=None, _given=given
        )

    @classmethod
    def model_validate(cls, data: Any) -> Config:
        """`data` (a mapping of keys) validated: pydantic's ValidationError names each wrong key."""
        m = _model().model_validate(data)
        out = cls.__new__(cls)
        out._init(dict(m.__dict__), set(m.model_fields_set))
        return out

    def __setattr__(self, name: str, value: Any) -> None:
        """A key is validated as it is assigned (pydantic's `validate_assignment`); private state is not."""
        if name.startswith("_"):
            self.__dict__[name] = value
            return
        if name not in _KEYS:
            raise ValueError(f'"Config" object has no field "{name}"')
        self.__dict__[name] = _model().model_validate({name: value}).__dict__[name]
        self._given.add(name)

    @property
    def model_fields_set(self) -> set[str]:
        return set(self._given)

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Config:
        """A shallow copy with `update`'s keys replaced, unvalidated (as pydantic's `model_copy`)."""
        out = self.__class__.__new__(self.__class__)
        out.__dict__.update(self.__dict__)
        out.__dict__.update(update or {})
        out._given = self._given | set(update or ())
        return out

    def model_dump(self) -> dict[str, Any]:
        """Every key with its value, as pydantic dumps it."""
        return _model().model_construct(**{k: self.__dict__[k] for k in self.key_names}).model_dump()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return {k: v for k, v in self.__dict__.items() if k != "_given"} == {
            k: v for k, v in other.__dict__.items() if k != "_given"
        }

    __hash__ = None  # type: ignore[assignment]  # mutable, as a pydantic model is

    def __repr__(self) -> str:
        return f"Config({', '.join(f'{k}={self.__dict__[k]!r}' for k in self.key_names)})"

    @property
    def log_keys(self) -> frozenset[str]:
        return self._log_keys

    @property
    def log_file(self) -> str | None:
        return self._log_file

    def users_keys(self) -> frozenset[str]:
        """The keys the user's configuration set (the log's own are left out)."""
        return frozenset(self.model_fields_set) - self._log_keys

    @property
    def source(self) -> str:
        return self._source

    def with_source(self, source: str) -> Config:
        self._source = source
        return self

    @field_validator("select", "ignore")
    @classmethod
    def _no_empty_prefix(cls, v: list[str]) -> list[str]:
        """An empty prefix selects (or ignores) every check: a typo, never meant."""
        if any(not c.strip() for c in v):
            raise ValueError("an empty code or prefix matches every check; remove it")
        return v

    @field_validator("not_recorded")
    @classmethod
    def _waivable(cls, v: list[str]) -> list[str]:
        """Only what the contract lets a producer leave out: `loss_mask` is required of every producer."""
        from .schema import waivable_names

        bad = sorted({c.removeprefix("updates.") for c in v} - waivable_names())
        if bad:
            raise ValueError(
                f"{bad[0]!r} cannot be left out: the columns a trainer may not record are "
                + ", ".join(sorted(waivable_names()))
            )
        return v

    def waived(self) -> frozenset[str]:
        """The required columns the user says the trainer does not record: `not_recorded`, and the
        loss reduction and denominator under `denominator_not_recorded`."""
        from .schema import USER_WAIVED

        said = frozenset(c.removeprefix("updates.") for c in self.not_recorded)
        return said | USER_WAIVED if self.denominator_not_recorded else said

    @field_validator("replay_checkpoints")
    @classmethod
    def _template(cls, v: Any) -> Any:
        """A template may name `{version}` and nothing else (no format spec: it could ask for gigabytes)."""
        if isinstance(v, str):
            try:
                v.replace("{version}", "").format()
            except (ValueError, IndexError, KeyError):
                raise ValueError("a template may hold {version} and no other {…} field or format spec") from None
        return v

    @field_validator(*FLOAT_KEYS, mode="before")
    @classmethod
    def _int_is_a_float(cls, v: Any) -> Any:
        """TOML writes `atol = 0` as an integer: accept integers for floats, nothing else."""
        return _as_float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator(*FLOAT_KEYS)
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        """inf passes every comparison (`atol = inf`) and NaN none: a tolerance or a bound is a number."""
        if v is not None and not math.isfinite(v):
            raise ValueError("a finite number, not inf or nan")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids(cls, v: list[int]) -> list[int]:
        """Token ids are int32 and not negative, as the contract's token_ids are."""
        bad = [i for i in v if not 0 <= i < 2**31]
        if bad:
            raise ValueError(f"{bad[0]} is not a token id (0 to 2**31 - 1)")
        return v

    @field_validator("extra_stop_reasons")
    @classmethod
    def _a_stop_flag(cls, v: dict[str, str]) -> dict[str, str]:
        from .schema import STOP_FLAGS

        bad = sorted(f for f in v.values() if f not in STOP_FLAGS)
        if bad:
            raise ValueError(f"{bad[0]!r} is not a stop flag ({', '.join(STOP_FLAGS)})")
        return v

    @field_validator("tolerated_share", mode="before")
    @classmethod
    def _shares(cls, v: Any) -> Any:
        """Codes as written upper-cased; each share a number in [0, 1] (integers 0 and 1 too)."""
        if not isinstance(v, dict):
            return v
        out = {}
        for k, x in v.items():
            if isinstance(x, int) and not isinstance(x, bool):
                x = float(x)
            if not isinstance(x, float) or not 0.0 <= x <= 1.0:
                raise ValueError(f"{k}: a share between 0 and 1, got {x!r}")
            out[str(k).upper()] = x
        return out

    @field_validator("difficulty_band", mode="before")
    @classmethod
    def _band(cls, v: Any) -> Any:
        if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            out = tuple(_as_float(x) for x in v)
            if not all(math.isfinite(x) for x in out):
                raise ValueError("finite numbers, not inf or nan")
            return out
        return v

    @classmethod
    def from_mapping(cls, data: dict[str, Any], source: str = "configuration") -> Config:
        """Validate a table of settings (keys may use - or _)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a table of settings, got {type(data).__name__}")
        norm = {str(k).replace("-", "_"): v for k, v in data.items()}
        from pydantic import ValidationError

        try:
            return cls.model_validate(norm).with_source(source)
        except ValidationError as e:
            raise ConfigError(f"{source}: {_explain(e)}") from None

    def settings(self) -> dict[str, Any]:
        """Every key with its value (for `--show-settings`)."""
        return self.model_dump()


_KEYS: dict[str, _Key] = {k: v for k, v in vars(Config).items() if isinstance(v, _Key)}
Config.key_names = tuple(_KEYS)
for _k in _KEYS:
    delattr(Config, _k)  # an instance holds its own value; the declaration lives on in _KEYS
_MODEL: list[type[BaseModel]] = []


def _model() -> type[BaseModel]:
    """The pydantic model of `Config`'s keys and validators, built once, when first needed."""
    if not _MODEL:
        import pydantic

        hints = get_type_hints(Config)
        fields: dict[str, Any] = {k: (hints[k], pydantic.Field(*d.args, **d.kwargs)) for k, d in _KEYS.items()}
        validators = {
            f"_v{i}": pydantic.field_validator(*names, mode=mode)(f)  # type: ignore[call-overload]
            for i, (names, mode, f) in enumerate(_VALIDATORS)
        }
        conf = pydantic.ConfigDict(**Config.model_config)  # type: ignore[typeddict-item]
        _MODEL.append(pydantic.create_model("Config", __config__=conf, __validators__=validators, **fields))
    return _MODEL[0]


def _as_float(x: int | float) -> float:
    """An integer as a float; one past float's range is a validation error, not an OverflowError."""
    try:
        return float(x)
    except OverflowError:
        raise ValueError(f"an integer of {len(str(abs(int(x))))} digits is too large for a number") from None


def _explain(e: ValidationError) -> str:
    """'atol: expected a number, got str '1e-4'' for each error, joined."""
    out = []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            near = difflib.get_close_matches(key, list(Config.model_fields), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            out.append(f"unknown key {key!r} ({hint}see `rollout-audit check --show-settings`)")
        else:
            got = err.get("input")
            shown = f"{type(got).__name__} {got!r}" if not isinstance(got, dict) else "a table"
            out.append(f"{key}: {err['msg'].lower()}, got {shown[:80]}")
    return "; ".join(out)


def read_bounded(path: str | Path, limit: int, setting: str) -> bytes:
    """The bytes of `path`: a regular file (a FIFO or a device would block or never end) of at most
    `limit` bytes, the bound the environment variable `setting` changes, read once through the
    opened descriptor. ConfigError naming the file otherwise."""
    try:
        with open(path, "rb", opener=_nonblocking) as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{path}: not a regular file")
            raw = fh.read(limit + 1) if st.st_size <= limit else b""
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    if st.st_size > limit or len(raw) > limit:  # the second: a file that grew while it was read
        raise ConfigError(f"{path}: larger than {limit} bytes ({setting})")
    return raw


def _read_toml(path: Path) -> dict[str, Any]:
    """The TOML document at `path`: a regular file of at most MAX_CONFIG_BYTES."""
    raw = read_bounded(path, MAX_CONFIG_BYTES, "ROLLOUT_AUDIT_MAX_CONFIG_BYTES")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: TOML syntax error: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: TOML nested too deeply") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None


def _nonblocking(path: str, flags: int) -> int:
    """Open without blocking on a FIFO that has no writer (it is then refused as not regular)."""
    return os.open(path, flags | os.O_NONBLOCK)


def _table(data: dict[str, Any], explicit: bool) -> Any:
    """The `[tool.rollout-audit]` table of a document (an explicit file may hold bare keys); None when absent."""
    if "tool" not in data:
        return data if explicit else None
    tool = data["tool"]
    if not isinstance(tool, dict):
        return {} if explicit else None
    return tool.get("rollout-audit", {} if explicit else None)


def _nearest(start: Path) -> tuple[Path, Any] | None:
    """The nearest pyproject.toml at or above `start` with a `[tool.rollout-audit]` entry, and that entry."""
    for d in (start, *start.parents):
        pp = d / "pyproject.toml"
        if pp.is_file():
            table = _table(_read_toml(pp), explicit=False)
            if table is not None:
                return pp, table
    return None


def load_config(path: str | Path | None = None, start: str | Path | None = None) -> Config:
    """Read `path` (a TOML file: a `[tool.rollout-audit]` table, or top-level keys when it has
    no `tool` table), or the nearest pyproject.toml at or above `start` (the audited path, as
    ruff looks next to the files checked) that has the table; defaults otherwise. Without
    `start`, the project's own configuration, found from the working directory. A broken
    pyproject.toml on the way is an error, never skipped."""
    return find_config(path, start)[0]


def find_config(
    path: str | Path | None = None, start: str | Path | None = None, audited: list[str | Path] | None = None
) -> tuple[Config, str]:
    """`load_config`, and where the configuration came from (a file, or "defaults").

    A log must not vouch for itself. A file named with `--config` (`path`) is the user's own and
    sets anything, and so does the project configuration found from the working directory when
    no audited path is given. A found file inside an audited log (`audited`, default `[start]`: the
    root of each log, `log_root`, whatever path inside it was named) came with the log: it may set
    only the keys of LOG_CONTEXT. A found file elsewhere sets the keys of TRUSTED_ONLY only when it
    is the user's own (the project configuration found from the working directory, itself outside
    every audited log). Any other key is a ConfigError naming the file and the keys."""
    if path is not None:
        p = Path(path)
        return Config.from_mapping(_table(_read_toml(p), explicit=True), str(p)), str(p)
    here = _from(start)
    found = _nearest(here)
    if found is None:
        source = "defaults (no pyproject.toml with [tool.rollout-audit] at or above the audited path)"
        return Config().with_source(source), source
    pp, table = found
    roots = log_roots([start] if audited is None and start is not None else audited or [])
    if isinstance(table, dict) and start is not None:
        _refuse(pp, [str(k) for k in table], roots)
    if _inside_any(pp, roots):
        return log_bounded(pp, Config.from_mapping(table, f"{_shown(pp)} [tool.rollout-audit]")), str(pp)
    return Config.from_mapping(table, f"{_shown(pp)} [tool.rollout-audit]"), str(pp)


def log_config(start: str | Path, audited: list[str | Path] | None = None) -> Config | None:
    """The configuration that came with the log at `start`: the nearest pyproject.toml with a
    `[tool.rollout-audit]` table at or above it that lies inside an audited log (`audited`, default
    `[start]`; it may state only how the run was produced); None when there is none."""
    found = _nearest(_from(start))
    roots = log_roots(audited or [start])
    if found is None or not _inside_any(found[0], roots):
        return None
    pp, table = found
    if isinstance(table, dict):
        _refuse(pp, [str(k) for k in table], roots)
    return log_bounded(pp, Config.from_mapping(table, f"{_shown(pp)} [tool.rollout-audit] (came with the log)"))


def _from(start: str | Path | None) -> Path:
    """The directory a configuration is looked for from: the audited directory, or the folder of an
    audited file (the working directory when nothing is audited)."""
    audited = Path("." if start is None else start).resolve()
    return audited.parent if audited.is_file() else audited


def log_root(path: str | Path) -> Path | None:
    """The root of the log `path` is part of, whatever path inside it was named: the folder that
    holds the nearest `trajectories/` or `updates/` at or above `path` (a part, a sub-folder of
    parts, the folder itself); else an audited directory is its own root; a lone file anywhere else
    brings no directory (a project's pyproject.toml beside a single-file log stays the project's)."""
    p = Path(path).resolve()
    for a in (p, *p.parents):
        if a.name in ("trajectories", "updates") and a.is_dir() and (a != p or p.is_dir()):
            return a.parent
    return p if p.is_dir() else None


def log_roots(paths: list[str | Path]) -> list[Path]:
    """`log_root` of each audited path that has one."""
    return [r for r in map(log_root, paths) if r is not None]


def _refuse(pp: Path, keys: list[str], roots: list[Path]) -> None:
    """ConfigError when the found file `pp` sets a key its place does not allow (`find_config`).
    An unknown key is left to validation, which names the key it was probably meant to be."""
    norm = {k: k.replace("-", "_") for k in keys}
    if _inside_any(pp, roots):
        refused = [k for k, n in norm.items() if n in Config.model_fields and n not in LOG_CONTEXT]
        if refused:
            raise ConfigError(
                f"{pp}: {', '.join(refused)}: refused in a configuration inside the audited log, which may "
                f"state only how the run was produced ({', '.join(LOG_CONTEXT)}); set it on the command line, "
                "with --config FILE, or in your own project's pyproject.toml outside the log"
            )
    elif not _own(pp, roots):
        refused = [k for k, n in norm.items() if n in TRUSTED_ONLY]
        if refused:
            raise ConfigError(
                f"{pp}: {', '.join(refused)}: refused in a configuration found next to the audited "
                "log (it runs code or sends the log over the network); set it on the command line, with "
                "--config FILE, or in the pyproject.toml of the project you run from"
            )


def log_bounded(pp: Path, cfg: Config) -> Config:
    """`cfg`, read from the configuration `pp` inside the audited log, with its keys marked as the
    log's (`Config.log_keys`); a ConfigError naming the file and the key when a value is beyond what
    a real trainer has (LOG_BOUNDS), a finish or stop reason it names is the contract's own to
    define, or its second log-prob column is a contract column (L207 would compare a column with
    itself). The truncation penalty is bounded by the log's rewards when the log is read, a
    converted dump's too (`session.bound_penalty`)."""
    from .schema import columns, contract, stop_reasons

    said = cfg.model_fields_set
    bad = [
        f"{k} = {getattr(cfg, k)!r} (at most {v!r})"
        for k, v in LOG_BOUNDS.items()
        if k in said and (getattr(cfg, k) or 0) > v
    ]
    unknown = sorted(set(cfg.masked_ok_reasons) - set(contract()["finish_reasons"]))
    if unknown:
        bad.append(f"masked_ok_reasons {unknown[0]!r} (not a contract finish reason)")
    own = sorted(set(cfg.extra_stop_reasons) & set(stop_reasons()))
    if own:
        bad.append(f"extra_stop_reasons {own[0]!r} (a contract stop reason: its flag is the contract's)")
    if cfg.compare_logprobs in {c.name for c in columns("trajectories")}:
        bad.append(f"compare_logprobs = {cfg.compare_logprobs!r} (a contract column, not a second log-prob column)")
    if bad:
        raise ConfigError(
            f"{pp}: {'; '.join(bad)}: refused in a configuration inside the audited log, which may state "
            "only values a real trainer has; set it on the command line or with --config FILE"
        )
    cfg._log_keys = frozenset(said)
    cfg._log_file = _shown(pp)
    return cfg


def _shown(p: Path) -> str:
    """`p` relative to the working directory when it lies under it (as the user would type it)."""
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _inside_any(pp: Path, roots: list[Path]) -> bool:
    """`pp` lies in one of the audited logs whose roots are `roots`, or below one."""
    return any(pp.parent == root or root in pp.parents for root in roots)


def _own(pp: Path, roots: list[Path]) -> bool:
    """`pp` is the user's own: the nearest configuration at or above the working directory that lies
    outside every audited log (`cd LOG && check trajectories` never takes LOG's for the project's)."""
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        cand = d / "pyproject.toml"
        if _inside_any(cand, roots) or not cand.is_file():
            continue
        if _table(_read_toml(cand), explicit=False) is not None:
            return cand == pp
    return False
