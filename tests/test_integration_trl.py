"""A real TRL `GRPOTrainer` run through `AuditedGRPOTrainer`: tiny random Qwen2 model, a byte-level
BPE tokenizer trained here, nothing downloaded. Two runs are shared by the tests (module fixtures):
the default transformers-generate path, and a multi-turn `rollout_func` with a tool message
between two assistant turns, into which one real bug per generation is injected at the hook."""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import warnings
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

import rollout_audit as ra
from rollout_audit.contract.schema import CONTRACT_VERSION
from rollout_audit.integrations.trl import AuditedGRPOTrainer, AuditSettings

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL = "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
# TRL records no behaviour log-probs: a log on disk cannot waive that column itself, the user says it
NOT_RECORDED = ["behavior_logprobs"]
CFG = ra.Config(grpo_epsilon=1e-4, not_recorded=NOT_RECORDED)  # TRL's group std: Bessel-corrected, ε = 1e-4
# the bug injected into the rollout_func's output, by optimizer step (one generation per step)
SCHEDULE = {0: "clean", 1: "env_mask_ones", 2: "raw_logprobs", 3: "retokenize"}


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [f"add {i} and {j} equals {i + j}. the tool says 42; user assistant" for i in range(30) for j in range(5)]
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>")
    fast.chat_template = CHATML
    return fast


def _model(tok, stop_every: int | None = None):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(cfg)
    # extra stop ids (as Qwen stops on <|im_end|> and <|endoftext|>) make completion lengths vary
    stops = list(range(3, len(tok), stop_every)) if stop_every else []
    model.generation_config.eos_token_id = [tok.eos_token_id, *stops]
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def _reward(completions, **kwargs):
    """A deterministic reward that varies within a group: length of the reply modulo 3."""
    return [float(len(c[0]["content"]) % 3) for c in completions]


def _args(out: Path, **kw):
    from trl import GRPOConfig

    base = {
        "output_dir": str(out),
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        "learning_rate": 1e-3,
        "temperature": 0.7,
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "save_strategy": "no",
        "logging_steps": 1,
        "seed": 0,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    return GRPOConfig(**{**base, **kw})


def _dataset(n: int):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"add {i} and {i + 1}"}] for i in range(n)]})


def _settings(**kw) -> AuditSettings:
    return AuditSettings(
        environment_id="arith", environment_version="1", verifier_version="len-mod-3", reset_seed=0, **kw
    )


@torch.no_grad()
def _sample(model, ids: list[int], n: int, tok) -> tuple[list[int], list[float], list[float]]:
    """Sample up to n tokens at temperature 0.7: (ids, log-probs under the sampling distribution,
    log-probs of the raw logits, i.e. at temperature 1)."""
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=True,
        temperature=0.7,
        top_k=0,
        top_p=1.0,
        max_new_tokens=n,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    new = out.sequences[0, len(ids) :].tolist()
    proc = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, new)]
    raw = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(out.logits, new)]
    return new, proc, raw


def _retokenized(tok, ids: list[int]) -> list[int]:
    return tok.encode(tok.decode(ids), add_special_tokens=False)


def rollout(prompts, trainer):
    """Two assistant turns with a tool reply between them, sampled from the trainer's model.
    The engine's record of each call (context, sampled ids, turn log-prob) goes out as extra
    fields; SCHEDULE injects one bug per generation."""
    tok, model = trainer.processing_class, trainer.model
    mode = SCHEDULE.get(trainer.state.global_step, "clean")
    tool = tok.encode(TOOL, add_special_tokens=False)
    res: dict[str, list] = {
        k: []
        for k in (
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            "turn_context_ids",
            "turn_sampled_token_ids",
            "turn_logprob",
        )
    }
    for p in prompts:
        prompt = tok.encode(
            tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )
        ids, comp, lps, mask, ctxs, smps, tlps = list(prompt), [], [], [], [], [], []
        for turn in range(2):
            ctxs.append(list(ids))
            s, lp_proc, lp_raw = _sample(model, ids, 4, tok)
            smps.append(s)
            tlps.append(float(sum(lp_proc)))  # the engine scores the turn under what it sampled from
            if mode == "retokenize":  # the loop rebuilds the transcript from text (trl#5224)
                s2 = _retokenized(tok, s)
                comp += s2
                lps += (lp_proc + [0.0] * len(s2))[: len(s2)]
                mask += [1] * len(s2)
            else:
                comp += s
                lps += lp_raw if mode == "raw_logprobs" else lp_proc  # trl#4159: raw logits reported
                mask += [1] * len(s)
            ids += s
            if turn == 0:
                comp += tool
                lps += [0.0] * len(tool)  # TRL's placeholder on tokens the policy did not sample
                mask += [1 if mode == "env_mask_ones" else 0] * len(tool)
                ids += tool
        for k, v in zip(res, (prompt, comp, lps, mask, ctxs, smps, tlps)):
            res[k].append(v)
    return res


