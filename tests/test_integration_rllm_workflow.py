"""`AuditedWorkflowTrainer`: the trainer-side record of rLLM's `AgentWorkflowPPOTrainer`, read by `check --from rllm`.

rLLM is not on the package index (`pip download --no-deps rllm` finds no distribution), so the trainer the mixin
extends is a stand-in with the constructor keywords and the methods `fit_agent` calls with the batch, in its
order (rllm/trainer/verl/agent_workflow_trainer.py at 9beb6e0: `generate_trajectories` :208, the pads :316/:320,
`uid` :393, the advantages :425-433, the pad before `update_actor` :451), and the workflow is a stand-in with
`Workflow.run_with_termination_handling` (rllm/workflows/workflow.py:80), called as the engine calls it
(rllm/engine/agent_workflow_engine.py:94, :117). What is tested is the real mixin and the real CLI. The slow test
builds the batch as a real verl 0.9.1 `DataProto` and computes its advantages with verl's own GRPO kernel, the
way the trainer does, and checks that the committed fixtures are what that writes."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from adapterhelp import cli, fixture, opts  # noqa: E402
from test_adapters_rllm import CONTEXT  # noqa: E402

from rollout_audit.adapters.base import read_dump  # noqa: E402
from rollout_audit.adapters.rllm import SETTINGS  # noqa: E402
from rollout_audit.integrations import rllm as integration  # noqa: E402
from rollout_audit.integrations.rllm import WORKFLOW_SETTINGS, audited_workflow_trainer  # noqa: E402

PAGE = Path(__file__).resolve().parents[1] / "docs" / "frameworks" / "rllm.md"
FAULT = "workflow_grouped_by_trajectory_uid"
# rLLM's agent_ppo_trainer.yaml with verl's ppo_trainer.yaml under it, at the keys the trainer reads
CONFIG = {
    "actor_rollout_ref": {"actor": {"loss_agg_mode": "token-mean"}, "rollout": {"n": 2}},
    "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False},
    "rllm": {
        "stepwise_advantage": {"enable": False, "mode": "broadcast"},
        "rejection_sample": {"enable": False},
        "mask_truncated_samples": False,
        "distill": {"enable": False},
    },
}
ROW_KEYS = ("step_ids", "episode_ids", "group_roles", "is_pad_step", "trajectory_ids", "uid", "is_last_step")
TENSORS = ("responses", "response_mask", "traj_rewards", "step_rewards", "token_level_rewards", "rollout_log_probs")


def _parts(case: str) -> tuple[list[dict], list[dict]]:
    recs = [json.loads(x) for x in fixture("rllm", case).read_text().splitlines()]
    return [r for r in recs if "responses" not in r and SETTINGS not in r], [r for r in recs if "responses" in r]


def _proto(rows: list[dict[str, Any]], advantages: bool) -> SimpleNamespace:
    """The rows as the trainer's DataProto holds them: prompts left-padded, responses right-padded."""
    p, n = max(len(r["prompts"]) for r in rows), max(len(r["responses"]) for r in rows)

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
    for key in (*TENSORS, *(("advantages",) if advantages else ())):
        batch[key] = padded(key, False, n, torch.long if key in ("responses", "response_mask") else torch.float64)
    extra = {k: np.array([r[k] for r in rows], dtype=object) for k in ROW_KEYS if k != "uid"}
    if advantages:
        extra["uid"] = np.array([r["uid"] for r in rows], dtype=object)
    return SimpleNamespace(batch=batch, non_tensor_batch=extra, meta_info={})


class _Episode:
    def __init__(self, d: dict[str, Any]) -> None:
        self.id, self._d = d["id"], d

    def to_dict(self) -> dict[str, Any]:
        return dict(self._d)


class _StandInWorkflow:
    """A workflow whose episodes are the fixture's (rllm/workflows/workflow.py:35, :80)."""

    episodes: dict[str, dict[str, Any]] = {}

    def __init__(self, rollout_engine: Any = None, executor: Any = None, **kwargs: Any) -> None:
        self.kwargs = kwargs

    async def run_with_termination_handling(self, task: Any, uid: str, **kwargs: Any) -> _Episode:
        return _Episode(self.episodes[uid])


