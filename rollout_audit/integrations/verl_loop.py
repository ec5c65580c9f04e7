"""verl: the sampler side switched on by configuration. `AuditedAgentLoop` is an agent loop that verl's
own registry builds (`actor_rollout_ref.rollout.agent.agent_loop_config_path` names a YAML list of
`{name, _target_, ...}`, loaded into `_agent_loop_registry` by `AgentLoopWorker.__init__` and built per
sample by `hydra.utils.instantiate` with the server manager, tokenizer, tools: verl 0.9.1
verl/experimental/agent_loop/agent_loop.py:534-539, :683-693). It builds the user's own loop class
(`agent_loop`) with the same arguments but a `RecordingServer` in front of the server manager, runs
it, and writes one record per `AgentLoopOutput` it returns (`integrations.verl.dump`) with every
engine call the loop made: the ids the engine was given, the ids and stop reason it returned, the
weight versions of `TokenOutput.extra_fields`. What the loop returns and what the engine returns are
forwarded unchanged; the records go to `audit_dir`, else `<trainer.rollout_data_dir>/rollout-audit` (beside verl's
own generations file, `{step}.jsonl`, which the adapter joins for the rewards verl computes after the loop).

`CONFIG` is the YAML for verl's two built-in loops (`single_turn_agent`, `tool_agent`): it registers
this wrapper under their names, so the dataset's `agent_name` column reaches the wrapper unchanged."""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..adapters.base import UNRECORDED
from . import verl as hook

CONFIG = Path(__file__).with_name("verl_agent_loops.yaml")
# the records' folder under trainer.rollout_data_dir: verl's own {step}.jsonl text dump stays beside it
SUBDIR = "rollout-audit"
# what the wrapper cannot see from outside the user's loop, by the contract field it leaves out: said
# on the records (`rollout_audit_unrecorded`, the adapters' one word for it) and by `check` in "not run"
_TEMPLATE = "rollout-audit's verl agent loop: the conversation the user's loop renders stays inside that loop"
NOT_RECORDED = {"turns.template_context_length": _TEMPLATE, "turns.template_context_sha256": _TEMPLATE}
# a call the fully-async client resumed across a weight update reaches the wrapper as one call, its
# routes merged: which version routed which row is not seen (the hook's `attempt` runs inside the client)
_RESUMED = (
    "rollout-audit's verl agent loop: an engine call resumed across a weight update "
    "(min_global_steps != max_global_steps) reaches the wrapper as one call, so its routes' versions are not seen"
)
# a loop that returns several outputs: its calls cannot be told apart, so they go on the last output only
_EARLIER = (
    "rollout-audit's verl agent loop: the loop returned several outputs; its engine calls are recorded on the last one"
)
EARLIER = {f"turns.{k}": _EARLIER for k in ("context_length", "context_sha256", "sampled_token_ids")}
# the keyword arguments verl's AgentLoopWorker passes to every loop it builds (agent_loop.py:683-693)
BUILD_ARGS = (
    "trainer_config",
    "server_manager",
    "tokenizer",
    "processor",
    "hf_model_type",
    "dataset_cls",
    "data_config",
    "tools",
)


class RecordingServer:
    """The server manager as the user's loop sees it: `generate` forwards every argument to verl's
    client and returns its `TokenOutput` as it came, after recording the call (`engine_call`: the
    prompt ids sent, the ids, stop reason and weight versions returned) and the request id verl's
    client routes by; any other attribute is the client's own."""

    def __init__(self, server: Any, calls: list[dict[str, Any]]):
        self._server = server
        self._calls = calls

    async def generate(self, request_id: Any, *, prompt_ids: Any, sampling_params: Any, **kwargs: Any) -> Any:
        output = await self._server.generate(
            request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs
        )
        call = hook.engine_call(list(prompt_ids), output)
        call["request_id"] = str(request_id)
        self._calls.append(call)
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def _load(path: str) -> Any:
    """The class named by a dotted path (`package.module.Class`)."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"agent_loop must be a dotted class path, got {path!r}")
    return getattr(importlib.import_module(module), name)


def _setting(config: Any, *keys: str) -> Any:
    """`config.a.b` of verl's DictConfig (or nested dicts); None when a level is missing."""
    for key in keys:
        if config is None:
            return None
        config = config.get(key) if hasattr(config, "get") else getattr(config, key, None)
    return config


