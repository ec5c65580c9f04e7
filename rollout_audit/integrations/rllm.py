"""rLLM: the dump hooks' writers, for `rollout-audit check --from rllm DIR`; `AuditedBackend`, which
writes both through rLLM's own backend extension point (`UnifiedTrainer(backend_cls=...)`); and
`AuditedWorkflowTrainer`, the same records for `AgentWorkflowPPOTrainer` (a subclass, since no configuration
names that trainer's class) with the trainer's own configuration beside them. `dump_episodes` writes
`Episode.to_dict()` with the step (sampler side); `dump_batch` writes one record per row of the verl
`DataProto` rLLM trains (`trainer_state.backend_batch`, after `transform_to_backend_batch` cut the rows
to the cap and advantages were broadcast), in the batch's own key names (trainer side). No rLLM or verl
import: they read attributes and tensors (`tolist`), so they run wherever the trainer runs."""

from __future__ import annotations

import json
import os
import socket
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..adapters.rllm import BATCH_ROWS, BATCH_TENSORS, MISSING, SETTINGS, TESTED_RLLM, WORKFLOW_TRAINER

# What AgentWorkflowPPOTrainer reads from its configuration for the batch it trains (rllm/trainer/verl/
# agent_workflow_trainer.py at 9beb6e0): setting -> the configuration path it reads it from
WORKFLOW_SETTINGS = {
    "loss_agg_mode": "actor_rollout_ref.actor.loss_agg_mode",  # :353, verl's actor loss aggregation
    "adv_estimator": "algorithm.adv_estimator",  # :427, verl's compute_advantage
    "norm_adv_by_std_in_grpo": "algorithm.norm_adv_by_std_in_grpo",  # :431
    "rollout_n": "actor_rollout_ref.rollout.n",  # :201, :430
    "use_kl_in_reward": "algorithm.use_kl_in_reward",  # :408
    "stepwise_advantage_enable": "rllm.stepwise_advantage.enable",  # :289, :395, :414
    "stepwise_advantage_mode": "rllm.stepwise_advantage.mode",
    "rejection_sample_enable": "rllm.rejection_sample.enable",  # :267
    "mask_truncated_samples": "rllm.mask_truncated_samples",  # :446
    "distill_enable": "rllm.distill.enable",  # :74
}
# rLLM's names the workflow-trainer record overrides or calls, with the parameters it passes (at 9beb6e0;
# tests/test_framework_drift.py checks them against an installed rLLM)
WORKFLOW_NAMES = {
    "rllm.trainer.verl.agent_workflow_trainer.AgentWorkflowPPOTrainer": {
        "__init__": ("config", "tokenizer", "workflow_class", "workflow_args"),
        "generate_trajectories": ("batch", "timing_raw"),
        "_pad_dataproto_to_world_size": ("batch",),
        "fit_agent": (),
        "init_workers": (),
        "shutdown": (),
    },
    "rllm.workflows.workflow.Workflow": {"run_with_termination_handling": ("task", "uid")},
    "rllm.trainer.verl.train_agent_ppo.TaskRunner": {
        "run": ("config", "workflow_class", "workflow_args"),
        "add_actor_rollout_worker": ("config",),
        "add_critic_worker": ("config",),
        "add_ref_policy_worker": ("config", "ref_policy_cls"),
        "init_resource_pool_mgr": ("config",),
    },
}
# what no record of the trainer loop holds: verl divides the loss inside update_actor on the workers, per
# mini-batch (:467-482), and returns metrics only; the weights' version is the step itself
WORKFLOW_NOT_RECORDED = {
    "loss_denominator": "AgentWorkflowPPOTrainer's loss denominator is computed per mini-batch inside verl's "
    "update_actor on the workers, which returns metrics only (agent_workflow_trainer.py:467-482)",
    "trainer_version": "AgentWorkflowPPOTrainer's records do not carry the trainer's weight version",
}


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


