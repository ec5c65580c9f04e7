"""The slime integration (`rollout_audit.integrations.slime`) against stand-ins, not slime: slime is
not on the package index. The stand-ins are built from slime 624b824's shapes (cited in the
integration's docstring): a `Sample` with `to_dict()` and `append_response_tokens` as
`slime/utils/types.py` has them, generate functions with slime's `(args, sample, sampling_params)`
signature, and the train data and actor records slime hands its converter and postprocess hooks.
They replay the committed slime fixtures, so the dump the functions write must audit as the fixture
does, through the CLI. `test_slime_source_shapes` reads the options and the converter's state from a
slime checkout when `ROLLOUT_AUDIT_SLIME_SRC` names one."""

from __future__ import annotations

import ast
import asyncio
import copy
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from adapterhelp import cli, context_args, fixture

from rollout_audit.adapters.base import UNRECORDED, read_dump
from rollout_audit.integrations import slime as integ

ARGS = SimpleNamespace(advantage_estimator="grpo", kl_coef=0.0, gamma=1.0)
_REPLAY: dict[int, dict] = {}  # index -> the fixture record the stand-in generate replays


@dataclass
class Sample:
    """slime's Sample (types.py:93-146), the fields the integration reads."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    tokens: list = field(default_factory=list)
    response_length: int = 0
    reward: object = None
    loss_mask: list | None = None
    weight_versions: list = field(default_factory=list)
    rollout_log_probs: list | None = None
    rollout_top_p_token_ids: list | None = None
    rollout_top_p_token_offsets: list | None = None
    rollout_routed_experts: list | None = None
    remove_sample: bool = False
    status: str = "pending"
    metadata: dict = field(default_factory=dict)

    def to_dict(self):
        return dict(self.__dict__)

    def append_response_tokens(self, tokens, version=None):
        self.tokens += tokens
        self.response_length += len(tokens)
        if version is not None:  # a call that finished: types.py:397-398
            self.weight_versions.append(version)


async def replay_generate(args, sample, sampling_params):
    """A multi-turn generate of one's own: each engine call recorded with `engine_call` right before
    its append, the tool tokens between calls appended untrained; the mask is the fixture's."""
    want = _REPLAY[sample.index]
    resp = want["tokens"][len(want["tokens"]) - want["response_length"] :]
    for call in want["metadata"]["engine_calls"]:
        sample.append_response_tokens(resp[sample.response_length : call["response_length"]])
        integ.engine_call(sample, call["tokens"], {"weight_version": call["weight_version"]})
        sample.append_response_tokens(call["tokens"], call["weight_version"])
    sample.append_response_tokens(resp[sample.response_length :])
    finish(sample, want)
    return sample


async def unrecorded_generate(args, sample, sampling_params):
    """A generate of one's own that records no engine call."""
    want = _REPLAY[sample.index]
    sample.append_response_tokens(want["tokens"][len(sample.tokens) :], "5")
    finish(sample, want)
    return sample


async def single_call_generate(args, sample, sampling_params):
    """slime's own generate's effect (sglang_rollout.py:152-221): one call, its ids appended."""
    sample.append_response_tokens([7, 8, 9], "3")
    sample.loss_mask, sample.rollout_log_probs, sample.status = [1, 1, 1], [-0.1, -0.2, -0.3], "completed"
    return sample


def finish(sample, want):
    for k in ("loss_mask", "rollout_log_probs", "status", "reward", "remove_sample"):
        setattr(sample, k, copy.deepcopy(want[k]))
    for k in ("rollout_top_p_token_ids", "rollout_top_p_token_offsets"):
        setattr(sample, k, copy.deepcopy(want.get(k)))


def rollout(tmp_path, monkeypatch, case, generate="replay_generate"):
    """Every fixture sample through `generate`, the sample hook and the log function; the trainer
    records through `convert` (the fixture's train data as the converter's) and `postprocess`."""
    monkeypatch.setenv(integ.ENV_DIR, str(tmp_path / "dump"))
    monkeypatch.setenv(integ.ENV_GENERATE, f"{__name__}.{generate}")
    recs = read_dump(fixture("slime", case))
    samples = []
    for want in (r for r in recs if "sample_indices" not in r):
        _REPLAY[want["index"]] = want
        n_prompt = len(want["tokens"]) - want["response_length"]
        s = Sample(want["group_index"], want["index"], want["rollout_id"], list(want["tokens"][:n_prompt]))
        s = asyncio.run(integ.generate(ARGS, s, {}))
        assert integ.sample_hook(ARGS, s, rollout_id=5, evaluation=False) is None
        assert s.metadata == {}  # the evidence is kept beside the sample, not in it
        samples.append(s)
    assert integ.log_rollout(5, ARGS, samples, {}, 1.0) is False
    for train in (r for r in recs if "rollout_mask_sums" in r):
        monkeypatch.setattr(integ, "default_converter", lambda args, s, t=train: {k: t[k] for k in integ.TRAIN_KEYS})
        args = SimpleNamespace(**train["args"])
        assert integ.convert(args, samples)["sample_indices"] == train["sample_indices"]
    for actor in (r for r in recs if "kl" in r):
        integ.postprocess(SimpleNamespace(**actor["args"]), 5, {k: actor[k] for k in integ.ACTOR_KEYS})
    return recs, [r for p in sorted((tmp_path / "dump").iterdir()) for r in read_dump(p)]


