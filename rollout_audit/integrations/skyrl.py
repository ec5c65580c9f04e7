"""SkyRL without a source edit: an experiment class over SkyRL's own `BasePPOExp` (or the one your
entry point uses) that records both halves of the run into a rollout-audit dump directory, for
`rollout-audit check --from skyrl DIR`.

    python -m rollout_audit.integrations.skyrl --audit-dir rollout_dumps [--experiment MODULE:CLASS] \\
        <SkyRL's own key=value overrides>

Read at the `skyrl` 0.4.0 wheel (PyPI; it needs Python >= 3.12, so this module imports SkyRL only
inside `main` and `audited_experiment`; its tests run the wrappers against stand-ins built from
these shapes). What each override does (file:line in that wheel):

- `get_generator` (`skyrl/train/entrypoints/main_base.py:132-153`): the generator SkyRL (or your
  experiment) builds is handed a `RecordingClient` in place of the inference client, and is returned
  wrapped in a `RecordingGenerator`. The client wrapper keeps, per `session_ids` entry of every
  `generate` call (`InferenceEngineInput`, `inference_servers/base.py:25-37`; the agent loop's session
  is `{instance_id}_{repetition_id}`, `generators/skyrl_gym_generator.py:383-385`, passed at :479-488),
  the prompt ids it was given and the `response_ids` (and `response_logprobs`) it returned, copied
  before the agent loop appends an EOS to that list (:531-545), with the client's `weight_version` at
  dispatch (`remote_inference_client.py:452-462`), and at return when a weight sync moved it. The generator wrapper writes one record per row of each
  training `GeneratorOutput` (`generators/base.py:40-69`) with those calls joined by session id.
  `get_inference_client` is not overridden: the trainer pickles that client to its policy workers
  (`backends/skyrl_train/workers/worker_dispatch.py:637-646`) and checks `isinstance(...,
  RemoteInferenceClient)` there (`workers/fsdp/fsdp_worker.py:189`), so only the generator sees the
  wrapper, and the trainer keeps SkyRL's own client.
- `get_trainer` (`main_base.py:155-180`): the trainer your experiment returns (`RayPPOTrainer`, or the
  fully-async example's `FullyAsyncRayPPOTrainer`) is given a subclass of its own class whose
  `convert_to_training_input` (`trainer.py:865-1008`) notes which generator rows the batch holds
  and whose `compute_advantages_and_returns` (`trainer.py:1151`, called at :425 and
  `fully_async_trainer.py:871`) writes one trainer record per row after it returns.

The fully-async trainer calls `generator.generate` itself, one group at a time
(`fully_async_trainer.py:888-945`), with `global_step_at_start` read just before the call (:920):
the wrapper reads the trainer's `global_step` at the same point and records it as the group's
`global_step_when_scheduled`. Step-wise training (`generator.step_wise_trajectories`) writes one row
per turn (`skyrl_gym_generator.py:1041-1066`), one engine call each: row k of an episode gets its
k-th call. Every wrapper returns what it was given, unchanged (the same objects).

What it cannot record is written on the records (`rollout_audit_unrecorded`) and named by `check`
in "not run": engine calls when the generator sends no session ids (`generator.batched=true`,
`skyrl_gym_generator.py:898-904`) or a step-wise episode's calls do not pair with its rows;
routed experts and sample supports (0.4.0 keeps them as `RoutedExpertIndices` / `SampleSupport`
objects, base.py:57-58: not dumped). A training batch holding a row the generator did not return
once, as it is (step-wise merging, `trainer.py:1090`; dynamic sampling's `replace` repeats rows,
`utils/trainer_utils.py:433-500`) gets no trainer record at all (a warning says so), since part of
a batch would misstate its group statistics.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import socket
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..adapters.base import UNRECORDED

# the skyrl releases these wrappers were read against
TESTED = ("0.4.0",)
# GeneratorOutput lists the sampler record carries, under SkyRL's names (what adapters/skyrl.py reads)
SAMPLE_KEYS = (
    "prompt_token_ids",
    "response_ids",
    "rewards",
    "loss_masks",
    "stop_reasons",
    "rollout_logprobs",
    "is_last_step",
)
# TrainingInputBatch tensors the trainer record carries, cut to the row's response
BATCH_KEYS = ("advantages", "response_mask", "loss_mask")
# what SkyRL names and calls, for the drift test: module -> class -> names this module relies on
RELIES = {
    "skyrl/train/entrypoints/main_base.py": {"BasePPOExp": {"get_generator", "get_trainer", "run"}},
    "skyrl/train/trainer.py": {"RayPPOTrainer": {"convert_to_training_input", "compute_advantages_and_returns"}},
    "skyrl/train/generators/base.py": {
        "GeneratorOutput": set(SAMPLE_KEYS) | {"trajectory_ids"},
        "GeneratorInput": {"trajectory_ids", "batch_metadata"},
        "BatchMetadata": {"global_step", "training_phase"},
        "TrajectoryID": {"instance_id", "repetition_id"},
    },
    "skyrl/backends/skyrl_train/inference_servers/base.py": {
        "InferenceEngineInput": {"prompt_token_ids", "session_ids"},
        "InferenceEngineOutput": {"response_ids", "stop_reasons"},
    },
}
_NO_ROUTES = (
    "the SkyRL integration does not dump routed experts (skyrl 0.4.0 keeps them as RoutedExpertIndices objects, "
    "generators/base.py:57-58)"
)
NOT_DUMPED = {
    "routed_experts_sha256": _NO_ROUTES,
    "routed_experts_version": _NO_ROUTES,
}
_KEEP_STEPS = 64  # rows not trained within this many trainer steps of their generation are forgotten


def _plain(value: Any) -> Any:
    """A value as JSON: tensors and arrays as lists, dataclasses (TrajectoryID) as objects."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