def rllm_version() -> str | None:
    """The installed rLLM's version (its pyproject's, e.g. "0.3.0.pre"), None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("rllm")
    except metadata.PackageNotFoundError:
        return None


def _warn_version(version: str | None) -> None:
    if version not in TESTED_RLLM:
        warnings.warn(
            f"rollout-audit: rLLM {version or '(version unknown)'} is outside the tested range "
            f"({', '.join(TESTED_RLLM)}); the records are written as that version's trainer shapes them",
            stacklevel=3,
        )


_ABSENT = object()


def _at_path(config: Any, path: str) -> Any:
    """`config` at a dotted path (an OmegaConf DictConfig, a dict, or attributes); `_ABSENT` when a key is missing."""
    node = config
    for key in path.split("."):
        if node is None:
            return _ABSENT
        got = node.get(key, _ABSENT) if hasattr(node, "get") else getattr(node, key, _ABSENT)
        if got is _ABSENT:
            return _ABSENT
        node = got
    return node


def workflow_settings(config: Any) -> dict[str, Any]:
    """The settings record of `AgentWorkflowPPOTrainer`: each of `WORKFLOW_SETTINGS` read from the trainer's
    configuration, the rLLM version, and `not_recorded` naming what it could not read and what no trainer
    record holds (`WORKFLOW_NOT_RECORDED`)."""
    version = rllm_version()
    out: dict[str, Any] = {"trainer": WORKFLOW_TRAINER, "rllm_version": version}
    lacks = dict(WORKFLOW_NOT_RECORDED)
    for name, path in WORKFLOW_SETTINGS.items():
        value = _at_path(config, path)
        if value is _ABSENT:
            lacks[name] = f"{path} is not in the trainer's configuration"
        else:
            out[name] = _plain(value)
    out["not_recorded"] = lacks
    return out


class _Recorder:
    """Where a recorder writes (`ROLLOUT_AUDIT_RLLM_DIR`, else rollout_dumps/rllm) and how it says what it lost."""

    audit_dir: str = os.environ.get("ROLLOUT_AUDIT_RLLM_DIR", "rollout_dumps/rllm")
    _ra_name = "the recorder"

    def _ra_write(self, what: str, write: Any, step: int) -> None:
        try:
            write()
        except Exception as e:  # noqa: BLE001 - the recorder never stops training; it says what it lost
            lost = f"the {what} of step {step} ({type(e).__name__}: {e})"
            warnings.warn(f"rollout-audit: {self._ra_name} did not record {lost}", stacklevel=2)
            try:
                _append(Path(self.audit_dir) / f"rllm-missing-{socket.gethostname()}-{os.getpid()}.jsonl",
                        [{MISSING: lost}])  # fmt: skip
            except OSError:
                pass  # the marker cannot be written either: the warning stands, training goes on unchanged


class AuditedBackend(_Recorder):
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

    _ra_name = "AuditedBackend"
    _ra_async_step: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _warn_version(rllm_version())

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


def audited_backend(backend_cls: type, directory: str | os.PathLike | None = None) -> type:
    """`backend_cls` (rLLM's `VerlBackend`, `TinkerBackend`, ...) with `AuditedBackend` writing to `directory`."""
    attrs = {} if directory is None else {"audit_dir": str(directory)}
    return type(f"Audited{backend_cls.__name__}", (AuditedBackend, backend_cls), attrs)


def _record_episodes(workflow_cls: Any, sink: dict[str, Any]) -> type:
    """`workflow_cls` keeping, in `sink`, the episode each `run_with_termination_handling` returns (the call
    AgentWorkflowEngine makes per rollout, rllm/engine/agent_workflow_engine.py:117), keyed by its id so a
    retried rollout keeps the attempt the engine returns (:115-146). The episode is returned unchanged."""

    async def run_with_termination_handling(self: Any, task: Any, uid: str, **kwargs: Any) -> Any:
        episode = await workflow_cls.run_with_termination_handling(self, task=task, uid=uid, **kwargs)
        if episode is not None:
            sink[str(getattr(episode, "id", uid))] = episode
        return episode

    attrs = {"run_with_termination_handling": run_with_termination_handling, "__module__": workflow_cls.__module__}
    return type(workflow_cls.__name__, (workflow_cls,), attrs)


class AuditedWorkflowTrainer(_Recorder):
    """A mixin for rLLM's `AgentWorkflowPPOTrainer` (rllm/trainer/verl/agent_workflow_trainer.py at 9beb6e0)
    that writes, after the trainer's own method and changing nothing it returns:

    - the episodes of every training `generate_trajectories` (:867-887; validation batches, `meta_info`
      `validate`, are not written), from the workflow class it was given, wrapped so each episode the engine
      gets is kept (`_record_episodes`);
    - the rows it trains: the batch `_pad_dataproto_to_world_size` returns once advantages are on it (:451,
      after the advantages :389-438, the `is_valid` filter :441-443 and `mask_truncated_samples` :446-448,
      right before `update_actor` :482; its calls before the advantages, :316 and :320, are not written),
      with `uid`, the key verl's GRPO grouped them by (:393), and a settings record (`workflow_settings`:
      `loss_agg_mode` and the advantage settings read from the trainer's own configuration).

    Use it through `audited_workflow_trainer(AgentWorkflowPPOTrainer, dir)` (or `audited_task_runner(dir)`,
    rLLM's `TaskRunner` building it). A record it cannot write is a warning and a `rollout_audit_missing`
    line, which `check` refuses; an rLLM version outside the tested range is one warning at start-up."""

    _ra_name = "AuditedWorkflowTrainer"

    def __init__(self, *args: Any, workflow_class: Any = None, **kwargs: Any) -> None:
        self._ra_episodes: dict[str, Any] = {}
        if workflow_class is not None:
            workflow_class = _record_episodes(workflow_class, self._ra_episodes)
        super().__init__(*args, workflow_class=workflow_class, **kwargs)  # type: ignore[call-arg]
        self._ra_settings = workflow_settings(getattr(self, "config", None))
        _warn_version(self._ra_settings["rllm_version"])

    def generate_trajectories(self, batch: Any, timing_raw: Any = None, **kwargs: Any) -> Any:
        self._ra_episodes.clear()
        out = super().generate_trajectories(batch, timing_raw=timing_raw, **kwargs)  # type: ignore[misc]
        if not (getattr(batch, "meta_info", None) or {}).get("validate", False):
            step, episodes = int(getattr(self, "global_steps", 0)), list(self._ra_episodes.values())
            self._ra_write("episodes", lambda: dump_episodes(self.audit_dir, episodes, step), step)
        self._ra_episodes.clear()
        return out

    def _pad_dataproto_to_world_size(self, batch: Any) -> Any:
        out = super()._pad_dataproto_to_world_size(batch)  # type: ignore[misc]
        if "advantages" in out.batch.keys():
            step = int(getattr(self, "global_steps", 0))
            self._ra_write("batch", lambda: self._ra_dump(out, step), step)
        return out

    def _ra_dump(self, batch: Any, step: int) -> Path:
        rows = batch_records(batch, step)
        path = Path(self.audit_dir) / f"rllm-batch-{socket.gethostname()}-{os.getpid()}.jsonl"
        return _append(path, [{"global_step": step, SETTINGS: self._ra_settings}, *rows])


def audited_workflow_trainer(trainer_cls: type, directory: str | os.PathLike | None = None) -> type:
    """`trainer_cls` (rLLM's `AgentWorkflowPPOTrainer`) with `AuditedWorkflowTrainer` writing to `directory`."""
    attrs = {} if directory is None else {"audit_dir": str(directory)}
    return type(f"Audited{trainer_cls.__name__}", (AuditedWorkflowTrainer, trainer_cls), attrs)


def merged_workflow_args(given: Mapping[str, Any] | None, configured: Mapping[str, Any] | None) -> dict[str, Any]:
    """The workflow arguments `TaskRunner.run` passes (rllm/trainer/verl/train_agent_ppo.py:193-201): the
    given ones, updated by `rllm.workflow.workflow_args` (a dict value merged into a dict, None skipped)."""
    out = dict(given or {})
    for key, value in (configured or {}).items():
        if value is None:
            continue
        if isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def audited_task_runner(directory: str | os.PathLike | None = None) -> type:
    """rLLM's `TaskRunner` (rllm/trainer/verl/train_agent_ppo.py:54-223) whose `run` builds
    `audited_workflow_trainer(AgentWorkflowPPOTrainer, directory)` where rLLM's builds `AgentWorkflowPPOTrainer`
    (:203, a name in code, not in the configuration): the same setup, through TaskRunner's own methods and the
    verl functions its `run` calls (:149-191). Start it as rLLM's `AgentTrainer._train_verl` starts TaskRunner
    (rllm/trainer/agent_trainer.py:85-93)."""
    from rllm.trainer.verl.agent_workflow_trainer import AgentWorkflowPPOTrainer
    from rllm.trainer.verl.train_agent_ppo import TaskRunner

    trainer_cls = audited_workflow_trainer(AgentWorkflowPPOTrainer, directory)

    class AuditedTaskRunner(TaskRunner):  # type: ignore[misc, valid-type]
        def run(self, config: Any, workflow_class: Any = None, workflow_args: Any = None) -> None:
            from omegaconf import OmegaConf
            from verl.trainer.ppo.reward import load_reward_manager
            from verl.trainer.ppo.utils import need_critic, need_reference_policy
            from verl.utils import hf_processor, hf_tokenizer
            from verl.utils.config import validate_config
            from verl.utils.fs import copy_to_local

            if workflow_class is None:
                raise ValueError("audited_task_runner: run needs workflow_class, as rLLM's TaskRunner.run does")
            OmegaConf.register_new_resolver("mul", lambda x, y: int(x) * int(y), replace=True)
            OmegaConf.resolve(config)
            actor_cls, group_cls = self.add_actor_rollout_worker(config)
            self.add_critic_worker(config)
            self.add_ref_policy_worker(config, actor_cls)
            validate_config(
                config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
            )
            model = config.actor_rollout_ref.model
            local = copy_to_local(model.path, use_shm=model.get("use_shm", False))
            trust = config.data.get("trust_remote_code", False)
            tokenizer = hf_tokenizer(local, trust_remote_code=trust)
            reward_kwargs = config.reward_model.get("reward_kwargs", {})
            trainer = trainer_cls(
                config=config,
                tokenizer=tokenizer,
                processor=hf_processor(local, trust_remote_code=trust, use_fast=True),
                role_worker_mapping=self.role_worker_mapping,
                resource_pool_manager=self.init_resource_pool_mgr(config),
                ray_worker_group_cls=group_cls,
                reward_fn=load_reward_manager(config, tokenizer, **reward_kwargs),
                val_reward_fn=load_reward_manager(config, tokenizer, **reward_kwargs),
                workflow_class=workflow_class,
                workflow_args=merged_workflow_args(workflow_args, config.rllm.workflow.get("workflow_args")),
            )
            trainer.init_workers()
            try:
                trainer.fit_agent()
            finally:
                trainer.shutdown()

    return AuditedTaskRunner