def _check(path):
    res = cli("check", "--from", "slime", path, *context_args(), "--format", "json")
    rep = json.loads(res.stdout)
    rep["not_run"] = {n["code"]: n["reason"] for n in rep["not_run"]}
    return res, rep


@pytest.mark.parametrize("case", ["compliant", "removed_sample", "top_p_nucleus", "reinforce_plus_plus"])
def test_the_dump_holds_the_fixture_and_audits_clean(tmp_path, monkeypatch, case):
    recs, dumped = rollout(tmp_path, monkeypatch, case)
    samples = [r for r in dumped if "sample_indices" not in r]
    for got, want in zip(samples, (r for r in recs if "sample_indices" not in r), strict=True):
        assert {k: got[k] for k in want} == want
    res, rep = _check(tmp_path / "dump")
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    assert ("L210" in rep["not_run"]) == (case != "top_p_nucleus")  # the nucleus keys are dumped
    assert ("U601" in rep["not_run"]) == (case != "removed_sample")  # the train data record
    assert ("R413" in rep["not_run"]) == (case != "reinforce_plus_plus")  # the actor record


@pytest.mark.parametrize(
    ("case", "code"), [("top_p_nucleus_shifted", "L210"), ("removed_sample_in_denominator", "U601")]
)
def test_a_fault_in_either_half_is_flagged(tmp_path, monkeypatch, case, code):
    _, _ = rollout(tmp_path, monkeypatch, case)
    res, rep = _check(tmp_path / "dump")
    assert res.exit_code == 1 and code in {f["code"] for f in rep["findings"]}, res.output


def test_slimes_own_generate_is_recorded_as_one_call(tmp_path, monkeypatch):
    monkeypatch.setattr(integ, "SLIME_GENERATE", f"{__name__}.single_call_generate")
    monkeypatch.delenv(integ.ENV_GENERATE, raising=False)
    s = asyncio.run(integ.generate(ARGS, Sample(index=0, group_index=0, tokens=[1, 2]), {}))
    assert s.tokens == [1, 2, 7, 8, 9] and s.metadata == {}  # the sample is slime's, unchanged
    rec = integ.sample_record(s)
    assert rec["metadata"]["engine_calls"] == [{"response_length": 0, "tokens": [7, 8, 9], "weight_version": "3"}]
    assert UNRECORDED not in rec and s.metadata == {}


def test_a_generate_that_records_no_call_is_declared_not_recorded(tmp_path, monkeypatch):
    _, dumped = rollout(tmp_path, monkeypatch, "compliant", generate="unrecorded_generate")
    assert all("engine_calls" not in r["metadata"] for r in dumped)
    res, rep = _check(tmp_path / "dump")
    assert res.exit_code == 0, res.output
    assert "recorded no engine_call" in rep["not_run"]["M101"]


