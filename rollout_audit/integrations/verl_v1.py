"""verl V1 trainer: the trainer-side record switched on by configuration (no source edit).

verl 0.9.1's V1 entry point looks its trainer class up by name, `get_trainer_cls(config.trainer.v1.
trainer_mode)` in `TaskRunnerV1.run` (verl/trainer/main_ppo.py:141), in `TRAINER_REGISTRY`, which
`register_trainer(name)` fills (verl/trainer/ppo/v1/trainer_base.py:1999-2023). `setup` registers, for
every mode verl registered (`sync`, `colocate_async`, `separate_async`), a subclass under `PREFIX +
mode` that records what the mode's own `_compute_advantage` wrote; Ray runs `setup` in every worker
process, the TaskRunner's included, before any task, when it is named as the runtime env's
`worker_process_setup_hook` (ray/_private/workers/default_worker.py:313-320; a module path is imported
and called, ray/_private/runtime_env/setup_hook.py:178, :204-209), which verl passes to `ray.init`
from `ray_kwargs.ray_init.runtime_env` (main_ppo.py:62-74).

The subclass is its mode's trainer: its constructor puts the mode's own name back in
`trainer.v1.trainer_mode` before verl's reads it (the replay buffer, `parameter_sync_step` and the
per-mode settings are chosen by that name, trainer_base.py:129-131, :153-157), and `_compute_advantage`
returns what verl's returned, after reading back from TransferQueue, for the step's keys, the fields
the advantage step read and wrote (trainer_base.py:1745-1800). One record per key, in the legacy
trainer-side record's field names (`integrations.verl.batch_records`), goes to
`<trainer.rollout_data_dir>/rollout-audit/verl-batch-<host>-<pid>.jsonl`, beside the agent-loop
wrapper's records. A failure to record is logged and written as an unrecorded record; training goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..adapters.base import UNRECORDED
from ..adapters.verl import ALGORITHM, V1_STEP
from . import verl as hook
from .verl_loop import SUBDIR
from .verl_loop import _setting as setting

__all__ = [
    "FIELDS",
    "NOT_RECORDED",
    "PREFIX",
    "SETUP",
    "SETUP_OPTION",
    "TRAINER_MODE",
    "audited",
    "options",
    "setup",
    "v1_records",
]

log = logging.getLogger(__name__)

PREFIX = "rollout_audit_"  # trainer.v1.trainer_mode=rollout_audit_sync runs `sync` and records it
SETUP = f"{__name__}.setup"  # +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=<this>
TRAINER_MODE = "trainer.v1.trainer_mode"
SETUP_OPTION = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"  # a new key: Hydra's `+`


def options(rollout_data_dir: str, mode: str = "sync") -> dict[str, str]:
    """The verl overrides that switch both halves on (docs/frameworks/verl.md, "Set these options"):
    the recording agent loop, the directory every writer shares, the engine's log-probs, the audited
    V1 trainer for `mode` and the setup hook that registers it."""
    from .verl_loop import CONFIG

    return {
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(CONFIG),
        "trainer.rollout_data_dir": rollout_data_dir,
        "actor_rollout_ref.rollout.calculate_log_probs": "True",
        TRAINER_MODE: PREFIX + mode,
        SETUP_OPTION: SETUP,
    }


# what the V1 trainer keeps in TransferQueue per key after `_compute_advantage` (trainer_base.py:1745,
# :1786-1800; `responses` and `uid` from the agent loop's put, agent_loop_tq.py:182-227): the raw
# prompt uid, the response ids, the mask after rollout correction, the token-level scores (`rm_scores`,
# the legacy batch's `token_level_scores`), the rewards when `use_kl_in_reward` wrote them, the
# advantages and returns, the actor's and the engine's log-probs
FIELDS = (
    "uid",
    "responses",
    "response_mask",
    "rm_scores",
    "token_level_rewards",
    "advantages",
    "returns",
    "old_log_probs",
    "rollout_log_probs",
)
RENAME = {"rm_scores": "token_level_scores"}  # TransferQueue's name -> the trainer-side record's
_NOT_READ = "rollout-audit's verl V1 trainer could not read the step's fields back from TransferQueue"
# what the V1 record leaves out, by contract field: DAPO's penalty is in the sample's reward_extra_info,
# which verl adds after the agent loop returned (so not on the wrapper's record either)
NOT_RECORDED = {
    "overlong_penalty": "rollout-audit's verl V1 trainer: verl scores after the agent loop returns, and the "
    "record does not read the reward_extra_info (DAPO's overlong_reward) TransferQueue keeps with the sample",
}


def _rows(value: Any) -> list[Any]:
    """One plain value per key of a TransferQueue field: a nested (jagged) tensor's rows, a tensor's
    rows, a non-tensor stack's items."""
    if getattr(value, "is_nested", False):
        return [row.tolist() for row in value.unbind()]
    return list(value.tolist()) if hasattr(value, "tolist") else list(value)


