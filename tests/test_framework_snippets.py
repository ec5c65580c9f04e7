"""The verl, SkyRL and slime pages cannot drift from the integrations they document.

1. Every key an adapter asks a dump record for is one its integration writes (or one the integration
   says, on its records, it cannot write), per writer: the adapter runs over every bundled fixture
   of its framework with records that log each `get` / `[]` (nested objects too, `args.kl_coef`),
   and the keys asked for are compared with the keys of the records the integration's own record
   functions build. A key list that loses a field the adapter reads (as the slime dump's once lost
   the two nucleus keys L210 needs) fails here, naming the key and the writer.
2. Every `rollout_audit` name a page's code blocks use (a dotted path, `from rollout_audit... import
   ...`, `python -m rollout_audit...`) resolves to a real module or attribute.

The key lists the pages' fallback pastes write are generated from the same constants
(`rollout_audit.dev.pages`, checked current by tests/test_generated.py)."""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from adapterhelp import CONTEXT

from rollout_audit.adapters.base import UNRECORDED, Record, read_dump

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "frameworks"
PAGES = ("verl", "skyrl", "slime")
# the routes, DAPO and nucleus context the fixtures of those features are audited with
EXTRA_CONTEXT = {
    "verl": {"response_length": 64, "max_resp_len": 64, "overlong_buffer_len": 16, "overlong_penalty_factor": 1.0},
    "skyrl": {"max_generate_length": 64, "overlong_buffer_len": 32, "overlong_buffer_penalty_factor": 1.0},
    "slime": {},
}


class Reads(Record):
    """A dump record that logs every key asked for by `get` or `[]` (as `prefix + key`), and wraps the
    objects it hands out so that their keys are logged too (`args.kl_coef`)."""

    def __init__(self, rec: dict, log: set[str], prefix: str = ""):
        super().__init__(rec)
        self.origin = getattr(rec, "origin", None)
        self._log, self._prefix = log, prefix

    def _wrap(self, key: Any, value: Any) -> Any:
        self._log.add(f"{self._prefix}{key}")
        return Reads(value, self._log, f"{self._prefix}{key}.") if type(value) is dict else value

    def __getitem__(self, key: Any) -> Any:
        return self._wrap(key, super().__getitem__(key))

    def get(self, key: Any, default: Any = None) -> Any:
        return self._wrap(key, super().get(key, default))


def asked(name: str, kind) -> dict[str, set[str]]:
    """{writer: keys the adapter asked its records for} over every fixture of `name`; `kind(rec)` names
    the writer of a record (None: a record no integration writes, such as verl's own generations)."""
    adapter = importlib.import_module(f"rollout_audit.adapters.{name}")
    out: dict[str, set[str]] = {}
    for fx in sorted((FIXTURES / name).glob("*.jsonl")):
        recs = read_dump(fx)
        logs = [set() for _ in recs]
        tracked = [Reads(r, s) for r, s in zip(recs, logs)]
        ctx = {**CONTEXT, **EXTRA_CONTEXT[name]}
        adapter.to_contract(tracked, **ctx)
        adapter.updates(tracked, **ctx)
        for r, s in zip(recs, logs):
            writer = kind(r)
            if writer is not None:
                out.setdefault(writer, set()).update(s)
    return out


def keys(rec: dict, prefix: str = "") -> set[str]:
    """A record's keys, and its objects' keys as `key.sub`."""
    out = set()
    for k, v in rec.items():
        out.add(prefix + k)
        if isinstance(v, dict):
            out |= keys(v, f"{prefix}{k}.")
    return out


def missing(read: set[str], written: Iterable[str], declared: dict[str, str]) -> set[str]:
    """The keys read that the writer neither writes nor declares (by key, or under an object it writes
    whole: `metadata.x` when `metadata` is the framework's own object)."""
    written = set(written)
    return {k for k in read if k not in written and k not in declared and not _under_opaque(k, written)}