class _StandInTrainer:
    """AgentWorkflowPPOTrainer's constructor keywords (:45-57) and what fit_agent does with one batch, in order."""

    rows: list[dict[str, Any]] = []

    def __init__(self, config: Any, tokenizer: Any = None, workflow_class: Any = None, **kwargs: Any) -> None:
        self.config, self.workflow_class, self.global_steps = config, workflow_class, 0
        self.seen: list[str] = []

    def generate_trajectories(self, batch: Any, timing_raw: Any = None, **kwargs: Any) -> Any:
        async def run() -> None:  # AgentWorkflowEngine: one workflow per rollout, uid "{task_id}:{rollout_idx}"
            workflow = self.workflow_class(rollout_engine=None, executor=None)
            for uid in batch.non_tensor_batch["uids"]:
                await workflow.run_with_termination_handling(task={}, uid=uid)

        asyncio.run(run())
        self.seen.append("generate")
        return _proto([r for r in self.rows if not r["is_pad_step"]], advantages=False)

    def _pad_dataproto_to_world_size(self, batch: Any) -> Any:
        self.seen.append("pad")
        if "advantages" not in batch.batch:
            return batch
        return _proto(self.rows, advantages=True)  # the pad rows repeat the first ones, is_pad_step set

    def fit_step(self, step: int) -> None:
        self.global_steps = step
        uids = np.array(list(self.workflow_class.episodes), dtype=object)
        batch = self.generate_trajectories(SimpleNamespace(non_tensor_batch={"uids": uids}, meta_info={}))
        batch = self._pad_dataproto_to_world_size(batch)  # :320, before the advantages: not written
        with_adv = _proto([r for r in self.rows if not r["is_pad_step"]], advantages=True)  # :393-438
        self._pad_dataproto_to_world_size(with_adv)  # :451, the batch update_actor trains
        self.seen.append("update")

    def validate(self) -> None:  # _validate_agent :585-600: generation of a validation batch
        uids = np.array(list(self.workflow_class.episodes), dtype=object)
        self.generate_trajectories(SimpleNamespace(non_tensor_batch={"uids": uids}, meta_info={"validate": True}))


def _train(case: str, out: Path, config: Any = None) -> Path:
    episodes, rows = _parts(case)
    workflow = type(
        "Workflow",
        (_StandInWorkflow,),
        {"episodes": {e["id"]: {k: v for k, v in e.items() if k != "global_step"} for e in episodes}},
    )
    base = type("StandIn", (_StandInTrainer,), {"rows": rows})
    with pytest.warns(UserWarning, match="outside the tested range"):
        trainer = audited_workflow_trainer(base, out)(
            config=CONFIG if config is None else config, workflow_class=workflow
        )
    trainer.validate()
    trainer.fit_step(int(rows[0]["global_step"]))
    assert trainer.seen == ["generate", "generate", "pad", "pad", "update"]
    return out


def _check(path: Path, *extra: str) -> tuple[int, set[tuple[str, str]], dict]:
    res = cli("check", "--from", "rllm", path, *opts(CONTEXT), "--format", "json", *extra)
    assert res.exit_code in (0, 1), res.output
    rep = json.loads(res.stdout)
    return res.exit_code, {(f["code"], f["trajectory_id"]) for f in rep["findings"]}, rep


def test_the_workflow_trainers_compliant_fixture_audits_clean_with_advantages_recomputed() -> None:
    code, found, rep = _check(fixture("rllm", "compliant_workflow"))
    assert (code, found) == (0, set())
    assert "U603" not in {n["code"] for n in rep["not_run"]}  # the advantages were recomputed, and held
    assert "loss_agg_mode 'token-mean'" in rep["summary"]["trainer_settings_said"]


def test_grpo_grouped_by_trajectory_uid_is_u603_on_every_rollout() -> None:
    """rLLM at 9beb6e0 groups GRPO by `step_ids`, a fresh `Trajectory.uid` per rollout (rllm-org/rllm#605): each
    rollout is a group of one, whose verl advantage is its raw reward."""
    code, found, rep = _check(fixture("rllm", FAULT))
    assert code == 1
    assert found == {("U603", "12/task-7:0/solver"), ("U603", "12/task-7:1/solver")}
    assert "advantage 0.999999 recorded, expected 0.707106" in json.dumps(rep["findings"])


@pytest.mark.parametrize(("case", "want"), [("compliant_workflow", set()), (FAULT, {"U603"})])
def test_the_mixins_records_of_one_training_step_audit_as_the_fixture(tmp_path, case, want) -> None:
    dumped = _train(case, tmp_path)
    assert sorted(p.name.split("-")[1] for p in dumped.iterdir()) == ["batch", "episodes"]
    code, found, rep = _check(dumped)
    assert {c for c, _ in found} == want and code == (1 if want else 0)
    written = [r for r in read_dump(next(dumped.glob("rllm-batch-*")))]
    assert written[0][SETTINGS]["loss_agg_mode"] == "token-mean" and written[0][SETTINGS]["rllm_version"] is None
    assert [r["uid"] for r in written[1:]] == [r["uid"] for r in _parts(case)[1]]
    assert "rLLM (version unknown) (outside the tested range" in rep["summary"]["trainer_settings_said"]