def _trainer(out: Path, *, stop_every: int | None = None, n_prompts: int = 8, audit: AuditSettings, **kw):
    """A GRPOTrainer guard on a fresh tiny model and tokenizer; kw go to GRPOConfig except rollout_func."""
    torch.set_num_threads(1)
    tok = _tokenizer()
    rollout_func = kw.pop("rollout_func", None)
    return AuditedGRPOTrainer(
        model=_model(tok, stop_every),
        reward_funcs=_reward,
        args=_args(out, **kw),
        train_dataset=_dataset(n_prompts),
        processing_class=tok,
        rollout_func=rollout_func,
        audit=audit,
    )


def _policy_run(out: Path, **kw):
    """A run whose every completion hits max_completion_length (no stop id but <|im_end|>, two
    tokens of a 320-token vocabulary): the trainer built while recording warnings, then trained."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = _trainer(out / "out", n_prompts=4, audit=_settings(log_dir=out / "log"), max_completion_length=2,
                           max_steps=1, **kw)  # fmt: skip
    stated = [str(w.message) for w in seen if str(w.message).startswith("rollout-audit:")]
    return _train(trainer), out / "log", stated


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory):
    """TRL's defaults: truncated completions trained with the reward they got."""
    return _policy_run(tmp_path_factory.mktemp("trl_capped"))


@pytest.fixture(scope="module")
def masked_run(tmp_path_factory):
    """`mask_truncated_completions=True`: truncated completions out of the loss, rewards in the groups."""
    return _policy_run(tmp_path_factory.mktemp("trl_masked"), mask_truncated_completions=True)


def _train(trainer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return trainer


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """Default path (transformers generate), dapo, steps_per_generation 2: one generation, two updates."""
    tmp = tmp_path_factory.mktemp("trl_default")
    audit = _settings(log_dir=tmp / "log")
    return _train(_trainer(tmp / "out", stop_every=6, audit=audit, steps_per_generation=2, max_steps=2)), tmp / "log"


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory):
    """Multi-turn rollout_func, one generation per step, a different bug at each (policy skip)."""
    tmp = tmp_path_factory.mktemp("trl_tools")
    audit = _settings(log_dir=tmp / "log", on_finding="skip", metrics="all")
    return _train(_trainer(tmp / "out", audit=audit, rollout_func=rollout, max_steps=4)), tmp / "log"


def _report(trainer, label: str) -> ra.Report:
    return dict(trainer.audit_reports)[label]


def test_default_path_l_checks_not_run_with_reason(default_run):
    trainer, _ = default_run
    rep = _report(trainer, "gen00000")
    for code in ("L201", "L203"):
        assert rep.not_run[code].startswith("TRL does not record behaviour log-probs"), rep.not_run[code]
    assert "TRL does not record a per-turn log-prob" in rep.not_run["L202"]
    assert "TRL does not record the engine's token ids" in rep.not_run["M106"]
    assert "S001" not in rep.codes()  # absent columns are declared, not missing