class Dump:
    """Appends JSON Lines records to one file per process under `directory` (the generator and the
    trainer run in SkyRL's entrypoint task; several runs may share the directory)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self.directory / f"skyrl-audit-{socket.gethostname()}-{os.getpid()}.jsonl"

    def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        if not records:
            return
        text = "".join(json.dumps(r, default=_plain) + "\n" for r in records)
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(text)

    def __getstate__(self) -> dict[str, Any]:  # a lock does not pickle; Ray may ship the generator
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.directory, self._lock = state["directory"], threading.Lock()


class RecordingClient:
    """The inference client as the generator sees it: every attribute is the wrapped client's, and
    `generate` also keeps each request's engine call by session id (`calls`)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: dict[str, list[dict[str, Any]]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate(self, input_batch: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        sessions = input_batch.get("session_ids") or []
        prompts = [list(p) for p in input_batch.get("prompt_token_ids") or ()] if sessions else []
        version = getattr(self._inner, "weight_version", None)
        output = await self._inner.generate(input_batch, *args, **kwargs)
        if not prompts:
            return output
        after = getattr(self._inner, "weight_version", None)
        n = len(prompts)
        stops = output.get("stop_reasons") or [None] * n
        logprobs = output.get("response_logprobs") or [None] * n
        for session, prompt, ids, stop, lp in zip(sessions, prompts, output["response_ids"], stops, logprobs):
            # copied now: the agent loop appends an EOS to this very list (skyrl_gym_generator.py:531-545)
            call: dict[str, Any] = {"prompt_token_ids": prompt, "response_ids": list(ids), "stop_reason": stop}
            if lp is not None:
                call["response_logprobs"] = list(lp)
            if isinstance(version, int):
                call["weight_version"] = version
                if isinstance(after, int) and after != version:  # the weights moved while it ran
                    call["weight_version_at_return"] = after
            self.calls.setdefault(str(session), []).append(call)
        return output


