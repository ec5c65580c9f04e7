"""`AuditedBackend` switched on through rLLM's own extension point, `UnifiedTrainer(backend_cls=...)`.

rLLM is not on the package index, so the backend it wraps is a stand-in with `BackendProtocol`'s method
names and the trainer's call order (rllm/trainer/unified_trainer.py at 9beb6e0: on-policy :521-570,
fully-async :669-792), and the batch is a DataProto-shaped object (`batch` of tensors, `non_tensor_batch`
of numpy arrays) built from the committed trainer fixtures, themselves built from rLLM's transform
(docs/frameworks/rllm.md). What is tested is the real mixin: what it writes through `dump_episodes` and
`dump_batch` is audited by the page's command, exactly as the fixtures are."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from adapterhelp import cli, fixture, opts  # noqa: E402
from test_adapters_rllm import CONTEXT  # noqa: E402

from rollout_audit.integrations.rllm import audited_backend  # noqa: E402


class _Episode:
    def __init__(self, d: dict[str, Any]) -> None:
        self._d = d

    def to_dict(self) -> dict[str, Any]:
        return dict(self._d)


def _proto(rows: list[dict[str, Any]]) -> SimpleNamespace:
    """The rows as rLLM's DataProto holds them: prompts left-padded, responses right-padded."""
    p = max(len(r["prompts"]) for r in rows)
    n = max(len(r["responses"]) for r in rows)

    def padded(key: str, left: bool, width: int, dtype: Any) -> Any:
        out = torch.zeros(len(rows), width, dtype=dtype)
        for i, r in enumerate(rows):
            v = torch.tensor(r[key], dtype=dtype)
            if left:
                out[i, width - len(v) :] = v
            else:
                out[i, : len(v)] = v
        return out

    att = torch.zeros(len(rows), p + n, dtype=torch.long)
    for i, r in enumerate(rows):
        att[i, p - len(r["prompts"]) : p + len(r["responses"])] = 1
    batch = {"prompts": padded("prompts", True, p, torch.long), "attention_mask": att}
    for key, dtype in (
        ("responses", torch.long),
        ("response_mask", torch.long),
        ("traj_rewards", torch.float64),
        ("advantages", torch.float64),
        ("rollout_log_probs", torch.float64),
    ):
        batch[key] = padded(key, False, n, dtype)
    extra = {
        k: np.array([r[k] for r in rows], dtype=object)
        for k in ("step_ids", "episode_ids", "group_roles", "is_pad_step")
    }
    return SimpleNamespace(batch=batch, non_tensor_batch=extra)


class _StandInBackend:
    """BackendProtocol's pipeline methods, returning the fixture's rows as the batch."""

    rows: list[dict[str, Any]] = []

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        self.seen: list[str] = []

    def transform_to_backend_batch(self, trainer_state: Any) -> Any:
        self.seen.append("transform")
        return _proto(self.rows)

    async def process_backend_batch(self, trainer_state: Any) -> None:
        self.seen.append("process")

    async def compute_advantages(self, trainer_state: Any, algorithm_config: Any) -> None:
        self.seen.append("advantages")

    async def update_policy(self, trainer_state: Any) -> None:
        self.seen.append("update")

    async def on_batch_end(self, trainer_state: Any) -> None:
        self.seen.append("end")


def _fixture(case: str) -> tuple[list[dict], list[dict]]:
    recs = [json.loads(x) for x in fixture("rllm", case).read_text().splitlines()]
    return [r for r in recs if "responses" not in r], [r for r in recs if "responses" in r]


def _train(case: str, out: Path, fully_async: bool) -> Path:
    """One training step in the order UnifiedTrainer calls the backend."""
    episodes, rows = _fixture(case)
    step = int(rows[0]["global_step"])
    base = type("StandIn", (_StandInBackend,), {"rows": [{k: v for k, v in r.items()} for r in rows]})
    backend = audited_backend(base, out)(config=None)
    eps = [_Episode({k: v for k, v in e.items() if k != "global_step"}) for e in episodes]

    async def on_policy() -> None:
        state = SimpleNamespace(global_step=step, episodes=eps, backend_batch=None)
        state.backend_batch = backend.transform_to_backend_batch(state)
        await backend.process_backend_batch(state)
        await backend.compute_advantages(state, None)
        await backend.update_policy(state)
        await backend.on_batch_end(state)

    async def fully() -> None:
        state = SimpleNamespace(global_step=step, episodes=None, backend_batch=None)  # reset_batch()
        state.backend_batch = backend.transform_to_backend_batch(state)
        await backend.process_backend_batch(state)
        await backend.update_policy(state)
        state.episodes = eps  # trainer_state.episodes = all_episodes, before on_batch_end
        await backend.on_batch_end(state)

    asyncio.run(fully() if fully_async else on_policy())
    assert backend.seen[-1] == "end"
    return out


def _check(path: Path) -> tuple[int, set[tuple[str, str]]]:
    res = cli("check", "--from", "rllm", path, *opts(CONTEXT), "--format", "json")
    assert res.exit_code in (0, 1), res.output
    rep = json.loads(res.stdout)
    return res.exit_code, {(f["code"], f["trajectory_id"]) for f in rep["findings"]}


@pytest.mark.parametrize(("case", "fully_async"), [("trainer_compliant", False), ("trainer_fully_async", True)])
def test_the_backends_records_of_a_compliant_step_audit_clean(tmp_path, case, fully_async):
    dumped = _train(case, tmp_path, fully_async)
    assert sorted(p.name.split("-")[1] for p in dumped.iterdir()) == ["batch", "episodes"]
    assert _check(dumped) == (0, set())


@pytest.mark.parametrize("fully_async", [False, True])
def test_a_row_the_backend_cut_at_the_cap_is_r411_and_m102(tmp_path, fully_async):
    code, found = _check(_train("trainer_row_cut_at_cap", tmp_path, fully_async))
    assert code == 1
    assert found == {("R411", "12/task-7:0/solver"), ("M102", "12/task-7:0/solver")}


def test_what_the_backend_could_not_record_is_exit_2_naming_it(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    base = type("StandIn", (_StandInBackend,), {"rows": _fixture("trainer_compliant")[1]})
    backend = audited_backend(base, blocked / "sub")(config=None)  # a file where the directory should be
    state = SimpleNamespace(global_step=12, episodes=[], backend_batch=None)
    state.backend_batch = backend.transform_to_backend_batch(state)
    with pytest.warns(UserWarning, match="AuditedBackend did not record"):
        asyncio.run(backend.compute_advantages(state, None))
    assert backend.seen == ["transform", "advantages"]  # the backend's own work went on


def test_a_dump_with_a_missing_line_is_exit_2_naming_what_was_lost(tmp_path):
    dumped = _train("trainer_compliant", tmp_path, False)
    (dumped / "rllm-missing-host-1.jsonl").write_text(
        json.dumps({"rollout_audit_missing": "the batch of step 13 (OSError: disk full)"}) + "\n"
    )
    res = cli("check", "--from", "rllm", dumped, *opts(CONTEXT))
    assert res.exit_code == 2
    assert "the batch of step 13" in res.output


def test_an_rllm_version_outside_the_tested_range_is_one_warning_at_start_up():
    base = type("StandIn", (_StandInBackend,), {"rows": []})
    with pytest.warns(UserWarning, match="outside the tested range") as caught:
        audited_backend(base, "unused")(config=None)
    assert len([w for w in caught if "tested range" in str(w.message)]) == 1
