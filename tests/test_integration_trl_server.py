"""TRL's server mode, recorded at the wire and joined to TRL's rows by token prefix (`check --from trl
DUMP --calls CAPTURE`).

In server mode (`vllm_mode="server"`) TRL's `VLLMClient.generate` posts a whole generation batch in one
request: the unique prompts as token ids with `n` = num_generations, and reads back one choice per sample,
prompt-major (trl 1.16.0 generation/vllm_client.py:446-463, called from generation/vllm_generation.py:600-650);
the rows TRL trains keep its own prompt ids (grpo_trainer.py:1775-1782 discards the returned ones) and none
of the call's ids. The only key from a call to a row is the token prefix.

What is real here: TRL's `VLLMClient` (its constructor's health and model calls, `generate`'s request and
its parsing of the answer), a real `GRPOTrainer` training the tiny CPU model of test_integration_trl,
`rollout-audit capture` between them, and an engine that samples from the trainer's own model on
loopback, speaking the vLLM endpoints the client calls (`/health`, `/v1/models`, `/v1/completions` with
`return_token_ids` and `token_id:N` log-prob entries). What is not: vLLM itself, a CUDA engine that does
not install on this machine. TRL's `VLLMGeneration` needs it importable (vllm_generation.py:295) and opens
an NCCL weight-transfer group to it (:306-307), so the rollout function below does the three steps of its
server path itself: the unique prompts (`[::num_generations]`, :603), one `generate` with `n` (:630), each
prompt's ids repeated per sample (:648); and `VLLMClient`'s own check that vLLM is importable (vllm_client.py:
211), which guards nothing on the HTTP path, is answered yes. The engine shares the trainer's weights, as a
server synced every step does."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from adapterhelp import cli  # noqa: E402
from capturehelp import record  # noqa: E402, F401 (fixture)
from test_integration_trl import _dataset, _model, _tokenizer  # noqa: E402
from tinyserver import serve_model  # noqa: E402

from rollout_audit.integrations.trl import RolloutRecorder  # noqa: E402

pytestmark = pytest.mark.slow  # a real trainer and two servers (about 15 s on 2 cores)

IDENTITY = [
    x
    for kv in ("environment_id=arith", "environment_version=1", "verifier_version=len-mod-3", "reset_seed=0")
    for x in ("--context", kv)
]
GENERATIONS = 4
RERENDERED_STEP = 1  # the generation whose rows keep a prompt rendered apart from the one the engine was sent


def _length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


def _server_rollout(client, rerender_at: int | None):
    """TRL's server path as a rollout function: one `generate` of the unique prompts with n samples each.
    At generation `rerender_at` the rows keep the prompt rendered again with a system turn the engine
    never saw (the trainer's prefix is not the call's: M105 names it)."""

    def rollout(prompts, trainer):
        tok, n = trainer.processing_class, trainer.num_generations

        def render(p):
            return tok.encode(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False),
                              add_special_tokens=False)  # fmt: skip

        ids = [render(p) for p in prompts]
        out = client.generate(
            prompts=ids[::n], n=n, temperature=trainer.temperature, top_p=trainer.top_p,
            max_tokens=trainer.max_completion_length, logprobs=0,
        )  # fmt: skip
        kept = ids
        if trainer.state.global_step == rerender_at:
            kept = [render([{"role": "system", "content": "add"}, *p]) for p in prompts]
        return {
            "prompt_ids": kept,
            "completion_ids": out["completion_ids"],
            "logprobs": [[lp[0] for lp in seq] for seq in out["logprobs"]],
        }

    return rollout


def _run(out: Path, record, monkeypatch, steps: int, rerender_at: int | None = None):  # noqa: F811
    from trl import GRPOConfig, GRPOTrainer
    from trl.generation import vllm_client

    torch.set_num_threads(1)
    tok = _tokenizer()
    model = _model(tok)
    # the engine stops on eos and pad, as vLLM does on Qwen2.5-Instruct (its generation_config lists both)
    engine, base = serve_model(model, "processed_logprobs", {tok.eos_token_id, tok.pad_token_id})
    try:
        rec = record(base.removesuffix("/v1"))
        monkeypatch.setattr(vllm_client, "is_vllm_available", lambda *a, **k: True)
        client = vllm_client.VLLMClient(base_url=f"{rec.url}/sessions/trl")
        recorder = RolloutRecorder(_server_rollout(client, rerender_at), out / "audit")
        args = GRPOConfig(
            output_dir=str(out / "out"), per_device_train_batch_size=4, num_generations=GENERATIONS,
            max_completion_length=8, learning_rate=1e-3, temperature=0.7, report_to="none", use_cpu=True,
            bf16=False, save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True,
            dataloader_num_workers=0, log_completions=True, max_steps=steps,
        )  # fmt: skip
        trainer = GRPOTrainer(model=model, reward_funcs=_length_reward, args=args, train_dataset=_dataset(4 * steps),
                              processing_class=tok, rollout_func=recorder)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
        assert rec.idle()
        return out / "audit", out / "out" / "completions", rec.recorder.out
    finally:
        engine.shutdown()
        engine.server_close()


def _check(*paths: Path, calls: Path | None = None) -> tuple[int, dict, str]:
    extra = ("--calls", str(calls)) if calls else ()
    res = cli("check", "--from", "trl", *paths, *extra, *IDENTITY, "--format", "json")
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout), res.output


def _exchanges(capture: Path) -> list[dict]:
    lines = [json.loads(x) for f in sorted(capture.glob("*.jsonl")) for x in f.read_text().splitlines()]
    return [x for x in lines if x.get("kind") == "exchange" and x.get("endpoint") == "completions"]


def test_server_mode_calls_join_trls_rows_and_m105_runs_on_the_engines_context(tmp_path, record, monkeypatch):  # noqa: F811
    audit, completions, capture = _run(tmp_path, record, monkeypatch, steps=2)
    calls = _exchanges(capture)
    assert len(calls) == 2  # one request per generation batch, every sample of it inside
    body = json.loads(calls[0]["request_body"]["text"])
    assert body["n"] == GENERATIONS and len(body["prompt"]) == 1 and body["return_token_ids"] is True
    # alone, TRL's rows hold no engine context, sampled ids or finish reason: M105, M106, T305 are not run
    engine = {"M105", "M106", "T305"}
    code, rep, out = _check(audit, completions)
    assert code == 0 and not rep["findings"], out
    assert engine <= {n["code"] for n in rep["not_run"]}, rep["not_run"]
    # joined, each of the 8 samples met its row by prefix and its turn took the engine's record
    code, joined, out = _check(audit, completions, calls=capture)
    assert code == 0 and not joined["findings"], out
    assert joined["summary"]["rows_read"] == rep["summary"]["rows_read"] == 2 * GENERATIONS
    assert engine <= set(joined["summary"]["checks_run"]), joined["summary"]


def test_a_row_whose_prompt_is_not_the_one_the_engine_was_sent_is_m105_there(tmp_path, record, monkeypatch):  # noqa: F811
    audit, completions, capture = _run(tmp_path, record, monkeypatch, steps=2, rerender_at=RERENDERED_STEP)
    code, rep, out = _check(audit, completions, calls=capture)
    found = [f for f in rep["findings"] if f["code"] == "M105"]
    assert code == 1 and found and {f["code"] for f in rep["findings"]} == {"M105"}, out
    # exactly the rows of the re-rendered generation, each at its one turn
    records = [json.loads(x) for f in sorted(audit.glob("*.jsonl")) for x in f.read_text().splitlines()]
    steps = {r["trajectory_id"]: r["global_step"] for r in records if "trajectory_id" in r}
    assert {steps.get(f["trajectory_id"], RERENDERED_STEP) for f in found} == {RERENDERED_STEP}, found
    assert len({f["trajectory_id"] for f in found}) == GENERATIONS
