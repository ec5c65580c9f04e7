"""Contract 1.3's recorded nucleus and a split's exposed token, through the CLI: L210 on slime's own
record shape (a sampled token outside its recorded nucleus), replay over the recorded support against
a real server on loopback, M111 on an OpenAI-compatible session whose server returned another id than
it sampled (microsoft/agent-lightning#326) while retokenization drift stays the M108 warning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from adapterhelp import IDENTITY, cli, context_args, fixture, missing_field_exits_2, opts

from rollout_audit.adapters import load
from rollout_audit.adapters.base import contract_table, read_dump
from rollout_audit.replay.dist import processed_logprobs


def _check(*args: object) -> tuple[int, dict]:
    res = cli("check", *args, "--format", "json")
    assert res.exit_code in (0, 1), res.output + res.stderr
    return res.exit_code, json.loads(res.stdout)


def _found(rep: dict) -> set[tuple[str, str]]:
    return {(f["code"], f["trajectory_id"]) for f in rep["findings"]}


def _not_run(rep: dict) -> set[str]:
    return {c["code"] for c in rep["not_run"]}


# ---------------------------------------------------------------- L210: the recorded nucleus


def test_slimes_recorded_nucleus_is_read_and_a_record_one_position_late_is_l210():
    code, rep = _check("--from", "slime", fixture("slime", "top_p_nucleus"), *context_args())
    assert code == 0 and rep["findings"] == [], rep["findings"]
    assert "L210" not in _not_run(rep)
    code, rep = _check("--from", "slime", fixture("slime", "top_p_nucleus_shifted"), *context_args())
    assert code == 1 and _found(rep) == {("L210", "2")}, rep["findings"]
    (f,) = rep["findings"]
    assert "outside the nucleus the engine recorded" in f["message"] and f["position"] is not None


def test_slime_adapter_puts_the_prompt_in_front_of_the_nucleus_offsets():
    recs = read_dump(fixture("slime", "top_p_nucleus"))
    rows = load("slime").to_contract(recs, **dict(kv.split("=") for kv in IDENTITY)).to_pylist()
    for rec, row in zip(recs, rows):
        n_prompt = len(rec["tokens"]) - rec["response_length"]
        assert row["nucleus_offsets"] == [0] * n_prompt + rec["rollout_top_p_token_offsets"]
        assert row["nucleus_ids"] == rec["rollout_top_p_token_ids"]
        lo, hi = row["nucleus_offsets"][:-1], row["nucleus_offsets"][1:]
        for tok, a, b, m in zip(row["token_ids"], lo, hi, row["loss_mask"]):
            assert (b > a) == bool(m)  # every sampled token has its span, tool output none
            assert b == a or tok in row["nucleus_ids"][a:b]


def test_without_a_recorded_nucleus_l210_is_not_run_and_nothing_changes():
    code, rep = _check("--from", "slime", fixture("slime", "compliant"), *context_args())
    assert code == 0 and "L210" in _not_run(rep)


@pytest.mark.parametrize(
    ("offsets", "why"),
    [
        (lambda n, k: [0] * n, "entries for"),  # one short
        (lambda n, k: [0] * n + [k + 1], "run from 0 to"),  # ends past the ids
        (lambda n, k: [0, 2, 1] + [k] * (n - 2), "decreasing"),
    ],
)
def test_a_malformed_nucleus_record_is_named_not_read_and_never_a_crash(tmp_path, offsets, why):
    recs = read_dump(fixture("slime", "top_p_nucleus"))
    rows = load("slime").to_contract(recs, **dict(kv.split("=") for kv in IDENTITY)).to_pylist()
    row = rows[0]
    row["nucleus_offsets"] = offsets(len(row["token_ids"]), len(row["nucleus_ids"]))
    out = tmp_path / "log" / "trajectories"
    out.mkdir(parents=True)
    pq.write_table(contract_table(rows, {}), out / "part-0000.parquet")
    code, rep = _check(tmp_path / "log", "--select", "L210")
    assert code == 1 and _found(rep) == {("L210", row["trajectory_id"])}, rep["findings"]
    assert why in rep["findings"][0]["message"] and "not read" in rep["findings"][0]["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rollout_top_p_token_offsets", [0, 1]),  # not one more than the response: cannot be aligned
        ("rollout_top_p_token_offsets", None),  # ids without their offsets
        ("rollout_top_p_token_ids", "x"),
    ],
)
def test_a_slime_nucleus_that_cannot_be_aligned_exits_2_naming_the_field(tmp_path, field, value):
    missing_field_exits_2("slime", "top_p_nucleus", field, tmp_path, value)


# ---------------------------------------------------------------- replay over the recorded support


def test_processed_logprobs_renormalise_over_the_recorded_support_instead_of_top_p():
    z = np.log(np.array([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    support = np.array([[False, True, True, False], [False] * 4])  # row 1 recorded nothing
    out = processed_logprobs(z, np.array([1.0, 1.0]), np.array([0.7, 0.7]), np.array([0, 0]), support=support)
    assert np.allclose(np.exp(out[0]), [0.0, 0.3 / 0.45, 0.15 / 0.45, 0.0])
    assert np.allclose(np.exp(out[1]), [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])  # top-p 0.7 where nothing is recorded


@pytest.mark.slow  # a model served on loopback
def test_replay_scores_each_token_over_its_recorded_nucleus_against_a_real_server(tmp_path):
    """A session sampled on loopback, its log-probs recorded over a nucleus the test chooses (the sampled
    id and the three most likely others, at temperature 0.7): replay through the HTTP replayer
    reproduces them with the nucleus recorded, and L205 fires once the record is dropped (the turn says
    top_p 1: the full vocabulary)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_adapters_openai import _record
    from transformers import AutoModelForCausalLM

    from benchmarks.tinylm import build

    torch.set_num_threads(1)
    model_dir = build(tmp_path / "tinylm", versions=1)["0"]
    dump = tmp_path / "dump" / "sessions.jsonl"
    url = _record(model_dir, "processed_logprobs", dump, sessions=3)
    rows = load("openai").to_contract(read_dump(dump), **dict(kv.split("=") for kv in IDENTITY)).to_pylist()
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for row in rows:
        ids = row["token_ids"]
        with torch.no_grad():
            base = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()
        spans, lps = [], []
        for p, (tok, src) in enumerate(zip(ids, row["token_source"])):
            if src != 2:
                spans.append([])
                lps.append(None)
                continue
            top = [int(i) for i in np.argsort(-base[p - 1]) if int(i) != tok][:3]
            kept = [tok, *top]
            z = base[p - 1][kept] / 0.7
            spans.append(kept)
            lps.append(float(z[0] - np.log(np.exp(z - z.max()).sum()) - z.max()))
        row["behavior_logprobs"] = lps
        row["nucleus_ids"] = [k for s in spans for k in s]
        row["nucleus_offsets"] = [0, *np.cumsum([len(s) for s in spans]).tolist()]
        for t in row["turns"]:
            t["temperature"], t["top_p"], t["logprob"] = 0.7, 1.0, None
    cfg = tmp_path / "audit.toml"
    cfg.write_text(f'replay_endpoints = {{"0" = "{url}"}}\n')

    def replayed(name: str, keep: list[dict], select: str) -> dict:
        out = tmp_path / name / "trajectories"
        out.mkdir(parents=True)
        pq.write_table(contract_table(keep, {}), out / "part-0000.parquet")
        code, rep = _check(tmp_path / name, "--replay", "8", "--config", cfg, "--select", select)
        return rep

    rep = replayed("with", rows, "L205,L210")
    assert rep["findings"] == [] and not {"L205", "L210"} & _not_run(rep), rep
    bare = [{k: v for k, v in r.items() if not k.startswith("nucleus_")} for r in rows]
    rep = replayed("without", bare, "L205")
    assert {f["code"] for f in rep["findings"]} == {"L205"}, rep["findings"]