def test_a_setting_missing_from_the_configuration_is_said_in_the_dump_and_in_not_run(tmp_path) -> None:
    config = json.loads(json.dumps(CONFIG))
    del config["actor_rollout_ref"]["actor"]["loss_agg_mode"], config["algorithm"]["adv_estimator"]
    dumped = _train("compliant_workflow", tmp_path, config)
    settings = read_dump(next(dumped.glob("rllm-batch-*")))[0][SETTINGS]
    assert (
        settings["not_recorded"]["loss_agg_mode"]
        == "actor_rollout_ref.actor.loss_agg_mode is not in the trainer's configuration"
    )
    code, found, rep = _check(dumped)
    why = {n["code"]: n["reason"] for n in rep["not_run"]}
    assert code == 0 and "algorithm.adv_estimator is not in the trainer's configuration" in why["U603"]
    assert "actor_rollout_ref.actor.loss_agg_mode is not in the trainer's configuration" in why["U601"]


def test_a_record_the_trainer_could_not_write_is_a_warning_and_exit_2(tmp_path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    episodes, rows = _parts("compliant_workflow")
    base = type("StandIn", (_StandInTrainer,), {"rows": rows})
    workflow = type("Workflow", (_StandInWorkflow,), {"episodes": {e["id"]: e for e in episodes}})
    with pytest.warns(UserWarning, match="outside the tested range"):
        trainer = audited_workflow_trainer(base, blocked / "sub")(config=CONFIG, workflow_class=workflow)
    with pytest.warns(UserWarning, match="AuditedWorkflowTrainer did not record the episodes of step 12"):
        trainer.fit_step(12)
    assert trainer.seen[-1] == "update"  # training went on
    good = _train("compliant_workflow", tmp_path / "d")
    (good / "rllm-missing-h-1.jsonl").write_text(json.dumps({"rollout_audit_missing": "the batch of step 13"}) + "\n")
    res = cli("check", "--from", "rllm", good, *opts(CONTEXT))
    assert res.exit_code == 2 and "the batch of step 13" in res.output


def test_the_trainers_own_settings_win_and_a_contradicting_context_is_exit_2(tmp_path) -> None:
    res = cli("check", "--from", "rllm", fixture("rllm", "compliant_workflow"), *opts([*CONTEXT, "adv_estimator=rloo"]))
    assert res.exit_code == 2 and "contradicts the trainer's record" in res.output
    res = cli(
        "check", "--from", "rllm", fixture("rllm", "compliant_workflow"), *opts([*CONTEXT, "compact_filtering=true"])
    )
    assert res.exit_code == 2 and "applies no compact filtering" in res.output
    recs = read_dump(fixture("rllm", "compliant_workflow"))
    second = json.loads(json.dumps([r for r in recs if SETTINGS in r][0]))
    second[SETTINGS]["loss_agg_mode"] = "seq-mean-token-mean"
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*recs, second]))
    res = cli("check", "--from", "rllm", tmp_path / "d.jsonl", *opts(CONTEXT))
    assert res.exit_code == 2 and "one run's trainer has one configuration" in res.output


def test_the_workflow_args_are_merged_as_task_runner_merges_them() -> None:
    given = {"env_args": {"a": 1}, "timeout": 5}
    got = integration.merged_workflow_args(given, {"env_args": {"b": 2}, "timeout": None, "gamma": 0.0})
    assert got == {"env_args": {"a": 1, "b": 2}, "timeout": 5, "gamma": 0.0} and given["env_args"] == {"a": 1}


def _section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"## {title}")
    return text[start : text.find("\n## ", start + 3)]


def test_the_pages_settings_list_snippet_and_command_are_the_codes(tmp_path, monkeypatch) -> None:
    """The page's workflow-trainer section names exactly the settings the recorder reads, at their paths; its
    snippet imports names the integration defines; and its command, run in a directory where the mixin wrote to
    the snippet's directory, audits that dump clean."""
    page = _section("Set these options: AgentWorkflowPPOTrainer")
    listed = dict(re.findall(r"^- `(\w+)` ← `([\w.]+)`", page, re.M))
    assert listed == WORKFLOW_SETTINGS
    code = re.search(r"```python\n(.*?)```", page, re.S)
    assert code is not None
    for names in re.findall(r"from rollout_audit\.integrations\.rllm import ([\w, ]+)", code.group(1)):
        assert all(hasattr(integration, n.strip()) for n in names.split(","))
    directory = re.search(r'audited_task_runner\("([^"]+)"\)', code.group(1))
    command = re.search(r"    (rollout-audit check --from rllm .*?)\n\n", page, re.S)
    assert directory is not None and command is not None
    words = [w for w in command.group(1).split() if w != "\\"]
    assert words[:5] == ["rollout-audit", "check", "--from", "rllm", directory.group(1)]
    monkeypatch.chdir(tmp_path)
    _train("compliant_workflow", Path(directory.group(1)))
    res = cli(*words[1:], "--format", "json")
    assert res.exit_code == 0 and json.loads(res.stdout)["findings"] == [], res.output