def _under_opaque(key: str, written: set[str]) -> bool:
    head = key.split(".", 1)[0]
    return "." in key and head in OPAQUE and head in written


# objects the integration copies whole from the framework (their keys are the framework's own)
OPAQUE = {"metadata", "extra_fields"}


# ---------------------------------------------------------------- slime


def slime_written() -> dict[str, set[str]]:
    from rollout_audit.integrations import slime as integ

    sample = integ.sample_record(SimpleNamespace(to_dict=lambda: {}))
    args = SimpleNamespace()
    train = integ.train_record(args, {k: [] for k in integ.TRAIN_KEYS}, 0)
    actor = integ.actor_record(args, 0, {k: [] for k in (*integ.ACTOR_KEYS, integ.CRITIC_KEY)})
    return {"sample": keys(sample) | {"metadata.engine_calls"}, "train": keys(train), "actor": keys(actor)}


def slime_kind(rec: dict) -> str:
    from rollout_audit.adapters import slime as adapter

    if all(k in rec for k in adapter.TRAIN_DATA):
        return "train"
    return "actor" if all(k in rec for k in adapter.ACTOR) else "sample"


# ---------------------------------------------------------------- SkyRL


@dataclasses.dataclass
class TrajectoryID:  # SkyRL's (skyrl/train/generators/base.py, TrajectoryID): a dataclass
    instance_id: str
    repetition_id: int


def skyrl_written() -> dict[str, set[str]]:
    from rollout_audit.integrations import skyrl as integ

    async def generate(batch: Any) -> Any:
        return batch

    gen = integ.RecordingGenerator(SimpleNamespace(generate=generate), SimpleNamespace(calls={}), None)
    tid = TrajectoryID("0", 0)
    call = {"prompt_token_ids": [1], "response_ids": [2]}
    out = {k: [[1]] for k in integ.SAMPLE_KEYS} | {"response_ids": [[2]]}
    sample = gen.records(out, [tid], ["0_0"], {"0_0": [call]}, {"global_step": 1})[0]
    cfg = SimpleNamespace(
        trainer=SimpleNamespace(algorithm=SimpleNamespace(advantage_estimator="grpo", grpo_norm_by_std=True))
    )
    trainer = SimpleNamespace(cfg=cfg, global_step=1)
    data = {k: [[0.0]] for k in integ.BATCH_KEYS}
    ident = {"trajectory_ids": {"instance_id": "0", "repetition_id": 0}, "global_step_when_scheduled": 0}
    batch = integ.trainer_records(trainer, data, [(ident, 1)])[0]
    return {"sample": keys(sample), "trainer": keys(batch)}


def skyrl_kind(rec: dict) -> str:
    from rollout_audit.adapters import skyrl as adapter

    return "trainer" if adapter.TRAINER in rec else "sample"


# ---------------------------------------------------------------- verl


class Tensor(np.ndarray):
    """The part of torch.Tensor's interface batch_records uses (`bool`; the rest is numpy's)."""

    @classmethod
    def of(cls, a: np.ndarray) -> Tensor:
        return a.view(cls)

    def bool(self) -> Tensor:
        return self.astype(bool).view(Tensor)


