"""TRL: a guard that audits `GRPOTrainer` in the loop.

`AuditedGRPOTrainer` converts each generation batch and each micro-batch update with
`rollout_audit.adapters.trl` and audits them before the optimizer step (warn, raise or skip),
under the truncation policy the trainer's own `GRPOConfig` follows (`trainer_policy`), and can
write the contract log with `RolloutWriter`.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch
from trl import GRPOTrainer

from ..adapters.trl import (
    TRAINER_LOGPROBS,
    TRL_LACKS,
    _np,
    advantage_estimator,
    recomputes_logprobs,
    records_from_batch,
    trainer_policy,
    update_from_step,
)
from ..api import audit_tables
from ..contract.config import Config
from ..contract.errors import AuditFailed
from ..reading.records import records_to_table
from ..reporting.report import Report
from ..writing import write_table

Policy = Literal["warn", "raise", "skip"]
__all__ = [
    "TRL_LACKS",
    "AuditFailed",
    "AuditSettings",
    "AuditedGRPOTrainer",
    "advantage_estimator",
    "records_from_batch",
    "recomputes_logprobs",
    "trainer_policy",
    "update_from_step",
]


# ---------------------------------------------------------------- the guard


@dataclass
class AuditSettings:
    """What the guard does with findings, and the fields TRL does not record."""

    policy: Policy = "warn"
    log_dir: str | Path | None = None  # write trajectories/ and updates/ with RolloutWriter
    environment_id: str | None = None
    environment_version: str | None = None
    verifier_version: str | None = None
    reset_seed: int | None = None
    # TRL's ε; `truncation`, unless set here, is the policy the trainer's GRPOConfig follows
    config: Config = field(default_factory=lambda: Config(grpo_epsilon=1e-4))
    ignore: tuple[str, ...] = ()
    # the audit figures added to every logged step: "few" (FEW_FIGURES) or "all" (per family, replay gaps)
    metrics: Literal["few", "all"] = "few"


FEW_FIGURES = ("errors", "warnings", "exit_code", "trainable_share", "policy_lag_max")


def _summary(what: str, report: Report) -> str:
    errors = report.findings.filter(report.findings["severity"] == "error")
    first = errors.row(0, named=True) if errors.height else {}
    return f"rollout-audit: {what}: {errors.height} error finding(s) {sorted(set(errors['code']))}" + (
        f"; first: {first['code']} {first['message']}" if first else ""
    )


class AuditedGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` that audits every generation batch and every micro-batch update before
    the optimizer step. `audit=AuditSettings(policy=...)`: `warn` (default), `raise`
    (AuditFailed), or `skip` (the loss mask of trajectories with an error finding is zeroed,
    all of them when a finding names none; a failing update trains with a zero loss).
    The truncation policy is the one the trainer's `GRPOConfig` follows (`trainer_policy`),
    stated once as a warning, unless `audit.config` sets `truncation` itself.
    Reports are kept in `audit_reports` as (label, Report)."""

    def __init__(self, *args: Any, audit: AuditSettings | None = None, **kwargs: Any) -> None:
        self.audit = audit or AuditSettings()
        self.audit_reports: list[tuple[str, Report]] = []
        self._ra_generation = 0
        self._ra_table: pa.Table | None = None
        self._ra_rewards: torch.Tensor | None = None
        self._ra_micro = 0
        super().__init__(*args, **kwargs)
        truncation, why = trainer_policy(self.args)
        if "truncation" in self.audit.config.model_fields_set:
            if self.audit.config.truncation != truncation:
                warnings.warn(
                    f"rollout-audit: configured truncation = {self.audit.config.truncation!r}, but TRL follows {why}",
                    stacklevel=2,
                )
        else:
            self.audit.config = self.audit.config.model_copy(update={"truncation": truncation})
            warnings.warn(f"rollout-audit: auditing under the policy TRL follows: {why}", stacklevel=2)
        recomputed = recomputes_logprobs(self.args, bool(getattr(self, "use_vllm", False)))
        if recomputed and "compare_logprobs" not in self.audit.config.model_fields_set:
            # L207 compares the engine's log-probs with the trainer's recomputation, no replayer needed
            self.audit.config = self.audit.config.model_copy(update={"compare_logprobs": TRAINER_LOGPROBS})
        self._write_policy()

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[override]
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        weighted = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
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
        return records_from_batch(
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
            extras=list(inputs) if self.rollout_func is not None else None,
            excluded=excluded,
            mask_truncated_completions=bool(getattr(self.args, "mask_truncated_completions", False)),
        )

    def _generate_and_score_completions(self, inputs):  # type: ignore[override]
        out = super()._generate_and_score_completions(inputs)
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
        """Apply the policy; under `skip`, the rows to exclude."""
        msg = _summary(what, report)
        if self.audit.policy == "raise":
            raise AuditFailed(msg, report)
        warnings.warn(msg, stacklevel=3)
        if self.audit.policy != "skip":
            return None
        errors = report.findings.filter(report.findings["severity"] == "error")
        ids = table.column("trajectory_id").to_numpy(zero_copy_only=False)
        if errors["trajectory_id"].is_null().any():
            return np.ones(len(ids), bool)
        return np.isin(ids, errors["trajectory_id"].to_list())

    def _skip_rows(self, out: dict, bad: np.ndarray) -> dict:
        """Zero the loss mask (through tool_mask, so attention is unchanged) of the excluded rows."""
        cm = out["completion_mask"]
        tm = out.get("tool_mask")
        keep = torch.as_tensor(~bad, device=cm.device, dtype=cm.dtype).unsqueeze(1)
        out["tool_mask"] = (torch.ones_like(cm) if tm is None else tm) * keep
        out["num_items_in_batch"] = self.accelerator.gather((cm * out["tool_mask"]).sum()).sum()
        return out

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[override]
        rows = inputs.get("_ra_row")
        failed = False
        if rows is not None and bool(getattr(self.model, "training", False)) and self._ra_table is not None:
            failed = self._audit_update(inputs, _np(rows))
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
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
            loss_type=self.loss_type,
            update_step=self.state.global_step,
            trainer_version=self.state.global_step,
            gradient_accumulation_steps=self.current_gradient_accumulation_steps,
            steps_per_generation=args.steps_per_generation,
            num_processes=self.accelerator.num_processes,
            max_completion_length=self.max_completion_length,
            window_trajectory_ids=list(ids) if self.accelerator.num_processes == 1 else None,
            advantage_estimator=advantage_estimator(self),
            max_policy_lag=max(spans - 1, 0),
        )
        label = f"update {self.state.global_step}.{self._ra_micro}"
        self._ra_micro += 1
        table = records_to_table([rec], "updates")
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

    def _write_policy(self) -> None:
        """Next to the log, the settings it was audited with (`[tool.rollout-audit]`, which
        `rollout-audit check LOG_DIR` reads), so that a later audit follows the same policy."""
        if self.audit.log_dir is None or not self.accelerator.is_main_process:
            return
        path = Path(self.audit.log_dir) / "pyproject.toml"
        if path.exists():
            return
        c = self.audit.config
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "# the policy the trainer's GRPOConfig follows, written by AuditedGRPOTrainer\n"
            f'[tool.rollout-audit]\ntruncation = "{c.truncation}"\ngrpo_epsilon = {c.grpo_epsilon!r}\n'
            + (f"compare_logprobs = {json.dumps(c.compare_logprobs)}\n" if c.compare_logprobs else "")
        )

    def _write(self, table: pa.Table, kind: str, name: str) -> None:
        if self.audit.log_dir is None or not self.accelerator.is_main_process:
            return
        # the contract columns through RolloutWriter, then old_per_token_logps as they are (L207 reads them)
        write_table(Path(self.audit.log_dir) / kind / name, table, kind, validate=False)
