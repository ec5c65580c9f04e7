"""The SkyRL integration (`rollout_audit.integrations.skyrl`) against stand-ins, not SkyRL: skyrl
0.4.0 needs Python >= 3.12 and this machine runs 3.11. The stand-ins are built from the shapes in the
skyrl 0.4.0 wheel (cited in the integration's docstring): an experiment with `get_generator` /
`get_trainer` as `BasePPOExp`'s, an inference client whose `generate` takes `InferenceEngineInput`
and returns `InferenceEngineOutput`, a generator whose agent loop makes one call per turn with the
session `{instance_id}_{repetition_id}` and appends an EOS to the list the client returned after a
stop string, and a trainer whose `convert_to_training_input` / `compute_advantages_and_returns` give
right-aligned response tensors. The stand-ins replay the committed SkyRL fixtures, so the dump the
integration writes must audit as the fixture does, through the CLI. `test_skyrl_source_shapes` reads
the shapes from a SkyRL source tree when `ROLLOUT_AUDIT_SKYRL_SRC` names one."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from adapterhelp import cli, context_args, fixture

from rollout_audit.adapters.base import UNRECORDED, read_dump
from rollout_audit.integrations import skyrl as integ

EOS = 151645


@dataclass
class TrajectoryID:
    instance_id: str
    repetition_id: int


@dataclass
class BatchMetadata:
    global_step: int
    training_phase: str


class Client:
    """An inference client: answers each engine call of the fixture, by its prompt ids."""

    weight_version = 4

    def __init__(self, calls):
        self.answers = {}  # prompt -> its answers in the fixture's order (a prompt drawn again answers anew)
        for c in calls:
            self.answers.setdefault(tuple(c["prompt_token_ids"]), []).append(c["response_ids"])

    async def generate(self, input_batch, model=None):
        ids = [list(self.answers[tuple(p)].pop(0)) for p in input_batch["prompt_token_ids"]]
        return {"responses": ["" for _ in ids], "response_ids": ids, "stop_reasons": ["stop" for _ in ids]}


class Generator:
    """SkyRL's generator as the trainer sees it, replaying fixture rows: one engine call per recorded
    call, the EOS appended to the returned list where the row has it after a stop string."""

    def __init__(self, client, rows, step_wise):
        self.client, self.rows, self.step_wise = client, list(rows), step_wise

    def take(self, tid):
        """The next rows of trajectory `tid` (an episode's rows are consecutive)."""
        at = next(i for i, r in enumerate(self.rows) if TrajectoryID(**r["trajectory_ids"]) == tid)
        end = at
        while end < len(self.rows) and TrajectoryID(**self.rows[end]["trajectory_ids"]) == tid:
            end += 1
            if not self.step_wise:
                break
        mine, self.rows[at:end] = self.rows[at:end], []
        return mine

    async def generate(self, input_batch, disable_tqdm=False):
        mine = [r for tid in input_batch["trajectory_ids"] for r in self.take(tid)]
        for r in mine:
            tid = r["trajectory_ids"]
            for call in r["engine_calls"]:
                out = await self.client.generate(
                    {
                        "prompt_token_ids": [call["prompt_token_ids"]],
                        "session_ids": [f"{tid['instance_id']}_{tid['repetition_id']}"],
                    }
                )
                ids = out["response_ids"][0]
                at = len(call["prompt_token_ids"]) - len(r["prompt_token_ids"]) + len(ids)
                if at < len(r["response_ids"]) and r["response_ids"][at] == EOS and ids[-1] != EOS:
                    ids.append(EOS)  # skyrl_gym_generator.py:531-545
        keys = ("prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons", "rollout_logprobs")
        out = {k: [r[k] for r in mine] for k in keys}
        out["is_last_step"] = [r["is_last_step"] for r in mine] if self.step_wise else None
        out["trajectory_ids"] = [TrajectoryID(**r["trajectory_ids"]) for r in mine] if self.step_wise else None
        return out


class RayPPOTrainer:
    """The trainer: its compute_advantages_and_returns gives the fixture's trainer rows' tensors,
    right-aligned in a batch as skyrl 0.4.0 lays them out (dataset/preprocess.py:297)."""

    def __init__(self, generator, trainer_rows, step):
        self.generator, self.trainer_rows, self.global_step = generator, trainer_rows, step
        self.cfg = SimpleNamespace(
            trainer=SimpleNamespace(algorithm=SimpleNamespace(advantage_estimator="grpo", grpo_norm_by_std=True))
        )

    def convert_to_training_input(self, generator_output, uids):
        width = max(len(r) for r in generator_output["response_ids"]) + 2
        rows = self.trainer_rows
        batch = {k: [[0] * (width - len(r[k])) + r[k] for r in rows] for k in integ.BATCH_KEYS}
        return Batch(tensors=batch, metadata={"uids": uids, "is_last_step": generator_output.get("is_last_step")})

    def compute_advantages_and_returns(self, data):
        return data

    async def step(self, generator_input):
        out = await self.generator.generate(generator_input)
        if self.trainer_rows:  # a sampler-only fixture: the batch is not trained here
            self.compute_advantages_and_returns(self.convert_to_training_input(out, []))


class Batch(SimpleNamespace):
    def __getitem__(self, key):
        return self.tensors[key]


class FullyAsyncRayPPOTrainer(RayPPOTrainer):
    async def group(self, generator_input):
        kwargs = (
            {"disable_tqdm": True} if "disable_tqdm" in inspect.signature(self.generator.generate).parameters else {}
        )
        return await self.generator.generate(generator_input, **kwargs)  # fully_async_trainer.py:920-930

    def train_groups(self, outputs):
        """One training step over groups generated earlier: their lists concatenated as
        `concatenate_generator_outputs` does (generators/utils.py:271-276, the rows' own lists)."""
        out = {k: [x for o in outputs for x in o[k]] for k in ("response_ids", "rewards")}
        return self.compute_advantages_and_returns(self.convert_to_training_input(out, []))


def experiment(rows, trainer_rows, step, trainer_cls=RayPPOTrainer, step_wise=False):
    """BasePPOExp's shape: the generator from the client, the trainer from the generator."""

    class Exp:
        def get_generator(self, cfg, tokenizer, inference_engine_client):
            return Generator(inference_engine_client, rows, step_wise)

        def get_trainer(
            self, cfg, tracker, tokenizer, train_dataset, eval_dataset, inference_engine_client, generator, colocate_pg
        ):
            return trainer_cls(generator, trainer_rows, step)

    return Exp


def run(tmp_path, case, trainer_cls=RayPPOTrainer, step_wise=False, groups=None, first=None):
    recs = [dict(r) for r in read_dump(fixture("skyrl", case))][:first]
    rows = [r for r in recs if "advantages" not in r]
    trainer_rows = [r for r in recs if "advantages" in r]
    calls = [c for r in rows for c in r["engine_calls"]]
    step = rows[0].get("global_step", 0)
    exp = integ.audited_experiment(experiment(rows, trainer_rows, step, trainer_cls, step_wise), tmp_path / "dump")()
    client = Client(calls)
    gen = exp.get_generator(None, None, client)
    trainer = exp.get_trainer(None, None, None, None, None, client, gen, None)
    assert isinstance(trainer, trainer_cls) and type(trainer).__name__ == f"Audited{trainer_cls.__name__}"
    tids = []  # TrajectoryID is an unhashable dataclass, as SkyRL's (generators/base.py:16-22)
    for r in rows:
        if TrajectoryID(**r["trajectory_ids"]) not in tids:
            tids.append(TrajectoryID(**r["trajectory_ids"]))
    meta = BatchMetadata(step, "train")
    if groups is None:
        asyncio.run(trainer.step({"trajectory_ids": tids, "batch_metadata": meta}))
    else:
        for at, members in groups:
            trainer.global_step = at
            asyncio.run(trainer.group({"trajectory_ids": members, "batch_metadata": BatchMetadata(at - 1, "train")}))
    return rows, trainer_rows, [r for p in sorted((tmp_path / "dump").iterdir()) for r in read_dump(p)]


def _check(path):
    """`check --from skyrl` as a user runs it: (result, report with not_run as {code: reason})."""
    res = cli("check", "--from", "skyrl", path, *context_args(), "--format", "json")
    rep = json.loads(res.stdout)
    rep["not_run"] = {n["code"]: n["reason"] for n in rep["not_run"]}
    return res, rep


@pytest.mark.parametrize("case", ["trainer", "compliant"])
def test_the_dump_holds_the_fixture_rows_and_audits_clean(tmp_path, case):
    rows, trainer_rows, dumped = run(tmp_path, case)
    samples = [r for r in dumped if "advantages" not in r]
    for got, want in zip(samples, rows, strict=True):
        assert {k: got[k] for k in want if k != "engine_calls"} == {
            k: v for k, v in want.items() if k != "engine_calls"
        }
        assert [(c["prompt_token_ids"], c["response_ids"], c["weight_version"]) for c in got["engine_calls"]] == [
            (c["prompt_token_ids"], c["response_ids"], 4) for c in want["engine_calls"]
        ]
        assert set(got[UNRECORDED]) == {"routed_experts_sha256", "routed_experts_version"}
    assert [r for r in dumped if "advantages" in r] == [{**r, "is_last_step": None} for r in trainer_rows]
    res, rep = _check(tmp_path / "dump")
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    assert ("U603" in rep["not_run"]) == (not trainer_rows)
    assert "skyrl 0.4.0 keeps them as RoutedExpertIndices" in rep["not_run"]["P505"]


def test_the_eos_appended_after_the_call_is_not_the_engines_and_is_m101(tmp_path):
    """The agent loop appends the EOS to the very list the client returned: the recorder copied it
    first, so the EOS the mask trains is not among the engine's ids (NovaSky-AI/SkyRL#758)."""
    rows, _, dumped = run(tmp_path, "eos_appended_logprob_zero")
    assert dumped[3]["response_ids"][-1] == EOS and dumped[3]["response_ids"] == rows[3]["response_ids"]
    assert [c["response_ids"] for c in dumped[3]["engine_calls"]] == [
        c["response_ids"] for c in rows[3]["engine_calls"]
    ]
    res, rep = _check(tmp_path / "dump")
    assert res.exit_code == 1
    assert {(f["code"], f["trajectory_id"]) for f in rep["findings"]} == {("M101", "3/search-4_1")}


def test_step_wise_rows_get_their_own_call_and_audit_clean(tmp_path):
    rows, trainer_rows, dumped = run(tmp_path, "step_wise", step_wise=True)
    samples = [r for r in dumped if "advantages" not in r]
    assert [len(r["engine_calls"]) for r in samples] == [1] * len(rows)
    assert [r["engine_calls"][0]["response_ids"] for r in samples] == [
        r["engine_calls"][0]["response_ids"] for r in rows
    ]
    assert [r["is_last_step"] for r in dumped if "advantages" in r] == [r["is_last_step"] for r in trainer_rows]
    res, rep = _check(tmp_path / "dump")
    assert res.exit_code == 0 and rep["findings"] == [], res.output


def test_fully_async_groups_are_named_by_the_step_that_scheduled_them(tmp_path):
    recs = read_dump(fixture("skyrl", "fully_async"))
    tid = [TrajectoryID(**r["trajectory_ids"]) for r in recs[:2]]
    # the fixture's two groups are the same prompt drawn at steps 7 and 9: replay one group per step
    _, _, first = run(tmp_path / "a", "fully_async", trainer_cls=FullyAsyncRayPPOTrainer, groups=[(7, tid)], first=2)
    assert [r["global_step_when_scheduled"] for r in first] == [7, 7] and "global_step" not in first[0]
    res, rep = _check(tmp_path / "a" / "dump")
    assert res.exit_code == 0 and rep["findings"] == [], res.output


def test_a_row_whose_session_made_no_call_is_declared_not_recorded(tmp_path):
    gen = integ.RecordingGenerator(
        Generator(integ.RecordingClient(Client([])), [], False), integ.RecordingClient(Client([])), integ.Dump(tmp_path)
    )
    tid = [TrajectoryID("gsm8k-17", 0)]
    out = {
        "prompt_token_ids": [[1, 2]],
        "response_ids": [[3, EOS]],
        "rewards": [1.0],
        "loss_masks": [[1, 1]],
        "stop_reasons": ["stop"],
    }
    rec = gen.records(out, tid, ["gsm8k-17_0"], {"gsm8k-17_0": None}, {"global_step": 1})[0]
    assert "engine_calls" not in rec and "generator.batched=true" in rec[UNRECORDED]["token_source"]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "skyrl-1.jsonl").write_text(json.dumps(rec) + "\n")
    res, rep = _check(tmp_path / "d")
    assert res.exit_code == 0, res.output
    assert "generator.batched=true" in rep["not_run"]["M101"]