def verl_written() -> dict[str, set[str]]:
    import numpy as np

    from rollout_audit.adapters.verl import ALGORITHM, BATCH_TENSORS
    from rollout_audit.integrations import verl as hook
    from rollout_audit.integrations import verl_v1
    from rollout_audit.integrations.verl_loop import AuditedAgentLoop

    output = SimpleNamespace(
        **{k: [1] for k in hook.FIELDS},
        extra_fields={k: 1 for k in hook.EXTRA} | {"reward_extra_info": {"overlong_reward": 0.0}},
        routed_experts=[[[0]], [[0]]],
    )
    loop = object.__new__(AuditedAgentLoop)
    loop.calls, loop.inner = [hook.engine_call([1], SimpleNamespace(token_ids=[2], extra_fields={}))], None
    sample = hook.record(output, **loop.fields({"uid": "u", "session_id": 0, "global_steps": 1}, 0, 1))
    # DataProto's two fields batch_records reads (READS_BATCH), numpy for torch: tests/test_adapters_verl.py
    # runs it on verl's own DataProto; importing torch and verl here would cost this file most of its time
    tensors = {k: Tensor.of(np.zeros((1, 2))) for k in BATCH_TENSORS} | {
        "prompts": Tensor.of(np.zeros((1, 1))),
        "attention_mask": Tensor.of(np.ones((1, 3))),
        "routed_experts": Tensor.of(np.zeros((1, 3, 1, 1), dtype=np.int32)),
    }
    extra = {"request_id": ["r"], "uid": ["u"], "overlong_reward": [0.0], "routed_experts_rows": [2]}
    batch = SimpleNamespace(batch=tensors, non_tensor_batch={k: np.array(v, dtype=object) for k, v in extra.items()})
    algorithm = {k: None for k in ALGORITHM}
    legacy = hook.batch_records(batch, 1, algorithm)[0]
    v1 = verl_v1.v1_records(["u_0_0"], {k: [[0.0]] for k in verl_v1.FIELDS}, 1, algorithm)[0]
    return {"sampler": keys(sample), "trainer (legacy dump_batch)": keys(legacy), "trainer (V1)": keys(v1)}


def verl_kind(rec: dict) -> str | None:
    from rollout_audit.adapters import verl as adapter

    kind = adapter._kind(rec)
    if kind == "generations":
        return None  # verl's own {step}.jsonl, not the integration's
    return kind


def _verl_split(read: dict[str, set[str]]) -> dict[str, set[str]]:
    """The trainer reads, checked against both trainer writers (the adapter reads them by one code path)."""
    trainer = read.pop("trainer", set())
    return {**read, "trainer (legacy dump_batch)": trainer, "trainer (V1)": trainer}


# Keys an adapter reads that its integration does not write, each with the reason the page gives
# (and the dump says, in `rollout_audit_unrecorded`, or the adapter's own not-run reason names).
NOT_WRITTEN = {
    ("skyrl", "sample"): {
        "rollout_expert_indices": "routes: 0.4.0 keeps them as RoutedExpertIndices objects, not dumped (NOT_DUMPED)",
        "overlong_penalty": "the DAPO example changes rewards inside postprocess_generator_output: still a paste",
        "global_step_when_scheduled": "written on fully-async rows only (the trainer's step when scheduled)",
    },
    ("verl", "trainer (legacy dump_batch)"): {
        k: "the V1 trainer's own fields: the legacy trainer makes one update per global step"
        for k in ("local_trigger_step", "parameter_sync_step", "trainer_mode")
    },
    ("verl", "trainer (V1)"): {
        "values": "the V1 record reads no critic values back from TransferQueue (R416 not run on V1)",
        "overlong_reward": "DAPO's penalty is in reward_extra_info in TransferQueue (NOT_RECORDED: overlong_penalty)",
        "routed_experts_sha256": "the routes' digest is the wrapper's (the V1 record does not read routed_experts)",
    },
}


CASES = {
    "slime": (slime_written, slime_kind, lambda r: r),
    "skyrl": (skyrl_written, skyrl_kind, lambda r: r),
    "verl": (verl_written, verl_kind, _verl_split),
}


@pytest.mark.parametrize("name", PAGES)
def test_every_key_the_adapter_reads_is_written_by_the_integration(name: str) -> None:
    written_by, kind, split = CASES[name]
    written = written_by()
    read = split(asked(name, kind))
    assert set(read) <= set(written), f"{name}: records of no integration writer: {set(read) - set(written)}"
    for writer, keys_read in sorted(read.items()):
        declared = {**NOT_WRITTEN.get((name, writer), {}), UNRECORDED: "the integration's own declaration"}
        lost = missing(keys_read, written[writer], declared)
        assert not lost, (
            f"{name}: the adapter reads {sorted(lost)} from the {writer} records, which the integration "
            f"({name}) never writes and does not declare"
        )
    for (n, writer), why in NOT_WRITTEN.items():  # an exception that no longer applies is dropped
        if n == name:
            stale = {k for k in why if k in written.get(writer, set()) or k not in read.get(writer, set())}
            assert not stale, f"{name} {writer}: NOT_WRITTEN lists {sorted(stale)}, written or no longer read"


