"""rLLM: the dump hooks' writers, for `rollout-audit check --from rllm DIR`. `dump_episodes` writes
`Episode.to_dict()` with the step (sampler side); `dump_batch` writes one record per row of the verl
`DataProto` rLLM trains (`trainer_state.backend_batch`, after `transform_to_backend_batch` cut the rows
to the cap and advantages were broadcast), in the batch's own key names (trainer side). No rLLM or verl
import: they read attributes and tensors (`tolist`), so they run wherever the trainer runs."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..adapters.rllm import BATCH_ROWS, BATCH_TENSORS


def batch_records(batch: Any, global_step: int) -> list[dict[str, Any]]:
    """One record per row of the DataProto: the row's identity (`step_ids`: the trajectory's uid,
    `episode_ids`, `group_roles`: the trajectory's name, `is_pad_step`), the step, and its tensors cut
    to the row's valid tokens (`attention_mask`: prompts are left-padded, responses right-padded)."""
    tensors, extra = batch.batch, batch.non_tensor_batch
    n_prompt = int(tensors["prompts"].shape[1])
    attention = tensors["attention_mask"].tolist()
    columns = {k: tensors[k].tolist() for k in BATCH_TENSORS if k in tensors.keys()}
    out = []
    for i, att in enumerate(attention):
        n_resp, pad = int(sum(att[n_prompt:])), n_prompt - int(sum(att[:n_prompt]))
        rec: dict[str, Any] = {"global_step": int(global_step)}
        rec.update({k: _plain(extra[k][i]) for k in BATCH_ROWS if k in extra})
        for k, values in columns.items():
            rec[k] = values[i][pad:] if k == "prompts" else values[i][:n_resp]
        out.append(rec)
    return out


def _append(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, default=_plain) + "\n")
    return path


def dump_batch(directory: str | os.PathLike, batch: Any, global_step: int) -> Path:
    """Append the rows of `batch` to `directory/rllm-batch-<host>-<pid>.jsonl`; returns the file."""
    path = Path(directory) / f"rllm-batch-{socket.gethostname()}-{os.getpid()}.jsonl"
    return _append(path, batch_records(batch, global_step))


def dump_episodes(directory: str | os.PathLike, episodes: Iterable[Any], global_step: int) -> Path:
    """Append `Episode.to_dict()` of each episode, with `global_step`, to `directory/rllm-episodes-<host>-<pid>.jsonl`."""
    path = Path(directory) / f"rllm-episodes-{socket.gethostname()}-{os.getpid()}.jsonl"
    return _append(path, ({"global_step": int(global_step), **ep.to_dict()} for ep in episodes))


def _plain(value: Any) -> Any:
    """Tensors and numpy values as plain lists / numbers (`tolist`), enums as their value, anything else as its string."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return getattr(value, "value", None) or str(value)