class RecordingGenerator:
    """The generator the trainer sees: `generate` is the wrapped generator's (its signature too: the
    fully-async trainer inspects it for `disable_tqdm`, fully_async_trainer.py:923), and also writes
    one sampler record per row of each training batch. Every other attribute is the wrapped one's."""

    def __init__(self, inner: Any, client: RecordingClient, dump: Dump) -> None:
        self._inner, self._client, self._dump = inner, client, dump
        self.trainer: Any = None  # set by the experiment once the trainer exists
        self.rows: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(response list) -> (list, identity)

        async def generate(input_batch: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
            return await self._generate(input_batch, *args, **kwargs)

        self.generate = functools.update_wrapper(generate, inner.generate)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _step(self, input_batch: Mapping[str, Any]) -> dict[str, int] | None:
        """The step that names the rows: the fully-async trainer's step when it scheduled the group,
        else the batch's `BatchMetadata.global_step`; None for an evaluation batch."""
        meta = input_batch.get("batch_metadata")
        if meta is not None and getattr(meta, "training_phase", "train") != "train":
            return None
        if self.trainer is not None and is_fully_async(self.trainer):
            return {"global_step_when_scheduled": int(self.trainer.global_step)}
        step = getattr(meta, "global_step", None)
        return {} if step is None else {"global_step": int(step)}

    async def _generate(self, input_batch: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        step = self._step(input_batch)
        output = await self._inner.generate(input_batch, *args, **kwargs)
        tids = output.get("trajectory_ids") or input_batch.get("trajectory_ids")
        sessions = [f"{t.instance_id}_{t.repetition_id}" for t in tids or ()]
        calls = {s: self._client.calls.pop(s, None) for s in dict.fromkeys(sessions)}
        if step is None:
            return output  # evaluation: not trained, not dumped
        if tids is None or len(tids) != len(output["response_ids"]):
            warnings.warn(
                "rollout-audit: a SkyRL generator batch without one trajectory id per row was not recorded",
                stacklevel=2,
            )
            return output
        self._dump.write(self.records(output, tids, sessions, calls, step))
        self._forget()
        return output

    def records(
        self,
        output: Mapping[str, Any],
        tids: Sequence[Any],
        sessions: Sequence[str],
        calls: Mapping[str, list[dict[str, Any]] | None],
        step: dict[str, int],
    ) -> list[dict[str, Any]]:
        """One sampler record per row: the row's element of each GeneratorOutput list, its
        trajectory id and step, and its engine calls (step-wise: the row's own call)."""
        counts: dict[str, int] = {}
        for s in sessions:
            counts[s] = counts.get(s, 0) + 1
        seen: dict[str, int] = {}
        out = []
        for i, (tid, session) in enumerate(zip(tids, sessions)):
            rec: dict[str, Any] = {k: _plain(output[k][i]) for k in SAMPLE_KEYS if output.get(k) is not None}
            rec["trajectory_ids"] = _plain(tid)
            rec.update(step)
            k = seen.get(session, 0)
            seen[session] = k + 1
            mine, missing = _calls_of_row(calls.get(session), counts[session], k)
            if mine is not None:
                rec["engine_calls"] = mine
            unrecorded = dict(NOT_DUMPED)
            if missing:
                unrecorded["token_source"] = missing
            rec[UNRECORDED] = unrecorded
            out.append(rec)
            response = output["response_ids"][i]
            self.rows[id(response)] = (response, {"trajectory_ids": rec["trajectory_ids"], **step})
        return out

    def _forget(self) -> None:
        """Drop the identities of rows never trained (dropped groups, filtered samples)."""
        if self.trainer is None or len(self.rows) < 4096:
            return
        now = int(getattr(self.trainer, "global_step", 0))
        for key, (_, ident) in list(self.rows.items()):
            at = ident.get("global_step", ident.get("global_step_when_scheduled", now))
            if now - at > _KEEP_STEPS:
                del self.rows[key]

    def identity(self, response: Any) -> dict[str, Any] | None:
        """The sampler record's identity of the row whose response list this is (None when the batch
        holds a list the generator did not return: merged step-wise rows)."""
        entry = self.rows.pop(id(response), None)
        return None if entry is None or entry[0] is not response else entry[1]


def _calls_of_row(calls: list[dict[str, Any]] | None, rows: int, k: int) -> tuple[list | None, str | None]:
    """(the engine calls of row k of a session with `rows` rows, or why there are none)."""
    if not calls:
        return None, (
            "the SkyRL integration saw no engine call for this row's session (generator.batched=true sends no "
            "session ids, skyrl_gym_generator.py:898-904, or a custom generator bypassed the inference client)"
        )
    if rows == 1:
        return calls, None
    if len(calls) != rows:
        return (
            None,
            f"a step-wise episode of {rows} rows made {len(calls)} engine calls: they do not pair with its rows",
        )
    return [calls[k]], None


def is_fully_async(trainer: Any) -> bool:
    """Whether the trainer is SkyRL's fully-async one (by class name: no SkyRL import here)."""
    return any(c.__name__ == "FullyAsyncRayPPOTrainer" for c in type(trainer).__mro__)


@functools.cache
def audited_trainer_class(base: Any) -> type:
    """A subclass of the trainer's own class that writes the trainer-side record: after
    `compute_advantages_and_returns`, one record per row with its per-token `advantages`,
    `response_mask` and `loss_mask` over its response (response tensors are right-aligned, the row's
    response the last `len(response_ids)` positions: `dataset/preprocess.py:269-300`), its identity
    as the sampler record names it, `is_last_step`, and the algorithm's estimator."""

    class Audited(base):  # type: ignore[valid-type, misc]
        rollout_audit_generator: RecordingGenerator | None = None
        rollout_audit_dump: Dump | None = None
        _rollout_audit_rows: list[tuple[dict[str, Any] | None, int]] | None = None

        def convert_to_training_input(self, generator_output: Any, uids: Any) -> Any:
            batch = super().convert_to_training_input(generator_output, uids)
            gen = self.rollout_audit_generator
            self._rollout_audit_rows = [
                (None if gen is None else gen.identity(r), len(r)) for r in generator_output["response_ids"]
            ]
            return batch

        def compute_advantages_and_returns(self, data: Any) -> Any:
            data = super().compute_advantages_and_returns(data)
            rows, self._rollout_audit_rows = self._rollout_audit_rows, None
            if self.rollout_audit_dump is None or rows is None:
                return data
            if any(ident is None for ident, _ in rows):
                # part of a batch would misstate its group statistics: none of it is written
                warnings.warn(
                    "rollout-audit: SkyRL trained rows the generator did not return once each (merged step-wise "
                    f"rows, or rows repeated by dynamic sampling's replace); step {self.global_step} has no trainer record",
                    stacklevel=2,
                )
                return data
            self.rollout_audit_dump.write(trainer_records(self, data, rows))
            return data

    Audited.__name__ = Audited.__qualname__ = f"Audited{base.__name__}"
    return Audited


def trainer_records(trainer: Any, data: Any, rows: Sequence[tuple[dict | None, int]]) -> list[dict[str, Any]]:
    """The trainer record of each row (by its sampler record's identity)."""
    alg = trainer.cfg.trainer.algorithm
    last = (getattr(data, "metadata", None) or {}).get("is_last_step")
    out = []
    for i, (ident, n) in enumerate(rows):
        if ident is None:
            continue
        rec: dict[str, Any] = {
            "global_step": int(trainer.global_step),
            "trajectory_ids": ident["trajectory_ids"],
            "is_last_step": None if last is None else bool(last[i]),
            "advantage_estimator": str(alg.advantage_estimator),
            "grpo_norm_by_std": bool(alg.grpo_norm_by_std),
        }
        if "global_step_when_scheduled" in ident:
            rec["global_step_when_scheduled"] = ident["global_step_when_scheduled"]
        for key in BATCH_KEYS:
            row = data[key][i]
            rec[key] = _plain(row[len(row) - n :] if n else row[:0])
        out.append(rec)
    return out


def audited_experiment(base: type, audit_dir: str | os.PathLike[str]) -> type:
    """A subclass of the experiment class `base` (SkyRL's `BasePPOExp` or one derived from it) whose
    generator and trainer record into `audit_dir`; everything else is `base`'s."""
    dump = Dump(audit_dir)

    class AuditedExp(base):  # type: ignore[valid-type, misc]
        def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> Any:
            client = RecordingClient(inference_engine_client)
            self.rollout_audit_generator = RecordingGenerator(
                super().get_generator(cfg, tokenizer, client), client, dump
            )
            return self.rollout_audit_generator

        def get_trainer(self, *args: Any, **kwargs: Any) -> Any:
            trainer = super().get_trainer(*args, **kwargs)
            base_cls: Any = type(trainer)
            trainer.__class__ = audited_trainer_class(base_cls)
            trainer.rollout_audit_dump = dump
            gen = getattr(self, "rollout_audit_generator", None)
            trainer.rollout_audit_generator = gen
            if gen is not None:
                gen.trainer = trainer
            return trainer

    AuditedExp.__name__ = AuditedExp.__qualname__ = f"Audited{base.__name__}"
    return AuditedExp


def version_warning(version: str | None) -> str | None:
    """One line when the installed skyrl is not a release these wrappers were read against."""
    if version in TESTED:
        return None
    return (
        f"rollout-audit: skyrl {version or '(not installed)'} is outside the tested range ({', '.join(TESTED)}); "
        "the SkyRL integration may miss fields: check the dump's not-run list"
    )


def _load(path: str) -> type:
    module, _, name = path.partition(":")
    if not module or not name:
        raise SystemExit(f"rollout-audit: --experiment takes MODULE:CLASS, got {path!r}")
    return getattr(importlib.import_module(module), name)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(this module's options, SkyRL's own key=value overrides)."""
    parser = argparse.ArgumentParser(
        prog="python -m rollout_audit.integrations.skyrl",
        description="SkyRL training with rollout-audit's recorders; other arguments are SkyRL's overrides",
    )
    parser.add_argument("--audit-dir", required=True, help="the dump directory for rollout-audit check --from skyrl")
    parser.add_argument(
        "--experiment",
        default="skyrl.train.entrypoints.main_base:BasePPOExp",
        help="MODULE:CLASS of your experiment (a BasePPOExp subclass), e.g. the fully-async example's",
    )
    return parser.parse_known_args(list(argv))


def _run(cfg: Any, audit_dir: str, experiment: str) -> None:
    audited_experiment(_load(experiment), audit_dir)(cfg).run()


def main(argv: Sequence[str] | None = None) -> None:
    """SkyRL's `main_base.main` (main_base.py:345-366) with the audited experiment."""
    opts, overrides = parse(sys.argv[1:] if argv is None else argv)
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed: str | None = version("skyrl")
    except PackageNotFoundError:
        installed = None
    if installed is None:
        raise SystemExit("rollout-audit: skyrl is not installed here (skyrl 0.4.0 needs Python >= 3.12)")
    if (line := version_warning(installed)) is not None:
        print(line, file=sys.stderr)
    import ray
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.utils import initialize_ray, validate_cfg

    cfg = SkyRLTrainConfig.from_cli_overrides(overrides)
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(ray.remote(num_cpus=1)(_run).remote(cfg, opts.audit_dir, opts.experiment))


if __name__ == "__main__":
    main()