def v1_records(
    keys: list[str],
    data: Any,
    global_steps: int,
    algorithm: Any,
    *,
    local_trigger_step: int = 0,
    parameter_sync_step: int = 1,
    trainer_mode: str = "sync",
) -> list[dict[str, Any]]:
    """One trainer-side record per TransferQueue key of the step: `data` is what `tq.kv_batch_get`
    returned for `FIELDS` (a TensorDict of nested tensors, one row per key), `algorithm` the run's
    `config.algorithm`. The record id is the key, the agent-loop record's `request_id`
    (`{uid}_{session_id}_{index}`, agent_loop_tq.py:193); `token_level_rewards` is the scores when
    `use_kl_in_reward` is off (trainer_base.py:1760); a field TransferQueue does not hold is left out."""
    present = set(data.keys())
    columns = {k: _rows(data[k]) for k in FIELDS if k in present}
    for k, v in columns.items():
        if len(v) != len(keys):
            raise ValueError(f"TransferQueue field {k} has {len(v)} rows for {len(keys)} keys")
    if "token_level_rewards" not in columns and "rm_scores" in columns:
        columns["token_level_rewards"] = columns["rm_scores"]
    settings = {k: hook._setting(algorithm, k) for k in ALGORITHM}
    out = []
    for i, key in enumerate(keys):
        rec: dict[str, Any] = {
            "request_id": str(key),
            "uid": hook._plain(columns["uid"][i]) if "uid" in columns else None,
            "global_steps": int(global_steps),
            **settings,
            V1_STEP: int(local_trigger_step),
            "parameter_sync_step": int(parameter_sync_step),
            "trainer_mode": trainer_mode,
            UNRECORDED: dict(NOT_RECORDED),
        }
        rec.update({RENAME.get(k, k): v[i] for k, v in columns.items() if k != "uid"})
        out.append(rec)
    return out


def _directory(config: Any) -> Path:
    verl_dir = setting(config, "trainer", "rollout_data_dir")
    if not verl_dir:
        raise ValueError(
            "rollout-audit's verl V1 trainer needs trainer.rollout_data_dir: its records go to "
            f"<trainer.rollout_data_dir>/{SUBDIR}, beside verl's own generations and the agent loop's records"
        )
    return Path(str(verl_dir)) / SUBDIR


def audited(base: type, mode: str) -> type:
    """`base` (the trainer verl registered as `mode`) with the trainer-side record."""

    class Audited(base):  # type: ignore[misc, valid-type]
        """verl's `{mode}` trainer, recording each advantage step (rollout_audit.integrations.verl_v1)."""

        def __init__(self, config: Any, *args: Any, **kwargs: Any):
            self.audit_dir = _directory(config)
            config.trainer.v1.trainer_mode = mode  # the name verl's own constructor reads
            super().__init__(config, *args, **kwargs)

        def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
            out = super()._compute_advantage(batch, metrics)
            try:
                import transfer_queue as tq

                data = tq.kv_batch_get(keys=out.keys, partition_id=out.partition_id, select_fields=list(FIELDS))
                recs = v1_records(
                    list(out.keys),
                    data,
                    self.global_steps,
                    self.config.algorithm,
                    local_trigger_step=getattr(self, "local_trigger_step", 0),
                    parameter_sync_step=getattr(self, "parameter_sync_step", 1),
                    trainer_mode=mode,
                )
            except Exception as e:  # noqa: BLE001 - the trainer goes on; the dump says which step has no record
                log.error("%s at step %s: %s", _NOT_READ, self.global_steps, e)
                why = f"{_NOT_READ}: {e}"[:500]
                recs = [{"global_steps": int(self.global_steps), "trainer_mode": mode, UNRECORDED: {"updates": why}}]
            hook.write_records(self.audit_dir, "verl-batch", recs)
            return out

    Audited.__name__ = Audited.__qualname__ = f"Audited{base.__name__}"
    Audited.__doc__ = f"verl's `{mode}` trainer ({base.__name__}), recording each advantage step."
    globals()[Audited.__name__] = Audited  # found by name wherever setup ran (every Ray worker): picklable by reference
    return Audited


TESTED = ("0.9.1",)  # the verl releases this trainer was read against


def version_warning(version: str | None) -> str | None:
    """One line when the installed verl is not a release the audited trainer was read against."""
    if version in TESTED:
        return None
    return (
        f"rollout-audit: verl {version or '(not installed)'} is outside the tested range ({', '.join(TESTED)}); "
        "the V1 trainer's record may miss fields: check the dump's not-run list"
    )


def setup() -> None:
    """Ray's `worker_process_setup_hook`: register `PREFIX + mode` for every V1 trainer verl registered
    (and warn, once per process, when verl is not a tested release)."""
    import verl
    from verl.trainer.ppo.v1 import trainer_base

    if not any(m.startswith(PREFIX) for m in trainer_base.TRAINER_REGISTRY):
        warning = version_warning(getattr(verl, "__version__", None))
        if warning:
            log.warning(warning)

    for mode, cls in list(trainer_base.TRAINER_REGISTRY.items()):
        if not mode.startswith(PREFIX) and PREFIX + mode not in trainer_base.TRAINER_REGISTRY:
            trainer_base.register_trainer(PREFIX + mode)(audited(cls, mode))
