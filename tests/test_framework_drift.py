"""A drift alarm: every field an adapter reads from a framework's own classes (its `READS`, kept in
the adapter module) must still exist in the installed framework. Fields are read from the real
classes (pydantic `model_fields`, dataclass fields, TypedDict keys, class annotations); a field that
disappeared fails naming the field and the class. Frameworks that are not installed are skipped."""

from __future__ import annotations

import dataclasses
import importlib
import typing

import pytest


def fields_of(cls: type) -> set[str]:
    """The field names of a framework class: pydantic, dataclass, TypedDict or annotated class."""
    if hasattr(cls, "model_fields"):
        return set(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    if typing.is_typeddict(cls):
        return set(cls.__required_keys__) | set(cls.__optional_keys__)
    return {k for c in cls.__mro__ for k in getattr(c, "__annotations__", {})}


def missing(reads: dict[str, set[str]]) -> list[str]:
    """One line per field of `reads` ({"module.Class": fields}) the installed class lacks (or per class
    that is gone)."""
    out = []
    for path, wanted in sorted(reads.items()):
        module, _, name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            out.append(f"{path}: the class is gone ({type(e).__name__}: {e})")
            continue
        have = fields_of(cls)
        out += [f"{path}.{f}: no such field (has {', '.join(sorted(have))})" for f in sorted(wanted - have)]
    return out


def _reads(*modules: str) -> dict[str, set[str]]:
    """The READS of the first of `modules` that declares one (skip when none does)."""
    for m in modules:
        try:
            reads = getattr(importlib.import_module(m), "READS", None)
        except ImportError:
            continue
        if reads:
            return reads
    pytest.skip(f"none of {', '.join(modules)} declares READS")


def test_verl_fields_the_adapter_reads_exist():
    pytest.importorskip("verl")
    pytest.importorskip("cachetools")  # verl 0.9.1's agent loop imports it without declaring it
    assert missing(_reads("rollout_audit.adapters.verl")) == []


def test_verifiers_fields_the_adapter_reads_exist():
    pytest.importorskip("verifiers.v1")
    assert missing(_reads("rollout_audit.adapters.verifiers_v1")) == []


def test_trl_fields_the_adapter_reads_exist():
    pytest.importorskip("trl")
    assert missing(_reads("rollout_audit.adapters.trl", "rollout_audit.integrations.trl")) == []


def test_a_field_gone_from_a_real_class_is_named():
    """The alarm fires on the installed classes: a field they lack and a class that is gone are named."""
    pytest.importorskip("verl")
    out = missing(
        {
            "verl.workers.rollout.replica.TokenOutput": {"token_ids", "finish_reason"},
            "verl.workers.rollout.replica.NoSuchOutput": {"token_ids"},
        }
    )
    assert len(out) == 2
    assert out[0].startswith("verl.workers.rollout.replica.NoSuchOutput: the class is gone")
    assert out[1].startswith("verl.workers.rollout.replica.TokenOutput.finish_reason: no such field (has ")
    assert "stop_reason" in out[1]


def test_fields_of_reads_dataclasses_and_typeddicts():
    @dataclasses.dataclass
    class Sample:
        tokens: list
        reward: float = 0.0

    class Output(typing.TypedDict, total=False):
        response_ids: list
        stop_reasons: list

    assert fields_of(Sample) == {"tokens", "reward"}
    assert fields_of(Output) == {"response_ids", "stop_reasons"}


def test_trl_fields_the_converter_reads_exist():
    pytest.importorskip("trl")
    assert missing(_reads("rollout_audit.adapters.trl")) == []


def test_verl_trainer_side_fields_exist():
    """What the trainer-side hook reads of verl: DataProto's fields and the `config.algorithm` settings
    (AlgoConfig), the batch keys verl's own trainer writes before the actor update, and the estimator
    names the adapter maps."""
    pytest.importorskip("verl")
    pytest.importorskip("cachetools")
    import inspect

    from rollout_audit.adapters import verl as adapter

    assert missing(adapter.READS_BATCH) == []
    from verl.experimental.agent_loop import agent_loop
    from verl.trainer.ppo import core_algos, ray_trainer

    written = inspect.getsource(ray_trainer) + inspect.getsource(agent_loop)
    keys = [*adapter.BATCH_TENSORS, "prompts", "attention_mask"]
    assert [k for k in keys if f'"{k}"' not in written] == []
    names = {e.value for e in core_algos.AdvantageEstimator}
    assert sorted(adapter.GROUPED - names) == []


def test_trl_batch_keys_the_converter_reads_are_what_grpo_trainer_returns():
    """The keys `records_from_batch` / `update_from_step` read from the dict
    `GRPOTrainer._generate_and_score_completions` returns, and the trainer attributes the guard and
    `recomputes_logprobs` read, are still set by the installed TRL (its own source, not a copy)."""
    pytest.importorskip("trl")
    import inspect

    from trl import GRPOTrainer

    from rollout_audit.adapters.trl import TRAINER_LOGPROBS

    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch",
            "sampling_per_token_logps", TRAINER_LOGPROBS, "tool_mask")  # fmt: skip
    gone = [k for k in keys if f'"{k}"' not in source]
    assert gone == [], f"GRPOTrainer._generate_and_score_completions no longer returns {gone}"
    init = inspect.getsource(GRPOTrainer.__init__)
    attrs = ("use_vllm", "vllm_importance_sampling_correction", "temperature", "top_p", "num_generations")
    assert [a for a in attrs if f"self.{a} =" not in init] == []


