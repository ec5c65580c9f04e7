"""rLLM: the dump hooks' writers, for `rollout-audit check --from rllm DIR`, and `AuditedBackend`, which
writes both through rLLM's own backend extension point (`UnifiedTrainer(backend_cls=...)`). `dump_episodes` writes
`Episode.to_dict()` with the step (sampler side); `dump_batch` writes one record per row of the verl
`DataProto` rLLM trains (`trainer_state.backend_batch`, after `transform_to_backend_batch` cut the rows
to the cap and advantages were broadcast), in the batch's own key names (trainer side). No rLLM or verl
import: they read attributes and tensors (`tolist`), so they run wherever the trainer runs."""

from __future__ import annotations

import json
import os
import socket
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..adapters.rllm import BATCH_ROWS, BATCH_TENSORS, MISSING


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
    """Tensors and numpy values as plain lists / numbers (`tolist`), enums as their value, anything else as its
    string; JSON's own values as they are (an object array of Python bools holds `False`, not "False")."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "tolist"):
        return value.tolist()
    return getattr(value, "value", None) or str(value)


class AuditedBackend:
    """A mixin for an rLLM training backend (`BackendProtocol`, rllm/trainer/backend_protocol.py at 9beb6e0)
    that writes the sampler-side and the trainer-side records of every step with `dump_episodes` and
    `dump_batch`, after the backend's own method, changing nothing it returns or stores:

    - on-policy (`UnifiedTrainer._train_batch_async`, unified_trainer.py:521-570): after
      `compute_advantages` (:567), the step's episodes (their `Step.advantage` set) and `backend_batch`;
    - fully-async (`_training_loop`, :669-792): after each chunk's `process_backend_batch` (:730; the rows
      built from trajectory groups, advantages already on them, verl_backend.py:459-464, rows filtered by
      `mask_truncated_samples` at :706-709), the chunk's rows; at `on_batch_end` (:792) the step's episodes
      (`trainer_state.episodes = all_episodes`, :783).

    Use it as `UnifiedTrainer(backend_cls=audited_backend(VerlBackend, "rollout_dumps/rllm"), ...)`. A record
    it cannot write is a warning and a `rollout_audit_missing` line in the dump, which `check` refuses."""

    audit_dir: str = os.environ.get("ROLLOUT_AUDIT_RLLM_DIR", "rollout_dumps/rllm")
    _ra_async_step: bool = False

    async def compute_advantages(self, trainer_state: Any, algorithm_config: Any, **kwargs: Any) -> None:
        await super().compute_advantages(trainer_state, algorithm_config, **kwargs)  # type: ignore[misc]
        step = trainer_state.global_step
        self._ra_write("episodes", lambda: dump_episodes(self.audit_dir, trainer_state.episodes, step), step)
        self._ra_write("batch", lambda: dump_batch(self.audit_dir, trainer_state.backend_batch, step), step)

    async def process_backend_batch(self, trainer_state: Any, **kwargs: Any) -> None:
        await super().process_backend_batch(trainer_state, **kwargs)  # type: ignore[misc]
        if trainer_state.episodes is None:  # the fully-async path builds its rows from trajectory groups
            self._ra_async_step = True
            step = trainer_state.global_step
            self._ra_write("batch", lambda: dump_batch(self.audit_dir, trainer_state.backend_batch, step), step)

    async def on_batch_end(self, trainer_state: Any) -> None:
        if self._ra_async_step:
            self._ra_async_step = False
            step = trainer_state.global_step
            self._ra_write("episodes", lambda: dump_episodes(self.audit_dir, trainer_state.episodes or [], step), step)
        await super().on_batch_end(trainer_state)  # type: ignore[misc]

    def _ra_write(self, what: str, write: Any, step: int) -> None:
        try:
            write()
        except Exception as e:  # noqa: BLE001 - the recorder never stops training; it says what it lost
            lost = f"the {what} of step {step} ({type(e).__name__}: {e})"
            warnings.warn(f"rollout-audit: AuditedBackend did not record {lost}", stacklevel=2)
            try:
                _append(Path(self.audit_dir) / f"rllm-missing-{socket.gethostname()}-{os.getpid()}.jsonl",
                        [{MISSING: lost}])  # fmt: skip
            except OSError:
                pass  # the marker cannot be written either: the warning stands, training goes on unchanged


def audited_backend(backend_cls: type, directory: str | os.PathLike | None = None) -> type:
    """`backend_cls` (rLLM's `VerlBackend`, `TinkerBackend`, ...) with `AuditedBackend` writing to `directory`."""
    attrs = {} if directory is None else {"audit_dir": str(directory)}
    return type(f"Audited{backend_cls.__name__}", (AuditedBackend, backend_cls), attrs)