class AuditedAgentLoop:
    """A verl agent loop that runs `agent_loop` (a dotted class path: the user's own loop, or verl's
    `ToolAgentLoop` / `SingleTurnAgentLoop`) and records what the engine sampled for it."""

    def __init__(
        self,
        *,
        agent_loop: str,
        audit_dir: str | None = None,
        agent_loop_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        **kwargs: Any,
    ):
        trainer_config = kwargs.get("trainer_config")
        config = getattr(trainer_config, "config", None)
        verl_dir = _setting(config, "trainer", "rollout_data_dir")
        directory = audit_dir or (str(Path(verl_dir) / SUBDIR) if verl_dir else None)
        if not directory:
            raise ValueError(
                "rollout-audit's verl agent loop needs a directory: set trainer.rollout_data_dir "
                "(verl's own dump, read beside the audit records) or audit_dir in the agent loop config"
            )
        self.directory = str(directory)
        self.name = name
        self.calls: list[dict[str, Any]] = []
        if kwargs.get("server_manager") is not None:
            kwargs["server_manager"] = RecordingServer(kwargs["server_manager"], self.calls)
        self.inner = _load(agent_loop)(**kwargs, **dict(agent_loop_kwargs or {}))

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """The user's loop's output, unchanged but for `extra_fields["request_id"]` (the join key
        verl copies into the batch), after its records are written."""
        output = await self.inner.run(sampling_params, **kwargs)
        outputs = output if isinstance(output, list) else [output]
        for index, out in enumerate(outputs):
            hook.dump(self.directory, out, **self.fields(kwargs, index, len(outputs)))
        return output

    def fields(self, kwargs: Mapping[str, Any], index: int, n: int) -> dict[str, Any]:
        """The record's own fields for output `index` of `n`: its id (V1: the TransferQueue key
        `{uid}_{session_id}_{index}` verl files it under, trainer/ppo/v1/agent_loop_tq.py:193; legacy: a new id, which
        reaches the batch through `extra_fields`), the sample's `uid`, the engine calls (all of them on
        the last output, where a multi-output loop's calls cannot be told apart), the builder's boundary
        ids, and what the wrapper cannot record."""
        uid = kwargs.get("uid")
        session = kwargs.get("session_id")
        rid = f"{uid}_{session}_{index}" if uid is not None and session is not None else uuid.uuid4().hex
        out: dict[str, Any] = {
            "request_id": rid,
            "uid": None if uid is None else str(uid),
            "engine_calls": list(self.calls) if index == n - 1 else None,
            "boundary_ids": hook.boundary_ids(getattr(self.inner, "continuous_token_builder", None)),
            UNRECORDED: self.unrecorded(index == n - 1),
            "agent_loop": f"{type(self.inner).__module__}.{type(self.inner).__qualname__}",
        }
        if kwargs.get("global_steps") is not None:
            out["global_steps"] = int(kwargs["global_steps"])
        return out

    def unrecorded(self, last: bool) -> dict[str, str]:
        """{contract field: why} for what this output's record cannot carry (`NOT_RECORDED`; the engine
        calls on every output but the last; the routes' versions of a call resumed across an update)."""
        out = dict(NOT_RECORDED) if last else {**NOT_RECORDED, **EARLIER}
        resumed = any(
            c.get("routed_experts_rows") is not None
            and hook.ROUTE_RUNS not in c
            and None not in (c.get("min_global_steps"), c.get("max_global_steps"))
            and c["min_global_steps"] != c["max_global_steps"]
            for c in self.calls
        )
        if last and resumed:
            out["routed_experts_version"] = _RESUMED
        return out


__all__ = ["BUILD_ARGS", "CONFIG", "NOT_RECORDED", "AuditedAgentLoop", "RecordingServer"]