def test_an_evaluation_batch_is_not_dumped_and_forwards_unchanged(tmp_path):
    client = integ.RecordingClient(Client([{"prompt_token_ids": [1], "response_ids": [2, EOS]}]))
    rows = [
        {
            "trajectory_ids": {"instance_id": "a", "repetition_id": 0},
            "prompt_token_ids": [1],
            "response_ids": [2, EOS],
            "rewards": 1.0,
            "loss_masks": [1, 1],
            "stop_reasons": "stop",
            "rollout_logprobs": [-0.1, -0.2],
            "engine_calls": [{"prompt_token_ids": [1], "response_ids": [2, EOS]}],
        }
    ]
    inner = Generator(client, rows, False)
    gen = integ.RecordingGenerator(inner, client, integ.Dump(tmp_path / "d"))
    assert "disable_tqdm" in inspect.signature(gen.generate).parameters
    out = asyncio.run(
        gen.generate({"trajectory_ids": [TrajectoryID("a", 0)], "batch_metadata": BatchMetadata(1, "eval")})
    )
    assert out["response_ids"] == [[2, EOS]] and not (tmp_path / "d").exists() and client.calls == {}


def test_a_version_outside_the_tested_range_is_one_warning():
    assert integ.version_warning("0.4.0") is None
    assert "skyrl 0.5.0 is outside the tested range (0.4.0)" in integ.version_warning("0.5.0")
    opts, rest = integ.parse(["--audit-dir", "d", "trainer.epochs=1", "generator.step_wise_trajectories=true"])
    assert opts.audit_dir == "d" and rest == ["trainer.epochs=1", "generator.step_wise_trajectories=true"]