def test_default_path_log_audits_with_window_denominator(default_run):
    _trainer, log = default_run
    ups = pl.read_parquet(log / "updates")
    assert ups["reduction"].to_list() == ["token_window", "token_window"]
    assert ups["trainer_version"].to_list() == [0, 1]  # the second update trains on step-0 samples
    # the user's settings layer over the policy the log came with: TRL's own policy still applies
    rep = ra.audit(log, config=CFG)
    assert not {"U601", "U602", "U603", "U604", "U605", "P503", "S001", "S005"} & rep.codes(), rep.render()
    assert "TRL does not record behaviour log-probs" in rep.not_run["L201"]
    assert rep.codes("error") == set(), rep.render()
    assert 'truncation = "penalize"' in (log / "pyproject.toml").read_text()
    assert ra.audit(log, config=ra.Config(not_recorded=NOT_RECORDED)).codes("error") == set()
    # TRL rewards and trains on length-capped completions: a user who sets truncation = exclude is told
    truncated = pl.read_parquet(log / "trajectories")["truncated"].any()
    strict = ra.audit(log, config=ra.Config(grpo_epsilon=1e-4, truncation="exclude", not_recorded=NOT_RECORDED))
    assert strict.codes("error") == ({"T304", "U606"} if truncated else set()), strict.render()
    assert (
        pq.read_schema(next((log / "trajectories").iterdir())).metadata[b"rollout_log.schema_version"]
        == CONTRACT_VERSION.encode()
    )


def _factor(message: str) -> float:
    return float(re.search(r"recorded/expected = ([0-9.]+)", message).group(1))


def test_dapo_declared_as_per_update_token_is_u601(default_run):
    _, log = default_run
    table = pq.read_table(log / "trajectories" / "gen00000.parquet")  # keeps the not_recorded metadata
    traj = pl.from_arrow(table)
    ups = pl.read_parquet(log / "updates").drop("window_tokens", "denominator_scale")
    trainable = dict(zip(traj["trajectory_id"], traj["loss_mask"].list.sum()))
    own = [sum(trainable[i] for i in ids) for ids in ups["trajectory_ids"]]
    assert len(set(own)) == 2  # the two halves of the generation batch differ in length
    wrong = ups.with_columns(pl.lit("token").alias("reduction"))
    rep = ra.audit(table, wrong.to_arrow(), config=CFG)
    u601 = rep.findings.filter(pl.col("code") == "U601")["message"].to_list()
    assert len(u601) == 2, u601
    for msg, d, n in zip(sorted(u601), ups["loss_denominator"], own):
        assert _factor(msg) == pytest.approx(d / n, abs=1e-3), msg


def test_tool_tokens_are_observation_and_clean_batch_has_no_m101(tool_run):
    trainer, log = tool_run
    rep = _report(trainer, "gen00000")
    assert not {"M101", "M105", "M106", "L201", "L202", "L203"} & rep.codes(), rep.render()
    assert "L202" not in rep.not_run and "M106" not in rep.not_run  # they ran on this batch
    t = pl.read_parquet(log / "trajectories" / "gen00000.parquet")
    tok = trainer.processing_class
    tool = tok.encode(TOOL, add_special_tokens=False)
    for ids, src, mask, lp in t.select("token_ids", "token_source", "loss_mask", "behavior_logprobs").iter_rows():
        obs = [i for i, s in enumerate(src) if s == 3]
        assert [ids[i] for i in obs] == tool
        assert not any(mask[i] for i in obs) and all(lp[i] is None for i in obs)


@pytest.mark.parametrize(
    "label, codes", [("gen00001", {"M101"}), ("gen00002", {"L202"}), ("gen00003", {"M105", "M106"})]
)
def test_injected_bug_caught_by_its_code(tool_run, label, codes):
    trainer, _ = tool_run
    assert codes <= _report(trainer, label).codes("error"), _report(trainer, label).render()


def test_skip_policy_trains_on_nothing_it_flagged(tool_run):
    _trainer, log = tool_run
    t = pl.read_parquet(log / "trajectories" / "gen00001.parquet")  # every row had tool tokens in the loss
    assert not any(any(m) for m in t["loss_mask"].to_list())
    assert "M101" not in ra.audit(log / "trajectories" / "gen00001.parquet", config=CFG).codes()


def test_raise_policy_stops_before_the_first_step(tmp_path):
    def always_bad(prompts, trainer):
        out = rollout(prompts, trainer)
        out["env_mask"] = [[1] * len(m) for m in out["env_mask"]]
        return out

    trainer = _trainer(tmp_path, n_prompts=4, audit=_settings(on_finding="raise"), rollout_func=always_bad, max_steps=1)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(ra.AuditFailed, match="M101"):
        _train(trainer)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_audit_figures_arrive_in_the_trainers_log_history(tool_run):
    trainer, _ = tool_run
    logged = [e for e in trainer.state.log_history if "audit/errors" in e]
    gens = [rep for label, rep in trainer.audit_reports if label.startswith("gen")]
    assert len(logged) == len(gens) == 4  # one generation and one log per optimizer step
    for entry, rep in zip(logged, gens):
        for fam in ("M", "L"):
            errors = int(
                rep.findings.filter((pl.col("severity") == "error") & pl.col("code").str.starts_with(fam)).height
            )
            assert entry[f"audit/errors/{fam}"] == errors, entry
        assert 0 < entry["audit/trainable_share"] <= 1
        assert "audit/update/errors" in entry and "audit/update/policy_lag_max" in entry
    assert logged[0]["audit/errors/M"] == 0 and logged[1]["audit/errors/M"] > 0  # the clean batch, then M101


