"""TRL without the guard, a plain `GRPOTrainer` whose `rollout_func` is wrapped in
`RolloutRecorder`, audited afterwards with `check --from trl` over the recorder's file and TRL's own
`log_completions` Parquet. Real trainer steps on the tiny CPU model of test_integration_trl
(nothing downloaded)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

import pyarrow.parquet as pq  # noqa: E402
from adapterhelp import cli  # noqa: E402
from test_integration_trl import _dataset, _model, _tokenizer, rollout  # noqa: E402

from rollout_audit.integrations.trl import RolloutRecorder  # noqa: E402

pytestmark = pytest.mark.slow  # each run trains a model (about 10 s each on 2 cores)

IDENTITY = [
    x
    for kv in ("environment_id=arith", "environment_version=1", "verifier_version=len-mod-3", "reset_seed=0")
    for x in ("--context", kv)
]


def _length_reward(completions, **kwargs):
    """The reply's length in characters: varies within a group even on this untrained model."""
    return [float(len(c[0]["content"])) for c in completions]


def _grpo_run(out: Path, steps: int) -> tuple[Path, Path, RolloutRecorder]:
    """A plain GRPOTrainer, one generation per step, its rollout_func recorded (step 1 injects env_mask 1
    on the tool reply, see test_integration_trl.SCHEDULE); TRL writes its completions Parquet each step."""
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    tok = _tokenizer()
    recorder = RolloutRecorder(rollout, out / "audit")
    args = GRPOConfig(
        output_dir=str(out / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-3,
        temperature=0.7,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=True,
        max_steps=steps,
    )
    trainer = GRPOTrainer(
        model=_model(tok),
        reward_funcs=_length_reward,
        args=args,
        train_dataset=_dataset(4 * steps),
        processing_class=tok,
        rollout_func=recorder,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return out / "audit", out / "out" / "completions", recorder


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory):
    return _grpo_run(tmp_path_factory.mktemp("trl_rec_clean"), 1), _grpo_run(tmp_path_factory.mktemp("trl_rec"), 2)


def _check(*paths: Path, extra: tuple[str, ...] = ()) -> tuple[int, dict]:
    res = cli("check", "--from", "trl", *paths, *IDENTITY, "--format", "json", *extra)
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def test_the_recorder_forwards_the_very_object_it_was_given():
    out = {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[-0.5]]}

    class _Trainer:  # only what the recorder reads when it cannot write: nothing reaches it
        pass

    rec = RolloutRecorder(lambda prompts, trainer: out, "/nonexistent/ro")
    with pytest.warns(UserWarning, match="RolloutRecorder did not record call 0"):
        assert rec(["p"], _Trainer()) is out
    assert rec.missing and rec.calls == 1


def test_a_recorded_compliant_run_audits_clean_with_rewards_and_advantages_recomputed(grpo_runs):
    (log, completions, recorder), _ = grpo_runs
    assert not recorder.missing
    code, rep = _check(log, completions)
    assert (code, [f["code"] for f in rep["findings"]]) == (0, [])
    not_run = {n["code"] for n in rep["not_run"]}
    assert not {"U603", "M101", "M106", "L201"} & not_run  # recomputed from the records, not waived


def test_the_recorded_env_mask_bug_is_m101_on_that_generation_only(grpo_runs):
    _, (log, completions, _) = grpo_runs
    code, rep = _check(log, completions)
    assert code == 1
    codes = {(f["code"], f["trajectory_id"].split("/")[0]) for f in rep["findings"]}
    assert ("M101", "gen00001.1") in codes
    assert all(batch == "gen00001.1" for _, batch in codes)


def test_without_trls_completions_the_rewards_are_said_to_be_missing(grpo_runs):
    (log, _, _), _ = grpo_runs
    _, rep = _check(log)
    reasons = {n["code"]: n["reason"] for n in rep["not_run"]}
    assert "U603" in reasons
    assert any("log_completions" in r for r in reasons.values())


def test_an_advantage_trl_logged_that_its_rewards_do_not_give_is_u603(grpo_runs, tmp_path):
    (log, completions, _), _ = grpo_runs
    src = sorted(completions.glob("*.parquet"))[0]
    table = pq.read_table(src).to_pandas()
    table.loc[0, "advantage"] = table.loc[0, "advantage"] + 1.0
    (tmp_path / "completions").mkdir()
    table.to_parquet(tmp_path / "completions" / src.name)
    code, rep = _check(log, tmp_path / "completions")
    assert code == 1
    assert {(f["code"], f["trajectory_id"]) for f in rep["findings"]} >= {("U603", "gen00000.0/0")}


def test_completions_of_another_run_are_refused_naming_the_file(grpo_runs):
    (log, _, _), (_, other, _) = grpo_runs
    res = cli("check", "--from", "trl", log, sorted(other.glob("*.parquet"))[-1], *IDENTITY)
    assert res.exit_code == 2
    assert "completions_" in res.output