def _names(tree: ast.Module, cls: str) -> set[str]:
    """The methods, annotated fields and TypedDict keys of a class in a parsed module."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            out = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    out.add(item.target.id)
            return out
    return set()


def test_skyrl_source_shapes():
    """Drift: every class, method and field the integration relies on (`RELIES`) is in the SkyRL
    source named by ROLLOUT_AUDIT_SKYRL_SRC (an unpacked wheel or a checkout; skipped otherwise)."""
    src = os.environ.get("ROLLOUT_AUDIT_SKYRL_SRC")
    if not src:
        pytest.skip("ROLLOUT_AUDIT_SKYRL_SRC names no SkyRL source tree (skyrl needs Python >= 3.12)")
    gone = []
    for path, classes in integ.RELIES.items():
        tree = ast.parse((Path(src) / path).read_text())
        for cls, names in classes.items():
            gone += [f"{path}: {cls}.{n}" for n in sorted(names - _names(tree, cls))]
    assert gone == []


def test_a_batch_holding_a_row_the_generator_did_not_return_gets_no_trainer_record(tmp_path):
    """Merged step-wise rows are new lists: the batch's group statistics cannot be stated in part."""
    client = integ.RecordingClient(Client([]))
    gen = integ.RecordingGenerator(Generator(client, [], False), client, integ.Dump(tmp_path / "d"))
    row = {"advantages": [0.5, 0.5], "response_mask": [1, 1], "loss_mask": [1, 1]}
    trainer = integ.audited_trainer_class(RayPPOTrainer)(gen, [row], 3)
    trainer.rollout_audit_dump, trainer.rollout_audit_generator = gen._dump, gen
    batch = trainer.convert_to_training_input({"response_ids": [[5, EOS]]}, ["a"])
    with pytest.warns(UserWarning, match="step 3 has no trainer record"):
        assert trainer.compute_advantages_and_returns(batch) is batch
    assert not (tmp_path / "d").exists()