def test_trl_rloo_batch_keys_and_attributes_the_guard_reads_are_rloo_trainers():
    """What `AuditedRLOOTrainer` reads of `RLOOTrainer`: the keys of the dict its
    `_generate_and_score_completions` returns, the methods the guard overrides (same signatures as
    GRPO's), and the attributes `__init__` copies from RLOOConfig that the record and the estimator read."""
    pytest.importorskip("trl")
    import inspect

    from trl import RLOOTrainer

    source = inspect.getsource(RLOOTrainer._generate_and_score_completions)
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
    assert [k for k in keys if f'"{k}"' not in source] == []
    for name in ("_generate_and_score_completions", "compute_loss", "_calculate_rewards"):
        assert inspect.signature(getattr(RLOOTrainer, name)) == inspect.signature(
            getattr(importlib.import_module("trl").GRPOTrainer, name)
        ), name
    init = inspect.getsource(RLOOTrainer.__init__)
    attrs = ("normalize_advantages", "beta", "reward_clip_range", "num_generations", "temperature", "top_p",
             "max_completion_length", "num_iterations", "mask_truncated_completions", "eos_token_ids")  # fmt: skip
    assert [a for a in attrs if f"self.{a} =" not in init] == []


def test_verifiers_message_roles_the_adapter_maps_exist():
    """`MessageNode.message.role` of every message class verifiers builds a trace from is a role the v1
    adapter gives a provenance (ROLE_SOURCE); a new role fails naming it."""
    pytest.importorskip("verifiers.v1")
    from verifiers.v1 import types

    from rollout_audit.adapters.verifiers_v1 import ROLE_SOURCE

    classes = ("SystemMessage", "UserMessage", "AssistantMessage", "ToolMessage")
    roles = {c: getattr(types, c).model_fields["role"].default for c in classes}
    assert {c: r for c, r in roles.items() if r not in ROLE_SOURCE} == {}


def test_rllm_names_the_workflow_trainer_record_overrides_exist():
    """Each rLLM method `integrations.rllm.AuditedWorkflowTrainer` / `audited_task_runner` overrides or calls,
    with the parameters it passes (rLLM is not on the package index: this runs where it is installed)."""
    import inspect

    pytest.importorskip("rllm")
    from rollout_audit.integrations.rllm import WORKFLOW_NAMES

    gone = []
    for path, methods in WORKFLOW_NAMES.items():
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        for method, params in methods.items():
            have = inspect.signature(getattr(cls, method)).parameters if hasattr(cls, method) else None
            if have is None or any(p not in have for p in params):
                gone.append(f"{path}.{method}({', '.join(params)})")
    assert gone == []


def test_verl_functions_the_rllm_task_runner_calls_exist():
    """`audited_task_runner`'s `run` calls the verl functions rLLM's TaskRunner.run calls, with its keywords."""
    import inspect

    pytest.importorskip("verl")
    pytest.importorskip("cachetools")
    calls = {
        "verl.trainer.ppo.reward.load_reward_manager": ("config", "tokenizer"),
        "verl.trainer.ppo.utils.need_critic": ("config",),
        "verl.trainer.ppo.utils.need_reference_policy": ("config",),
        "verl.utils.hf_tokenizer": ("trust_remote_code",),
        "verl.utils.hf_processor": ("trust_remote_code", "use_fast"),
        "verl.utils.config.validate_config": ("config", "use_reference_policy", "use_critic"),
        "verl.utils.fs.copy_to_local": ("use_shm",),
    }
    gone = []
    for path, params in calls.items():
        module, _, name = path.rpartition(".")
        fn = getattr(importlib.import_module(module), name, None)
        have = inspect.signature(fn).parameters if fn is not None else {}
        if fn is None or not (any(p.kind == p.VAR_KEYWORD for p in have.values()) or all(p in have for p in params)):
            gone.append(path)
    assert gone == []