# ---------------------------------------------------------------- M111: a split exposes a wrong id


def test_a_server_that_returned_another_id_than_it_sampled_is_m111_and_drift_stays_m108():
    code, rep = _check("--from", "openai", fixture("openai", "control_token_replaced"), *opts(IDENTITY))
    assert code == 1 and _found(rep) == {("M111", "episode-0#0"), ("M108", "episode-0#1")}, rep["findings"]
    m111 = next(f for f in rep["findings"] if f["code"] == "M111")
    assert (m111["severity"], m111["position"], m111["turn"]) == ("error", 13, 0)
    assert "trains id 7" in m111["message"] and "recorded for id 2" in m111["message"]
    code, rep = _check("--from", "openai", fixture("openai", "retokenized"), *opts(IDENTITY))
    assert code == 0 and _found(rep) == {("M108", "episode-0#1")}, rep["findings"]
    assert "M111" not in _not_run(rep)  # it ran: the engine sampled the trained id


def test_the_exposed_evidence_comes_from_the_log_prob_entries_never_from_the_mask():
    recs = read_dump(fixture("openai", "control_token_replaced"))
    ctx = dict(kv.split("=") for kv in IDENTITY)
    first = load("openai").to_contract(recs, **ctx).to_pylist()[0]
    assert (first["split_exposed_position"], first["split_exposed_logprob_id"]) == (13, 2)
    for rec in recs:  # a server whose entries name no id: nothing is claimed, M111 is not run
        for e in rec.get("response", {}).get("choices", [{}])[0].get("logprobs", {}).get("content", []):
            e["token"] = "<|im_end|>"
    rows = load("openai").to_contract(recs, **ctx).to_pylist()
    assert all(r.get("split_exposed_logprob_id") is None for r in rows)


def test_m111_needs_a_trained_token_with_a_log_prob_at_the_exposed_position(tmp_path):
    rows = (
        load("openai")
        .to_contract(read_dump(fixture("openai", "control_token_replaced")), **dict(kv.split("=") for kv in IDENTITY))
        .to_pylist()
    )
    rows[0]["loss_mask"][13] = False  # the wrong id is kept out of the loss: nothing trained under it
    out = tmp_path / "log" / "trajectories"
    out.mkdir(parents=True)
    pq.write_table(contract_table(rows, {}), out / "part-0000.parquet")
    code, rep = _check(tmp_path / "log", "--select", "M111")
    assert code == 0 and rep["findings"] == [], rep["findings"]


def test_the_faults_are_caught_through_the_cli(tmp_path: Path):
    for name, code in (("nucleus_shifted_one", "L210"), ("control_token_id_replaced", "M111")):
        dst = tmp_path / name
        res = cli("faults", "apply", name, Path(__file__).resolve().parents[1] / "fixtures" / "compliant", dst)
        assert res.exit_code == 0, res.output + res.stderr
        rc, rep = _check(dst)
        assert rc == 1 and {f["code"] for f in rep["findings"]} == {code}, rep["findings"]