PAGE = Path(__file__).resolve().parents[1] / "docs" / "frameworks" / "skyrl.md"


def test_the_page_uses_exactly_the_options_the_entry_point_has():
    """Each `python -m rollout_audit.integrations.skyrl` command of the page's "Set these options"
    parses with the entry point's parser, and together they use every option it has; the
    fallback paste's dump keys hold every GeneratorOutput list the integration writes."""
    text = PAGE.read_text()
    section = text.split("## Set these options", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", section, flags=re.M | re.S)
    used: set[str] = set()
    for block in blocks:
        line = block.replace("\\\n", " ")
        for cmd in (ln for ln in line.splitlines() if ln.startswith("python -m rollout_audit.integrations.skyrl")):
            argv = shlex.split(cmd)[3:]
            opts, rest = integ.parse(argv)
            assert opts.audit_dir == "rollout_dumps" and all("=" in r for r in rest), cmd
            used |= {a for a in argv if a.startswith("--")}
    parser_opts = {"--audit-dir", "--experiment"}
    assert used == parser_opts
    assert {
        o for a in integ.parse(["--audit-dir", "x"])[0].__dict__ for o in [f"--{a.replace('_', '-')}"]
    } == parser_opts
    for keys in re.findall(r"keys = \((.*?)\)", text, flags=re.S):
        assert set(integ.SAMPLE_KEYS) <= set(re.findall(r'"(\w+)"', keys))


@pytest.mark.parametrize("said", [{"no_such_field": "x"}, {"token_source": 3}, "everything"])
def test_a_recorder_word_the_adapter_does_not_know_is_one_line_and_exit_2(tmp_path, said):
    """A dump's `rollout_audit_unrecorded` only explains an absent field: any other content is refused."""
    rec = dict(read_dump(fixture("skyrl", "compliant"))[0])
    rec[UNRECORDED] = said
    (tmp_path / "skyrl-3.jsonl").write_text(json.dumps(rec) + "\n")
    res = cli("check", "--from", "skyrl", tmp_path, *context_args())
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.count("\n") == 1 and f"skyrl-3.jsonl:1: {UNRECORDED}" in res.stderr, res.stderr


class SyncingClient(Client):
    """A client whose weights are synced while a call runs (the fully-async trainer's pause/resume)."""

    async def generate(self, input_batch, model=None):
        out = await super().generate(input_batch, model)
        self.weight_version += 1
        return {**out, "response_logprobs": [[-0.5] * len(ids) for ids in out["response_ids"]]}


def test_a_call_keeps_its_log_probs_and_both_weight_versions_when_a_sync_moved_them():
    inner = SyncingClient([{"prompt_token_ids": [1, 2], "response_ids": [3, EOS]}])
    client = integ.RecordingClient(inner)
    prompt = [1, 2]
    out = asyncio.run(client.generate({"prompt_token_ids": [prompt], "session_ids": ["a_0"]}, model="m"))
    out["response_ids"][0].append(EOS)  # what the agent loop may do after a stop string
    prompt.append(9)
    assert client.calls == {
        "a_0": [
            {
                "prompt_token_ids": [1, 2],
                "response_ids": [3, EOS],
                "stop_reason": "stop",
                "response_logprobs": [-0.5, -0.5],
                "weight_version": 4,
                "weight_version_at_return": 5,
            }
        ]
    }
    assert client.weight_version == 5  # every other attribute is the client's own


def _grpo(rewards):
    """GRPO's outcome advantages of one group: (r - mean) / (Bessel std + 1e-6)."""
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
    return [(r - mean) / (std + 1e-6) for r in rewards]


@pytest.mark.parametrize("case", ["two prompts", "one prompt twice", "sign flipped"])
def test_fully_async_groups_trained_later_keep_their_names_and_their_group_advantages(tmp_path, case):
    """Two groups scheduled at steps 7 and 9, trained together at step 10: the trainer records are
    named by the step that scheduled each group. Of two prompts, U603 recomputes each group's GRPO
    advantages (and a sign flipped is U603). Of one prompt drawn twice (an epoch boundary inside the
    staleness window), SkyRL's GRPO pools both groups under their one uid: that update's advantages
    are not written, never a finding."""
    rows = [dict(r) for r in read_dump(fixture("skyrl", "fully_async"))]
    if case != "one prompt twice":
        for r in rows[2:]:
            r["trajectory_ids"] = {**r["trajectory_ids"], "instance_id": "gsm8k-18"}
    rewards = [r["rewards"] for r in rows]
    adv = _grpo(rewards) if case == "one prompt twice" else _grpo(rewards[:2]) + _grpo(rewards[2:])
    if case == "sign flipped":
        adv = [-a for a in adv]
    trainer_rows = [
        {
            "advantages": [a] * len(r["response_ids"]),
            "response_mask": [1] * len(r["response_ids"]),
            "loss_mask": r["loss_masks"],
        }
        for a, r in zip(adv, rows)
    ]
    calls = [c for r in rows for c in r["engine_calls"]]
    exp = integ.audited_experiment(experiment(rows, trainer_rows, 0, FullyAsyncRayPPOTrainer), tmp_path / "dump")()
    client = Client(calls)
    gen = exp.get_generator(None, None, client)
    trainer = exp.get_trainer(None, None, None, None, None, client, gen, None)
    outputs = []
    for at, group in ((7, rows[:2]), (9, rows[2:])):
        trainer.global_step = at
        tids = [TrajectoryID(**r["trajectory_ids"]) for r in group]
        meta = BatchMetadata(at - 1, "train")
        outputs.append(asyncio.run(trainer.group({"trajectory_ids": tids, "batch_metadata": meta})))
    trainer.global_step = 10
    trainer.train_groups(outputs)
    dumped = [r for p in sorted((tmp_path / "dump").iterdir()) for r in read_dump(p)]
    named = [(r["global_step"], r["global_step_when_scheduled"]) for r in dumped if "advantages" in r]
    assert named == [(10, 7), (10, 7), (10, 9), (10, 9)]
    res, rep = _check(tmp_path / "dump")
    if case == "sign flipped":
        assert res.exit_code == 1 and {f["code"] for f in rep["findings"]} == {"U603"}, res.output
    else:
        assert res.exit_code == 0 and rep["findings"] == [], res.output
        assert ("U603" in rep["not_run"]) == (case == "one prompt twice")


def test_the_entry_point_without_skyrl_says_so_in_one_line():
    """As a user starts it where skyrl is not installed (this machine): one line, exit status set."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("skyrl") is not None:
        pytest.skip("skyrl is installed: the entry point would start training")
    run = subprocess.run(
        [sys.executable, "-m", "rollout_audit.integrations.skyrl", "--audit-dir", "d", "trainer.epochs=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip() == "rollout-audit: skyrl is not installed here (skyrl 0.4.0 needs Python >= 3.12)"