@pytest.mark.slow  # imports verl and torch
@pytest.mark.parametrize(("case", "grouping"), [("compliant_workflow", "trajectory_ids"), (FAULT, "step_ids")])
def test_the_fixtures_are_what_verls_own_grpo_writes_through_the_mixin(tmp_path, case, grouping) -> None:
    """The batch as a real verl DataProto, `uid` set from `grouping` (rLLM sets it from step_ids, :393), the
    advantages from verl's GRPO kernel (the GRPO branch of verl's compute_advantage) and the pad from verl's
    `pad_dataproto_to_divisor` (:956): the mixin writes the fixture's rows."""
    pytest.importorskip("verl")
    from tensordict import TensorDict
    from verl import DataProto
    from verl.protocol import pad_dataproto_to_divisor
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    episodes, rows = _parts(case)
    real = [r for r in rows if not r["is_pad_step"]]
    shaped = _proto(real, advantages=False)
    tensors = {k: v.float() if v.dtype == torch.float64 else v for k, v in shaped.batch.items()}
    batch = DataProto(
        batch=TensorDict(tensors, batch_size=len(real)), non_tensor_batch=dict(shaped.non_tensor_batch), meta_info={}
    )
    batch.non_tensor_batch["uid"] = batch.non_tensor_batch[grouping]
    adv, _ = compute_grpo_outcome_advantage(
        batch.batch["token_level_rewards"], batch.batch["response_mask"], index=batch.non_tensor_batch["uid"]
    )
    batch.batch["advantages"] = adv

    class Verl:
        def __init__(self, **kwargs: Any) -> None:
            self.config, self.global_steps = CONFIG, 12

        def _pad_dataproto_to_world_size(self, b: Any) -> Any:
            out, pad = pad_dataproto_to_divisor(b, 4)
            out.non_tensor_batch["is_pad_step"][len(b) :] = True
            return out

    with pytest.warns(UserWarning, match="outside the tested range"):
        trainer = audited_workflow_trainer(Verl, tmp_path)()
    trainer._pad_dataproto_to_world_size(batch)
    written = read_dump(next(tmp_path.glob("rllm-batch-*")))[1:]
    assert len(written) == len(rows)
    for got, want in zip(written, rows):
        assert {k: got[k] for k in ROW_KEYS} == {k: want[k] for k in ROW_KEYS}
        assert got["advantages"] == pytest.approx(want["advantages"], abs=1e-6)


def test_advantages_mispaired_with_their_episodes_are_u603_on_both(tmp_path) -> None:
    """The compliant step with the two rollouts' advantages exchanged (each row trained with the other
    episode's advantage): the recomputation from the episodes' rewards names both."""
    recs = read_dump(fixture("rllm", "compliant_workflow"))
    rows = [r for r in recs if "responses" in r and not r["is_pad_step"]]
    rows[0]["advantages"], rows[1]["advantages"] = rows[1]["advantages"], rows[0]["advantages"]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    code, found, rep = _check(tmp_path / "d.jsonl")
    assert (code, found) == (1, {("U603", "12/task-7:0/solver"), ("U603", "12/task-7:1/solver")})
    assert "advantage -0.707106 recorded, expected 0.707106" in json.dumps(rep["findings"])


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ("config", "rollout_audit_trainer_settings is not an object"),
        ({"trainer": "RayPPOTrainer"}, "rollout_audit_trainer_settings.trainer is 'RayPPOTrainer'"),
        ({"trainer": "AgentWorkflowPPOTrainer", "loss_agg_mode": 3}, "loss_agg_mode has type int"),
        (
            {"trainer": "AgentWorkflowPPOTrainer", "not_recorded": {"x": [1]}},
            "not_recorded must be an object of strings",
        ),
    ],
)
def test_a_malformed_settings_record_is_exit_2_naming_the_record(tmp_path, settings, said) -> None:
    recs = [r for r in read_dump(fixture("rllm", "compliant_workflow")) if SETTINGS not in r]
    lines = [json.dumps({"global_step": 12, SETTINGS: settings}), *(json.dumps(r) for r in recs)]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    res = cli("check", "--from", "rllm", tmp_path / "d.jsonl", *opts(CONTEXT))
    assert res.exit_code == 2 and "d.jsonl:1" in res.output and said in res.output, res.output
    assert "Traceback" not in res.output
