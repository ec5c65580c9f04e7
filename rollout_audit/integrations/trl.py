"""TRL: a recorder for a `rollout_func`, and guards that audit `GRPOTrainer` and `RLOOTrainer` in the loop.

`RolloutRecorder(rollout_func, log_dir)` is passed to `GRPOTrainer(rollout_func=...)` in place of the
user's function: it calls it and writes what it returned, unchanged, one JSON line per sample, for
`rollout-audit check --from trl LOG_DIR OUTPUT_DIR/completions` (with TRL's own `log_completions`
Parquet for the rewards and advantages). `AuditedGRPOTrainer` / `AuditedRLOOTrainer` convert each
generation batch and each micro-batch update with `rollout_audit.adapters.trl` and audit them before
the optimizer step (warn, raise or skip), under the truncation the trainer's own configuration
follows (`trainer_settings`), and can write the contract log with `RolloutWriter`.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch
from trl import GRPOTrainer, RLOOTrainer

from ..adapters.trl import (
    ROLLOUT_RECORD,
    ROLLOUT_VERSION,
    TRAINER_LOGPROBS,
    TRL_LACKS,
    _np,
    _tokenizer_id,
    advantage_estimator,
    recomputes_logprobs,
    records_from_batch,
    trainer_truncation,
    update_from_step,
)
from ..api import audit_tables
from ..contract import schema as S
from ..contract.config import Config
from ..contract.errors import AuditFailed
from ..reading.records import records_to_table
from ..reporting.report import Report
from ..writing import write_table

OnFinding = Literal["warn", "raise", "skip"]
__all__ = [
    "TRL_LACKS",
    "AuditFailed",
    "AuditSettings",
    "AuditedGRPOTrainer",
    "AuditedRLOOTrainer",
    "RolloutRecorder",
    "advantage_estimator",
    "records_from_batch",
    "recomputes_logprobs",
    "trainer_settings",
    "trainer_truncation",
    "update_from_step",
    "version_warning",
]

TESTED = ("1.16.0",)  # the TRL releases the guards and the recorder were read against
_warned = False


def version_warning(version: str | None) -> str | None:
    """One line when the installed TRL is not a release the integration was read against."""
    if version in TESTED:
        return None
    return (
        f"rollout-audit: trl {version or '(unknown version)'} is outside the tested range ({', '.join(TESTED)}); "
        "the trainer's batch may have changed: check the audit's not-run list for what was not recorded"
    )


def _warn_version() -> None:
    """`version_warning` for the installed TRL, once per process."""
    global _warned
    import trl

    warning = None if _warned else version_warning(getattr(trl, "__version__", None))
    _warned = True
    if warning:
        warnings.warn(warning, stacklevel=3)


# ---------------------------------------------------------------- the guard


@dataclass
class AuditSettings:
    """What the guard does with findings, and the fields TRL does not record."""

    on_finding: OnFinding = "warn"
    log_dir: str | Path | None = None  # write trajectories/ and updates/ with RolloutWriter
    environment_id: str | None = None
    environment_version: str | None = None
    verifier_version: str | None = None
    reset_seed: int | None = None
    # TRL's ε; `truncation`, unless set here, is the one the trainer's GRPOConfig follows
    config: Config = field(default_factory=lambda: Config(grpo_epsilon=1e-4))
    ignore: tuple[str, ...] = ()
    # the audit figures added to every logged step: "few" (FEW_FIGURES) or "all" (per family, replay gaps)
    metrics: Literal["few", "all"] = "few"


FEW_FIGURES = ("errors", "warnings", "exit_code", "trainable_share", "policy_lag_max")


def _declared(table: pa.Table, reasons: Mapping[str, str], add: bool = False) -> pa.Table:
    """`table` whose `rollout_log.not_recorded` gives `reasons` for what it already declares missing
    (and, with `add`, declares the others missing too)."""
    meta = dict(table.schema.metadata or {})
    lacks = json.loads(meta.get(S.META_NOT_RECORDED) or b"{}")
    lacks.update({k: v for k, v in reasons.items() if add or k in lacks})
    if not lacks:
        return table
    meta[S.META_NOT_RECORDED] = json.dumps(lacks, sort_keys=True).encode()
    return table.replace_schema_metadata(meta)


def _summary(what: str, report: Report) -> str:
    errors = report.findings.filter(report.findings["severity"] == "error")
    first = errors.row(0, named=True) if errors.height else {}
    return f"rollout-audit: {what}: {errors.height} error finding(s) {sorted(set(errors['code']))}" + (
        f"; first: {first['code']} {first['message']}" if first else ""
    )


class _Guard:
    """What the guards share: the audit of each generation batch (`_generate_and_score_completions`) and
    of each micro-batch update (`compute_loss`), both methods TRL's GRPOTrainer and RLOOTrainer define
    with the same signature and the same batch keys. A subclass says how its trainer reduces the loss
    (`_loss_type`), which estimator its advantages follow (`_estimator`) and how a skipped row is kept
    out of the loss (`_skip_rows`)."""

    audit: AuditSettings
    args: Any
    state: Any
    accelerator: Any
    model: Any
    processing_class: Any
    num_generations: Any
    num_iterations: Any
    temperature: float
    top_p: float
    eos_token_ids: Any
    max_completion_length: Any
    current_gradient_accumulation_steps: int
    _metrics: Any

    def __init__(self, *args: Any, audit: AuditSettings | None = None, **kwargs: Any) -> None:
        _warn_version()
        self.audit = audit or AuditSettings()
        self.audit_reports: list[tuple[str, Report]] = []
        self._ra_generation = 0
        self._ra_table: pa.Table | None = None
        self._ra_rewards: torch.Tensor | None = None
        self._ra_micro = 0
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        truncation, why = trainer_truncation(self.args)
        if "truncation" in self.audit.config.model_fields_set:
            if self.audit.config.truncation != truncation:
                warnings.warn(
                    f"rollout-audit: configured truncation = {self.audit.config.truncation!r}, but TRL follows {why}",
                    stacklevel=2,
                )
        else:
            self.audit.config = self.audit.config.model_copy(update={"truncation": truncation})
            warnings.warn(f"rollout-audit: auditing under the settings TRL follows: {why}", stacklevel=2)
        recomputed = self._recomputes()
        if recomputed and "compare_logprobs" not in self.audit.config.model_fields_set:
            # L207 compares the engine's log-probs with the trainer's recomputation, no replayer needed
            self.audit.config = self.audit.config.model_copy(update={"compare_logprobs": TRAINER_LOGPROBS})
        self._write_trainer_settings()

    def _recomputes(self) -> bool:
        """Whether the batch carries the trainer's per-token recomputation (`old_per_token_logps`)."""
        return False

    def _loss_type(self) -> str:
        raise NotImplementedError

    def _estimator(self) -> str | None:
        raise NotImplementedError

    def _no_estimator(self) -> str:
        """Why `_estimator` is None: the settings whose advantages no contract estimator recomputes."""
        raise NotImplementedError

    def _settings_read(self) -> dict[str, Any]:
        """The trainer's own settings (copied by its `__init__` from its config) the records follow."""
        return {
            "num_generations": self.num_generations,
            "steps_per_generation": self.args.steps_per_generation,
            "num_iterations": self.num_iterations,
            "gradient_accumulation_steps": self.args.gradient_accumulation_steps,
            "mask_truncated_completions": bool(getattr(self.args, "mask_truncated_completions", False)),
            "max_completion_length": self.max_completion_length,
        }

    def _lacks(self) -> dict[str, str]:
        """Reasons, for this trainer, that replace TRL_LACKS' for what its batch does not carry."""
        return {}

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[no-untyped-def]
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # type: ignore[misc]
        weighted = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)  # type: ignore[attr-defined]
        weighted[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # TRL's unscorable rows
        self._ra_rewards = weighted
        return rewards_per_func

    def _ra_records(
        self, out: Mapping[str, Any], inputs: Sequence[Mapping], batch_id: str, excluded: np.ndarray | None = None
    ) -> pa.Table:
        a = self.audit
        n = _np(out["completion_ids"]).shape[0]
        rewards = None if self._ra_rewards is None else _np(self._ra_rewards)
        if rewards is not None and rewards.shape[0] != n:  # several processes: keep this process's rows
            start = self.accelerator.process_index * n
            rewards = rewards[start : start + n]
        table = records_from_batch(
            out,
            tokenizer=self.processing_class,
            policy_version=self.state.global_step,
            batch_id=batch_id,
            group_size=self.num_generations,
            rewards=rewards,
            temperature=self.temperature,
            top_p=self.top_p,
            eos_token_ids=list(self.eos_token_ids),
            environment_id=a.environment_id,
            environment_version=a.environment_version,
            verifier_version=a.verifier_version,
            reset_seed=a.reset_seed,
            extras=list(inputs) if getattr(self, "rollout_func", None) is not None else None,
            excluded=excluded,
            mask_truncated_completions=bool(getattr(self.args, "mask_truncated_completions", False)),
        )
        return _declared(table, self._lacks())

    def _generate_and_score_completions(self, inputs):  # type: ignore[no-untyped-def]
        out = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        if not bool(getattr(self.model, "training", False)):
            return out
        batch_id = f"gen{self._ra_generation:05d}"
        self._ra_generation += 1
        table = self._ra_records(out, inputs, batch_id)
        report = audit_tables(table, None, config=self.audit.config, ignore=self.audit.ignore)
        self.audit_reports.append((batch_id, report))
        self._ra_metrics(report, table)
        if not report.ok:
            bad = self._act(f"generation batch {batch_id}", report, table)
            if bad is not None:  # records keep the provenance of the batch as generated
                table = self._ra_records(out, inputs, batch_id, excluded=bad)
                out = self._skip_rows(dict(out), bad)
        self._ra_table = table
        self._ra_micro = 0
        self._write(table, "trajectories", f"{batch_id}.parquet")
        out["_ra_row"] = torch.arange(table.num_rows, device=self.accelerator.device)
        return out

    def _act(self, what: str, report: Report, table: pa.Table) -> np.ndarray | None:
        """Apply `on_finding`; under `skip`, the rows to exclude."""
        msg = _summary(what, report)
        if self.audit.on_finding == "raise":
            raise AuditFailed(msg, report)
        warnings.warn(msg, stacklevel=3)
        if self.audit.on_finding != "skip":
            return None
        errors = report.findings.filter(report.findings["severity"] == "error")
        ids = table.column("trajectory_id").to_numpy(zero_copy_only=False)
        if errors["trajectory_id"].is_null().any():
            return np.ones(len(ids), bool)
        return np.isin(ids, errors["trajectory_id"].to_list())

    def _skip_rows(self, out: dict, bad: np.ndarray) -> dict:
        raise NotImplementedError

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        rows = inputs.get("_ra_row")
        failed = False
        if rows is not None and bool(getattr(self.model, "training", False)) and self._ra_table is not None:
            failed = self._audit_update(inputs, _np(rows))
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)  # type: ignore[misc]
        return loss * 0.0 if failed else loss

    def _audit_update(self, inputs: Mapping[str, Any], rows: np.ndarray) -> bool:
        """Build, audit and write the update record of this micro-batch; True if it must not train."""
        assert self._ra_table is not None
        ids = np.asarray(self._ra_table.column("trajectory_id").to_pylist(), dtype=object)
        args: Any = self.args  # a GRPOConfig
        spans = -(-args.steps_per_generation * self.num_iterations // self.current_gradient_accumulation_steps)
        rec = update_from_step(
            inputs,
            trajectory_ids=list(ids[rows]),
            loss_type=self._loss_type(),
            update_step=self.state.global_step,
            trainer_version=self.state.global_step,
            gradient_accumulation_steps=self.current_gradient_accumulation_steps,
            steps_per_generation=args.steps_per_generation,
            num_processes=self.accelerator.num_processes,
            max_completion_length=self.max_completion_length,
            window_trajectory_ids=list(ids) if self.accelerator.num_processes == 1 else None,
            advantage_estimator=self._estimator(),
            max_policy_lag=max(spans - 1, 0),
        )
        label = f"update {self.state.global_step}.{self._ra_micro}"
        self._ra_micro += 1
        table = records_to_table([rec], "updates")
        if "advantage_estimator" not in rec:  # said in the record, hence in the audit's not-run list
            why = self._no_estimator()
            table = _declared(table, {"advantage_estimator": why, "updates.advantage_estimator": why}, add=True)
        report = audit_tables(
            self._ra_table, table, config=self.audit.config, select=["U", "P503"], ignore=self.audit.ignore
        )
        self.audit_reports.append((label, report))
        self._ra_metrics(report, None, prefix="audit/update/")
        self._write(table, "updates", f"update-{self.state.global_step:05d}-{self._ra_micro - 1}.parquet")
        if report.ok:
            return False
        return self._act(label, report, self._ra_table) is not None

    def _ra_metrics(self, report: Report, table: pa.Table | None, prefix: str = "audit/") -> None:
        """The audit's figures into GRPO's own metrics: its `log` averages them over the logging
        steps and sends them wherever the trainer reports (log_history, W&B, TensorBoard)."""
        import polars as pl

        from ..workflow.figures import audit_figures, trainable_share

        share = trainable_share(pl.DataFrame(pl.from_arrow(table))) if table is not None else None
        for key, value in audit_figures(report, share, prefix=prefix).items():
            if self.audit.metrics == "all" or key[len(prefix) :] in FEW_FIGURES:
                self._metrics["train"][key].append(value)

    def _write_trainer_settings(self) -> None:
        """Next to the log, the settings it was audited with (`[tool.rollout-audit]`, which
        `rollout-audit check LOG_DIR` reads), so that a later audit follows the same settings."""
        if self.audit.log_dir is None or not self.accelerator.is_main_process:
            return
        path = Path(self.audit.log_dir) / "pyproject.toml"
        if path.exists():
            return
        c = self.audit.config
        path.parent.mkdir(parents=True, exist_ok=True)
        read = ", ".join(f"{k}={v!r}" for k, v in self._settings_read().items()).replace("\n", " ")
        path.write_text(
            f"# the settings the trainer's configuration follows, written by {type(self).__name__}\n"
            f"# {type(self.args).__name__} as the trainer read it: {read}\n"
            f'[tool.rollout-audit]\ntruncation = "{c.truncation}"\ngrpo_epsilon = {c.grpo_epsilon!r}\n'
            + (f"compare_logprobs = {json.dumps(c.compare_logprobs)}\n" if c.compare_logprobs else "")
        )

    def _write(self, table: pa.Table, kind: str, name: str) -> None:
        if self.audit.log_dir is None or not self.accelerator.is_main_process:
            return
        # the contract columns through RolloutWriter, then old_per_token_logps as they are (L207 reads them)
        write_table(Path(self.audit.log_dir) / kind / name, table, kind, validate=False)


class AuditedGRPOTrainer(_Guard, GRPOTrainer):
    """`GRPOTrainer` that audits every generation batch and every micro-batch update before
    the optimizer step. `audit=AuditSettings(on_finding=...)`: `warn` (default), `raise`
    (AuditFailed), or `skip` (the loss mask of trajectories with an error finding is zeroed,
    all of them when a finding names none; a failing update trains with a zero loss).
    The truncation policy is the one the trainer's `GRPOConfig` follows (`trainer_settings`),
    stated once as a warning, unless `audit.config` sets `truncation` itself.
    Reports are kept in `audit_reports` as (label, Report)."""

    def _recomputes(self) -> bool:
        return recomputes_logprobs(self.args, bool(getattr(self, "use_vllm", False)))

    def _loss_type(self) -> str:
        return str(self.loss_type)

    def _estimator(self) -> str | None:
        return advantage_estimator(self)

    def _settings_read(self) -> dict[str, Any]:
        t: Any = self
        return {**super()._settings_read(), "loss_type": t.loss_type, "scale_rewards": t.scale_rewards}

    def _no_estimator(self) -> str:
        return (
            f"GRPOConfig scale_rewards={self.scale_rewards!r}, multi_objective_aggregation="  # type: ignore[attr-defined]
            f"{getattr(self, 'multi_objective_aggregation', 'sum_then_normalize')!r}: TRL's advantages follow no "
            "contract estimator (batch-level std, or rewards normalised before they are summed)"
        )

    def _skip_rows(self, out: dict, bad: np.ndarray) -> dict:
        """Zero the loss mask (through tool_mask, so attention is unchanged) of the excluded rows."""
        cm = out["completion_mask"]
        tm = out.get("tool_mask")
        keep = torch.as_tensor(~bad, device=cm.device, dtype=cm.dtype).unsqueeze(1)
        out["tool_mask"] = (torch.ones_like(cm) if tm is None else tm) * keep
        out["num_items_in_batch"] = self.accelerator.gather((cm * out["tool_mask"]).sum()).sum()
        return out


_RLOO_LACKS = {
    "behavior_logprobs": "RLOOTrainer keeps no per-token log-probs of the sampler: it asks vLLM for none "
    "(rloo_trainer.py:782, :1306 in trl 1.16.0) and its batch carries only old_logps, the trainer's own "
    "sequence sum under the sampling weights (:1610)",
    "turns.logprob": "RLOOTrainer records no per-turn log-prob (it takes no rollout_func)",
    "turns.context_length": "RLOOTrainer records no context per turn (it takes no rollout_func)",
    "turns.context_sha256": "RLOOTrainer records no context per turn (it takes no rollout_func)",
    "turns.sampled_token_ids": "RLOOTrainer records no sampled ids per turn (it takes no rollout_func)",
    "reward": "RLOOTrainer's batch carries advantages, not rewards; AuditedRLOOTrainer records the weighted "
    "sum _calculate_rewards gave",
}


class AuditedRLOOTrainer(_Guard, RLOOTrainer):
    """`RLOOTrainer` under the same guard as `AuditedGRPOTrainer` (same `audit=` settings). RLOO's loss is a
    sequence-level ratio times the advantage, averaged over the micro-batch's sequences
    (`per_sequence_loss.mean()`, rloo_trainer.py:1833 in trl 1.16.0) and divided by gradient accumulation by
    the HF Trainer (TRL's BaseTrainer sets `model_accepts_loss_kwargs = False`, base_trainer.py:77):
    declared `seq_mean_token_sum` over B × GA, whatever the configuration (RLOOConfig has no loss_type).
    Its advantages are the leave-one-out baseline over the group's scorable rewards (:1683-1699), declared
    `rloo` unless the trainer's `normalize_advantages` (:1695), a KL term in the reward (`beta` != 0,
    RLOO's default 0.05, :1664-1673) or `reward_clip_range` (:1660) change them: then no contract
    estimator matches, the update record says which setting, and U603 is not run with that reason. RLOO
    keeps no per-token behaviour log-probs (only the sequence sum `old_logps`), so the L checks are not
    run. Under `skip` a flagged row's advantage is zeroed (its sequence term then carries no gradient)."""

    def _loss_type(self) -> str:
        return "rloo"

    def _changes_advantages(self) -> list[str]:
        """The trainer's settings that make its advantages other than the plain leave-one-out ones."""
        t: Any = self
        said = ["normalize_advantages=True (rloo_trainer.py:1695)"] if t.normalize_advantages else []
        if t.beta != 0.0:
            said.append(
                f"beta={t.beta!r}: a KL penalty the batch does not carry is in each reward (rloo_trainer.py:1664-1673)"
            )
        if t.reward_clip_range:
            said.append(
                f"reward_clip_range={tuple(t.reward_clip_range)!r}: rewards clipped before the baseline (rloo_trainer.py:1660)"
            )
        return said

    def _estimator(self) -> str | None:
        return None if self._changes_advantages() else "rloo"

    def _settings_read(self) -> dict[str, Any]:
        t: Any = self
        return {
            **super()._settings_read(),
            "beta": t.beta,
            "normalize_advantages": t.normalize_advantages,
            "reward_clip_range": t.reward_clip_range,
            "epsilon_low": t.epsilon_low,
            "epsilon_high": t.epsilon_high,
        }

    def _no_estimator(self) -> str:
        return (
            f"RLOOConfig {'; '.join(self._changes_advantages())}: RLOO's advantages are not the leave-one-out "
            "difference of the recorded rewards, and no contract estimator recomputes them (beta=0.0, "
            "normalize_advantages=False and no reward_clip_range make them `rloo`)"
        )

    def _lacks(self) -> dict[str, str]:
        return _RLOO_LACKS

    def _skip_rows(self, out: dict, bad: np.ndarray) -> dict:
        adv = out["advantages"]
        out["advantages"] = adv * torch.as_tensor(~bad, device=adv.device, dtype=adv.dtype)
        return out


# ---------------------------------------------------------------- the rollout_func recorder

_REQUIRED = ("prompt_ids", "completion_ids", "logprobs")  # what GRPOTrainer requires (grpo_trainer.py:2211)


def trainer_settings(trainer: Any) -> dict[str, Any]:
    """What the audit needs of the trainer that called the rollout_func, read from it."""
    args = trainer.args
    tok = trainer.processing_class
    return {
        "temperature": getattr(trainer, "temperature", None),
        "top_p": getattr(trainer, "top_p", None),
        "num_generations": getattr(trainer, "num_generations", None),
        "eos_token_ids": [int(x) for x in getattr(trainer, "eos_token_ids", None) or [tok.eos_token_id]],
        "pad_token_id": getattr(tok, "pad_token_id", None),
        "tokenizer": getattr(tok, "name_or_path", None),
        "tokenizer_id": _tokenizer_id(tok),
        "mask_truncated_completions": bool(getattr(args, "mask_truncated_completions", False)),
        "scale_rewards": str(getattr(trainer, "scale_rewards", getattr(args, "scale_rewards", "group"))),
        "multi_objective_aggregation": str(getattr(trainer, "multi_objective_aggregation", "sum_then_normalize")),
        "reward_func_names": list(getattr(trainer, "reward_func_names", []) or []),
        "reward_weights": [float(w) for w in _np(getattr(trainer, "reward_weights", []))],
        "loss_type": getattr(trainer, "loss_type", None),
        "num_processes": int(trainer.accelerator.num_processes),
        "trainer": type(trainer).__name__,
    }


class RolloutRecorder:
    """A rollout_func that calls `rollout_func` and records what it returned, unchanged: for each sample,
    its prompt, `prompt_ids`, `completion_ids`, `logprobs`, `env_mask`, `logprob_token_ids` and every other
    per-sample field (turn_context_ids, turn_sampled_token_ids, ...), with the call's number, the trainer's
    global step and mode, and `trainer_settings`. It forwards the very object the function returned. A
    record it cannot write is a warning, never a failed step; what it did not write is named in
    `missing` and as a `missing` line in its file, which `check --from trl` refuses to pass over (exit 2)."""

    def __init__(self, rollout_func: Any, log_dir: str | os.PathLike) -> None:
        _warn_version()
        self.rollout_func = rollout_func
        self.log_dir = Path(log_dir)
        self.calls = 0
        self.missing: list[str] = []
        self.__name__ = getattr(rollout_func, "__name__", "rollout_func")

    def __call__(self, prompts: list, trainer: Any) -> Any:
        output = self.rollout_func(prompts, trainer)
        try:
            self._record(prompts, trainer, output)
        except Exception as e:  # noqa: BLE001 - the recorder never stops training; it says what it lost
            self._lost(f"call {self.calls}: {type(e).__name__}: {e}")
        self.calls += 1
        return output

    def _record(self, prompts: list, trainer: Any, output: Any) -> None:
        missing = [k for k in _REQUIRED if k not in output]
        if missing:  # TRL raises on it right after; nothing to record
            self._lost(f"call {self.calls}: the rollout_func returned no {', '.join(missing)}")
            return
        n = len(output["completion_ids"])
        per_sample = {
            k: v for k, v in output.items() if isinstance(v, (list, tuple)) and len(v) == n and k not in _REQUIRED
        }
        head = {
            ROLLOUT_RECORD: ROLLOUT_VERSION,
            "call": self.calls,
            "process": int(trainer.accelerator.process_index),
            "step": int(trainer.state.global_step),
            "mode": "train" if bool(getattr(trainer.model, "training", True)) else "eval",
            "trainer": trainer_settings(trainer),
        }
        tok = trainer.processing_class
        with self._file().open("a", encoding="utf-8") as fh:
            for i in range(n):
                rec = {**head, "index": i, "prompt": prompts[i] if i < len(prompts) else None}
                rec.update({k: output[k][i] for k in _REQUIRED})
                rec.update({k: v[i] for k, v in per_sample.items()})
                # the completion as TRL decodes it for its reward functions and log_completions when the
                # tokenizer parses no response (grpo_trainer.py:2241-2245): what joins the two records
                rec["completion_text"] = tok.decode(list(output["completion_ids"][i]), skip_special_tokens=True)
                fh.write(json.dumps(rec, default=_plain) + "\n")

    def _file(self) -> Path:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self.log_dir / f"trl-rollouts-{socket.gethostname()}-{os.getpid()}.jsonl"

    def _lost(self, what: str) -> None:
        self.missing.append(what)
        warnings.warn(f"rollout-audit: RolloutRecorder did not record {what}", stacklevel=3)
        try:
            with self._file().open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({ROLLOUT_RECORD: ROLLOUT_VERSION, "missing": what}) + "\n")
        except OSError:
            pass  # the marker cannot be written either: the warning stands, training goes on unchanged


def _plain(value: Any) -> Any:
    """Tensors and numpy values as lists / numbers."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