def test_a_key_list_that_loses_a_field_the_adapter_reads_fails(monkeypatch) -> None:
    """The slime dump's key list without the two nucleus keys (the drift this file exists for)."""
    from rollout_audit.integrations import slime as integ

    lost = ("rollout_top_p_token_ids", "rollout_top_p_token_offsets")
    monkeypatch.setattr(integ, "SAMPLE_KEYS", tuple(k for k in integ.SAMPLE_KEYS if k not in lost))
    read = asked("slime", slime_kind)["sample"]
    assert missing(read, slime_written()["sample"], {UNRECORDED: ""}) == set(lost)


# ---------------------------------------------------------------- the pages' names


def blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)


def names(block: str) -> set[str]:
    """The rollout_audit names a code block uses: dotted paths, imported names, `-m` modules."""
    out = set(re.findall(r"\b(rollout_audit(?:\.\w+)+)", block))
    for module, imported in re.findall(r"from (rollout_audit(?:\.\w+)*) import ([\w, ]+)", block):
        out |= {f"{module}.{n.strip()}" for n in imported.split(",") if n.strip()}
    return out


def resolves(dotted: str) -> bool:
    """`dotted` is a module, or an attribute (path) of the longest module prefix it has."""
    parts = dotted.split(".")
    obj: Any = importlib.import_module(parts[0])
    for i, attr in enumerate(parts[1:], 1):
        if not hasattr(obj, attr) and hasattr(obj, "__path__"):  # a submodule not imported yet
            try:
                importlib.import_module(".".join(parts[: i + 1]))
            except ModuleNotFoundError:
                return False
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


@pytest.mark.parametrize("name", PAGES)
def test_every_rollout_audit_name_in_a_page_block_resolves(name: str) -> None:
    text = (ROOT / "docs" / "frameworks" / f"{name}.md").read_text()
    used = set().union(*(names(b) for b in blocks(text)))
    assert used, f"{name}.md names nothing of rollout_audit in a code block"
    bad = sorted(n for n in used if not resolves(n))
    assert not bad, f"{name}.md names what rollout_audit does not have: {bad}"


def test_a_name_that_does_not_exist_is_caught() -> None:
    block = "from rollout_audit.integrations.verl import dump, no_such\n--x rollout_audit.integrations.slime.nope\n"
    assert sorted(n for n in names(block) if not resolves(n)) == [
        "rollout_audit.integrations.slime.nope",
        "rollout_audit.integrations.verl.no_such",
    ]
    assert resolves("rollout_audit.integrations.verl_v1.setup")


def test_the_pages_blocks_are_rendered_from_the_integrations_keys(monkeypatch) -> None:
    """The pages' generated blocks are what `dev.pages` renders now (else tests/test_generated.py fails),
    and a key the integration drops leaves the page's paste, which is then stale."""
    from rollout_audit.dev.generate import fill_regions
    from rollout_audit.dev.pages import regions
    from rollout_audit.integrations import slime as integ

    pages = {name: (ROOT / "docs" / "frameworks" / name).read_text() for name in regions()}
    for name, text in pages.items():
        assert fill_regions(text, regions()[name], name) == text, (
            f"{name} is stale: run python -m rollout_audit.dev generate"
        )
    monkeypatch.setattr(integ, "SAMPLE_KEYS", tuple(k for k in integ.SAMPLE_KEYS if k != "rollout_top_p_token_ids"))
    redrawn = fill_regions(pages["slime.md"], regions()["slime.md"], "slime.md")
    assert redrawn != pages["slime.md"] and '"rollout_top_p_token_ids",' not in redrawn