def test_by_default_a_handful_of_audit_figures_per_step(default_run):
    trainer, _ = default_run
    keys = {k for e in trainer.state.log_history for k in e if k.startswith("audit/")}
    assert keys and len(keys) <= 10 and "audit/errors" in keys and "audit/errors/M" not in keys, sorted(keys)


def _all_reports_clean(trainer) -> None:
    for label, rep in trainer.audit_reports:
        assert rep.codes("error") == set(), f"{label}: {rep.render()}"
        assert not {"T304", "U606", "M102", "U601"} & rep.codes(), f"{label}: {rep.render()}"


def test_defaults_audit_under_the_policy_trl_follows(capped_run):
    trainer, log, stated = capped_run
    assert trainer.audit.config.truncation == "penalize"
    assert stated == [
        "rollout-audit: auditing under the settings TRL follows: truncation = 'penalize' (GRPOConfig."
        "mask_truncated_completions=False, TRL's default: a completion cut at max_completion_length is trained "
        "with the reward it was given)"
    ]
    t = pl.read_parquet(log / "trajectories")
    assert t["truncated"].all() and t["reward"].is_not_null().all() and "loss_excluded" not in t.columns
    _all_reports_clean(trainer)
    assert ra.audit(log, config=ra.Config(not_recorded=NOT_RECORDED)).codes("error") == set()


def test_masked_truncation_audits_as_what_it_is(masked_run):
    trainer, log, stated = masked_run
    assert trainer.audit.config.truncation == "exclude" and len(stated) == 1
    assert "mask_truncated_completions=True" in stated[0] and "keeps its reward in the group statistics" in stated[0]
    t = pl.read_parquet(log / "trajectories")
    # every completion was cut: no token trained, every reward kept for the group statistics
    assert t["truncated"].all() and t["loss_excluded"].all() and t["reward"].is_not_null().all()
    assert not any(any(m) for m in t["loss_mask"].to_list())
    ups = pl.read_parquet(log / "updates")
    assert ups["window_tokens"].to_list() == [0.0] and ups["loss_denominator"].to_list() == [1.0]  # TRL's clamp
    _all_reports_clean(trainer)
    rep = ra.audit(log, config=ra.Config(not_recorded=NOT_RECORDED))
    assert rep.codes("error") == set() and not {"T304", "M102", "U601", "U606"} & rep.codes(), rep.render()


def test_masked_truncation_whose_mask_was_not_applied_is_m109(masked_run):
    """The genuinely broken case: a completion declared out of the loss whose tokens are trained."""
    _, log, _ = masked_run
    table = pq.read_table(log / "trajectories")
    t = table.to_pylist()
    src = t[0]["token_source"]
    t[0]["loss_mask"] = [s == 2 for s in src]
    rep = ra.audit(t, pl.read_parquet(log / "updates").to_dicts(), config=ra.Config(grpo_epsilon=1e-4))
    m109 = rep.findings.filter(pl.col("code") == "M109")
    assert m109["trajectory_id"].to_list() == [t[0]["trajectory_id"]] and "error" in m109["severity"].to_list()
    assert "U601" in rep.codes("error")  # the recorded clamp no longer matches: a token is trainable now


def test_show_on_the_guards_log_marks_what_check_reports(default_run):
    """`show` on the log the guard wrote reads `check`'s audit of it: no S001 for the behaviour
    log-probs TRL does not record (the file declares them not recorded), the same codes as check."""
    from test_show import checked, per_trajectory, shown_codes

    _, log = default_run
    doc, code = checked(log)
    per = per_trajectory(doc)
    assert code in (0, 1) and not any("S001" in codes for codes in per.values())
    ids = pl.read_parquet(log / "trajectories", columns=["trajectory_id"])["trajectory_id"].to_list()
    for tid in ids[:2]:
        assert shown_codes(log, tid) == per.get(tid, set())