def test_the_users_log_function_is_called_and_answers(tmp_path, monkeypatch):
    monkeypatch.setenv(integ.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(integ.ENV_LOG, f"{__name__}.my_log")
    s = Sample(index=0, group_index=0, tokens=[1], status="completed")
    assert integ.log_rollout(3, ARGS, [s], {}, 1.0) is True and CALLED == [3]
    assert read_dump(tmp_path / "slime-3.jsonl")[0][UNRECORDED]["token_source"].startswith("the sample went through")


CALLED: list[int] = []


def my_log(rollout_id, args, samples, extra, time):
    CALLED.append(rollout_id)
    return True


def test_without_the_directory_it_says_which_variable(monkeypatch):
    monkeypatch.delenv(integ.ENV_DIR, raising=False)
    with pytest.raises(RuntimeError, match="ROLLOUT_AUDIT_DIR"):
        integ.log_rollout(1, ARGS, [Sample(index=0)], {}, 1.0)


def test_slime_source_shapes():
    """Drift: slime's options the integration is named by, the manager state the default converter
    reads, and the Sample fields it dumps are in the slime checkout ROLLOUT_AUDIT_SLIME_SRC names."""
    src = os.environ.get("ROLLOUT_AUDIT_SLIME_SRC")
    if not src:
        pytest.skip("ROLLOUT_AUDIT_SLIME_SRC names no slime checkout (slime is not on the package index)")
    args = (Path(src) / "slime/utils/arguments.py").read_text()
    assert [o for o in integ.RELIES["slime/utils/arguments.py"] if f'"{o}"' not in args] == []
    tree = ast.parse((Path(src) / "slime/ray/rollout.py").read_text())
    for name, wanted in integ.RELIES["slime/ray/rollout.py"].items():
        cls, method = name.split(".")
        fn = next(
            f
            for c in tree.body
            if isinstance(c, ast.ClassDef) and c.name == cls
            for f in c.body
            if isinstance(f, ast.FunctionDef) and f.name == method
        )
        used = {a.attr for a in ast.walk(fn) if isinstance(a, ast.Attribute) and getattr(a.value, "id", None) == "self"}
        assert used == wanted, name
    types = ast.parse((Path(src) / "slime/utils/types.py").read_text())
    sample = next(c for c in types.body if isinstance(c, ast.ClassDef) and c.name == "Sample")
    have = {i.target.id for i in sample.body if isinstance(i, ast.AnnAssign)}
    assert integ.RELIES["slime/utils/types.py"]["Sample"] - have == set()


PAGE = Path(__file__).resolve().parents[1] / "docs" / "frameworks" / "slime.md"


def _blocks(section: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", section, flags=re.M | re.S)


def test_the_page_sets_exactly_the_options_and_variables_the_code_has():
    """The page's "Set these options" command names each option the integration is named by, with
    its function, and the code has no option or variable the page does not name."""
    text = PAGE.read_text()
    section = text.split("## Set these options", 1)[1].split("\n## ", 1)[0]
    command = next(b for b in _blocks(section) if "rollout_audit.integrations.slime" in b)
    pairs = dict(re.findall(r"(--[a-z-]+) rollout_audit\.integrations\.slime\.(\w+)", command))
    assert pairs == integ.OPTIONS
    assert all(callable(getattr(integ, fn)) for fn in pairs.values())
    named = set(re.findall(r"ROLLOUT_AUDIT_[A-Z_]+", section)) - {"ROLLOUT_AUDIT_SLIME_SRC"}  # the drift test's
    code = {v for k, v in vars(integ).items() if k.startswith("ENV_")}
    assert named == code
    assert f"{integ.ENV_DIR}=" in command
    keys = re.search(r"keys = \((.*?)\)", text, flags=re.S)
    assert keys and tuple(re.findall(r'"(\w+)"', keys.group(1))) == integ.SAMPLE_KEYS


MANAGER = '''
import ray


@ray.remote
class RolloutManager:
    """slime's manager in the shape the default converter relies on (slime/ray/rollout.py:366-395,
    :608-645): a Ray actor class whose conversion reads args, the custom functions and
    _post_process_rewards."""

    def _post_process_rewards(self, samples):
        if self.custom_reward_post_process_func is not None:
            return self.custom_reward_post_process_func(self.args, samples)
        raw = [s.reward for s in samples]
        return raw, [r - sum(raw) / len(raw) for r in raw]

    def _convert_samples_to_train_data(self, samples):
        if self.custom_convert_samples_to_train_data_func is not None:
            return self.custom_convert_samples_to_train_data_func(self.args, samples)
        raw, rewards = self._post_process_rewards(samples)
        masks = [[0] * s.response_length if s.remove_sample else s.loss_mask for s in samples]
        ids = [s.index for s in samples]
        return {
            "sample_indices": ids, "rollout_ids": ids, "rollout_mask_sums": [sum(m) for m in masks],
            "rewards": rewards, "raw_reward": raw, "loss_masks": masks,
        }
'''


def test_convert_runs_slimes_own_converter_of_the_ray_actor_class(tmp_path, monkeypatch):
    """The default converter is the manager's, taken from under `@ray.remote`, on the state it reads;
    its train data is returned unchanged and written as the train data record."""
    pytest.importorskip("ray")
    pkg = tmp_path / "pkg" / "slime" / "ray"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "rollout.py").write_text(MANAGER)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    for name in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setenv(integ.ENV_DIR, str(tmp_path / "dump"))
    monkeypatch.delenv(integ.ENV_CONVERT, raising=False)
    samples = [
        Sample(0, 0, None, [1, 2, 3], 2, 1.0, [1, 1]),
        Sample(0, 1, None, [1, 2, 4], 2, 0.0, [1, 1], remove_sample=True),
    ]
    args = SimpleNamespace(custom_reward_post_process_path=None, **dict.fromkeys(integ.TRAIN_ARGS))
    data = integ.convert(args, samples)
    assert data["rewards"] == [0.5, -0.5] and data["loss_masks"] == [[1, 1], [0, 0]]
    (rec,) = [r for p in (tmp_path / "dump").iterdir() for r in read_dump(p)]
    assert {k: rec[k] for k in integ.TRAIN_KEYS} == data and set(rec["args"]) == set(integ.TRAIN_ARGS)
