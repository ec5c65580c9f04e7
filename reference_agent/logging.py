"""Log writer adapter: rollout_audit.RolloutWriter when importable, else pyarrow with the same contract schema."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

TURN_TYPE = pa.struct(
    [
        ("turn_id", pa.int16()),
        ("policy_version", pa.int64()),
        ("logprob", pa.float64()),
        ("num_policy_tokens", pa.int32()),
        ("temperature", pa.float32()),
        ("top_p", pa.float32()),
        ("action_text", pa.string()),
        ("parsed_action", pa.string()),
        ("observation_text", pa.string()),
        ("reward", pa.float64()),
        ("reward_components", pa.map_(pa.string(), pa.float64())),
        ("potential_before", pa.float64()),
        ("potential_after", pa.float64()),
        ("shaping", pa.float64()),
        ("value", pa.float64()),
        ("td_residual", pa.float64()),
        ("latency_s", pa.float64()),
        ("tool_latency_s", pa.float64()),
        ("tool_status", pa.string()),
        ("finish_reason", pa.string()),
        ("sampled_token_ids", pa.list_(pa.int32())),
        ("context_length", pa.int32()),
        ("context_sha256", pa.string()),
        ("template_context_length", pa.int32()),
        ("template_context_sha256", pa.string()),
    ]
)

TRAJECTORY_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("environment_id", pa.string()),
        ("environment_version", pa.string()),
        ("reset_seed", pa.int64()),
        ("initial_state_id", pa.string()),
        ("initial_state_checksum", pa.string()),
        ("final_state_checksum", pa.string()),
        ("verifier_version", pa.string()),
        ("tokenizer_id", pa.string()),
        ("gamma", pa.float64()),
        ("token_ids", pa.list_(pa.int32())),
        ("token_source", pa.list_(pa.uint8())),
        ("loss_mask", pa.list_(pa.bool_())),
        ("behavior_logprobs", pa.list_(pa.float32())),
        ("token_turn", pa.list_(pa.int16())),
        ("turns", pa.list_(TURN_TYPE)),
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("infra_error", pa.bool_()),
        ("stop_reason", pa.string()),
        ("reward", pa.float64()),
        ("verifier_success", pa.bool_()),
        ("discounted_return", pa.float64()),
        ("final_value", pa.float64()),
        ("num_trainable_tokens", pa.int32()),
        ("wall_clock_s", pa.float64()),
        ("token_reward", pa.list_(pa.float32())),
        ("token_kl", pa.list_(pa.float32())),
        ("token_returns", pa.list_(pa.float32())),
        ("loss_weight", pa.list_(pa.float32())),
        ("nucleus_ids", pa.list_(pa.int32())),
        ("nucleus_offsets", pa.list_(pa.int32())),
    ]
)

UPDATE_SCHEMA = pa.schema(
    [
        ("update_step", pa.int64()),
        ("trainer_version", pa.int64()),
        ("trajectory_ids", pa.list_(pa.string())),
        ("reduction", pa.string()),
        ("loss_denominator", pa.float64()),
        ("advantages", pa.list_(pa.float64())),
        ("advantage_estimator", pa.string()),
        ("max_policy_lag", pa.int64()),
        ("numerator_tokens", pa.list_(pa.int64())),
        ("stat_trajectory_ids", pa.list_(pa.string())),
        ("ratio_anchor", pa.string()),
        ("ratio_correction", pa.string()),
        ("ratio_clipping", pa.bool_()),
    ]
)

SCHEMAS = {"trajectories": TRAJECTORY_SCHEMA, "updates": UPDATE_SCHEMA}
VERSIONS = {"trajectories": "1.3", "updates": "1.4"}  # the contract version each file's columns need
# How the environment pays each reward component (file metadata `rollout_log.reward_components`):
# the sparse outcome is paid once, when the episode ends, so R408 checks it without configuration.
REWARD_COMPONENTS = {"outcome": "terminal"}


def to_table(records: list[dict[str, Any]], kind: str) -> pa.Table:
    """Records (column-name dicts; turns as lists of dicts) → an Arrow table with the contract types."""
    table = pa.Table.from_pylist(records, schema=SCHEMAS[kind])
    return table.replace_schema_metadata({"rollout_log.schema_version": VERSIONS[kind], "rollout_log.kind": kind})


class _ArrowWriter:
    """Fallback writer: one row group per write(), atomic rename on close, contract metadata set."""

    def __init__(self, path: str | Path, kind: str, tokenizer: dict[str, Any] | None = None) -> None:
        self.path, self.kind = Path(path), kind
        self.meta = {"rollout_log.schema_version": VERSIONS[kind], "rollout_log.kind": kind}
        if tokenizer is not None:
            self.meta["rollout_log.tokenizer"] = json.dumps(tokenizer)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self._writer: pq.ParquetWriter | None = None

    def __enter__(self) -> _ArrowWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        schema = SCHEMAS[self.kind].with_metadata(self.meta)
        self._writer = pq.ParquetWriter(self.tmp, schema)
        return self

    def write(self, records: list[dict[str, Any]] | pa.Table) -> None:
        """Append one row group."""
        table = records if isinstance(records, pa.Table) else to_table(records, self.kind)
        assert self._writer is not None
        self._writer.write_table(table.cast(SCHEMAS[self.kind].with_metadata(self._writer.schema.metadata)))

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        assert self._writer is not None
        self._writer.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)


def open_writer(path: str | Path, kind: str, tokenizer: dict[str, Any] | None = None) -> Any:
    """Return a context-managed writer: the library's RolloutWriter if it exists, else the local fallback.
    `tokenizer` ({"name", "vocabulary"}) is declared in the file metadata so the log can be decoded."""
    try:
        from rollout_audit import RolloutWriter
    except ImportError:
        return _ArrowWriter(path, kind, tokenizer)
    return RolloutWriter(
        str(path),
        kind=kind,
        tokenizer=tokenizer,
        reward_components=REWARD_COMPONENTS if kind == "trajectories" else None,
    )


def write_log(path: str | Path, kind: str, records: list[dict[str, Any]]) -> None:
    """Write records as one Parquet file, as a single Arrow table with the contract schema."""
    with open_writer(path, kind) as w:
        w.write(to_table(records, kind))