# ---------------------------------------------------------------- L207 on TRL's own old_per_token_logps


def _nucleus_rollout(top_p: float):
    """A single-turn rollout_func sampling from the trainer's model at its temperature with a nucleus
    of `top_p`, returning the log-probs of the distribution it sampled from (renormalised over the
    nucleus, as vLLM's processed log-probs are): the engine's side of TRL's importance ratio."""

    def rollout_func(prompts, trainer):
        tok, model = trainer.processing_class, trainer.model
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for p in prompts:
            ids = tok.encode(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False),
                             add_special_tokens=False)  # fmt: skip
            # eval mode, as TRL's own generation: with gradient checkpointing a training-mode generate
            # drops its KV cache and samples every token after the first without its context
            was_training = model.training
            model.eval()
            with torch.no_grad():
                gen = model.generate(
                    torch.tensor([ids]),
                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    do_sample=True,
                    temperature=trainer.temperature,
                    top_k=0,
                    top_p=top_p,
                    max_new_tokens=6,
                    output_scores=True,
                    return_dict_in_generate=True,
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                )
            model.train(was_training)
            new = gen.sequences[0, len(ids) :].tolist()
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(new)
            out["logprobs"].append([torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(gen.scores, new)])
        return out

    return rollout_func


def _nucleus_run(tmp: Path, top_p: float):
    """steps_per_generation 2 over one accumulation step: TRL recomputes old_per_token_logps (the
    samples may be one step stale), so the guard compares them with the engine's log-probs (L207)."""
    audit = _settings(log_dir=tmp / "log")
    trainer = _trainer(tmp / "out", n_prompts=4, audit=audit, rollout_func=_nucleus_rollout(top_p), top_p=top_p,
                       steps_per_generation=2, max_steps=1)  # fmt: skip
    return _train(trainer), tmp / "log"


@pytest.fixture(scope="module")
def nucleus_runs(tmp_path_factory):
    return {p: _nucleus_run(tmp_path_factory.mktemp(f"trl_top_p_{p}"), p) for p in (0.3, 1.0)}


def test_trainer_logprobs_travel_as_a_second_column(nucleus_runs):
    trainer, log = nucleus_runs[0.3]
    assert trainer.audit.config.compare_logprobs == "old_per_token_logps"
    assert 'compare_logprobs = "old_per_token_logps"' in (log / "pyproject.toml").read_text()
    t = pl.read_parquet(log / "trajectories")
    for src, beh, old in t.select("token_source", "behavior_logprobs", "old_per_token_logps").iter_rows():
        assert [s == 2 for s in src] == [x is not None for x in old] == [x is not None for x in beh]


def test_l207_fires_on_trls_top_p_importance_sampling_bias(nucleus_runs):
    """The engine's log-probs are over the nucleus, the trainer's over the whole tempered vocabulary:
    every sampled token's ratio π_old/π_beh is the nucleus mass (≤ top_p + one token's share), so a
    turn of k tokens is off by about k·ln(top_p). L207 names it in the guard and in `check` of the log."""
    trainer, log = nucleus_runs[0.3]
    rep = _report(trainer, "gen00000")
    assert "L207" not in rep.not_run, rep.not_run.get("L207")
    l207 = rep.findings.filter(pl.col("code") == "L207")
    n = pl.read_parquet(log / "trajectories").height
    assert l207.height == n and set(l207["severity"]) == {"warning"}, rep.render()
    assert all("π_old_per_token_logps/π_beh" in m for m in l207["message"])
    from adapterhelp import cli

    res = cli("check", log, "--format", "json")
    assert res.exit_code == 0, res.output  # warnings only: the log is otherwise clean
    doc = json.loads(res.output)
    assert {f["trajectory_id"] for f in doc["findings"] if f["code"] == "L207"} == set(
        pl.read_parquet(log / "trajectories")["trajectory_id"]
    )


def test_l207_silent_when_engine_and_trainer_share_the_distribution(nucleus_runs):
    trainer, _ = nucleus_runs[1.0]
    rep = _report(trainer, "gen00000")
    assert "L207" not in rep.not_run and "L207" not in rep.codes(), rep.render()
