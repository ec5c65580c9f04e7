"""Recorded engine calls joined to a trainer's rows by their token prefix (`check --from slime DUMP
--calls CAPTURE`): a real recording of `rollout-audit capture` (a loopback vLLM-shaped upstream, the
real `openai` client) meets a slime dump that carries no call ids; the turns take the engine's context,
so M105 runs where slime alone records none; a trainer row whose prefix was re-rendered is M105 at
that turn, never joined in silence; a turn no call sampled is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

from capturehelp import CONTEXT, Reply, client, main, record, upstream  # noqa: F401 (fixtures)
from click.testing import CliRunner

P0 = [1, 31, 3, 22, 23, 24, 2, 3, 1, 30, 3]
A0, A1 = [50, 51, 2], [60, 61, 62, 2]
TOOL = [3, 1, 33, 3, 40, 41, 2, 3, 1, 30, 3]
LPS = {tuple(A0): [-0.5, -0.25, -0.125], tuple(A1): [-0.75, -0.375, -0.0625, -0.03125]}


def _answer(path: str, body: bytes) -> Reply:
    """vLLM's chat answer with return_token_ids: the second request carries the tool's reply."""
    second = "tool" in body.decode()
    prompt, ids = (P0 + A0 + TOOL, A1) if second else (P0, A0)
    content = [{"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []} for i, lp in
               zip(ids, LPS[tuple(ids)])]  # fmt: skip
    choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "logprobs": {"content": content},
              "finish_reason": "stop" if second else "tool_calls", "token_ids": ids}  # fmt: skip
    out = {"id": "c", "object": "chat.completion", "model": "m", "choices": [choice], "prompt_token_ids": prompt}
    return Reply([json.dumps(out).encode()])


def _record(upstream, record) -> Path:  # noqa: F811
    """Two sessions of two calls each through the recorder; the trainer posts no end call."""
    upstream.mode, upstream.reply = "reply", _answer
    rec = record(upstream.url)
    for sid in ("s0", "s1"):
        c = client(rec.url, sid)
        for messages in (
            [{"role": "user", "content": "open"}],
            [{"role": "user", "content": "open"}, {"role": "tool", "content": "tool says"}],
        ):
            c.chat.completions.create(model="m", messages=messages, temperature=1.0, top_p=1.0,
                                      extra_body={"return_token_ids": True, "logprobs": True})  # fmt: skip
    assert rec.idle()
    return rec.recorder.out


def _sample(index: int, prompt: list[int] = P0) -> dict:
    """A slime sample of the two calls as its generate hook keeps them (no call ids, no contexts)."""
    resp = A0 + TOOL + A1
    return {
        "rollout_id": None, "group_index": 0, "index": index, "tokens": prompt + resp,
        "response_length": len(resp), "reward": 1.0, "status": "completed", "remove_sample": False,
        "loss_mask": [1] * len(A0) + [0] * len(TOOL) + [1] * len(A1), "weight_versions": ["5", "5"],
        "rollout_log_probs": LPS[tuple(A0)] + [0.0] * len(TOOL) + LPS[tuple(A1)],
        "metadata": {"engine_calls": [{"response_length": 0, "tokens": list(A0), "weight_version": "5"},
                                      {"response_length": len(A0 + TOOL), "tokens": list(A1), "weight_version": "5"}]},
    }  # fmt: skip


def _check(dump: Path, *more: str):
    ctx = [*CONTEXT, "--context", "temperature=1.0", "--context", "top_p=1.0"]
    res = CliRunner().invoke(main, ["check", "--from", "slime", str(dump), *ctx, "--format", "json", *more])
    return res, (json.loads(res.stdout) if res.stdout.startswith("{") else None)


def _dump(tmp_path: Path, samples: list[dict]) -> Path:
    f = tmp_path / "rollout_dumps.jsonl"
    f.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return f


def test_recorded_calls_join_a_slime_dump_by_prefix_and_m105_runs(tmp_path, upstream, record):  # noqa: F811
    cap = _record(upstream, record)
    dump = _dump(tmp_path, [_sample(0), _sample(1)])
    res, rep = _check(dump)
    assert res.exit_code == 0 and "M105" in {n["code"] for n in rep["not_run"]}, res.output  # slime alone
    res, rep = _check(dump, "--calls", str(cap))
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    assert "M105" in rep["summary"]["checks_run"] and "M105" not in {n["code"] for n in rep["not_run"]}


def test_a_re_rendered_prefix_is_m105_at_that_row_not_joined_in_silence(tmp_path, upstream, record):  # noqa: F811
    cap = _record(upstream, record)
    drifted = [*P0[:4], 29, *P0[5:]]  # the trainer re-tokenized the user's text: one id differs
    res, rep = _check(_dump(tmp_path, [_sample(0), _sample(1, drifted)]), "--calls", str(cap))
    found = {(f["code"], f["trajectory_id"], f["turn"], f["position"]) for f in rep["findings"]}
    assert res.exit_code == 1 and found == {("M105", "1", 0, 11), ("M105", "1", 1, 25)}, res.output
    assert "rollout_dumps.jsonl:2" in rep["findings"][0]["file"] + rep["findings"][0]["message"], rep["findings"][0]


def test_a_turn_no_recorded_call_sampled_is_refused_in_one_line(tmp_path, upstream, record):  # noqa: F811
    cap = _record(upstream, record)
    other = _sample(0)
    other["tokens"][-2] = 63  # the trainer's row holds a token the engine never returned
    other["metadata"]["engine_calls"][1]["tokens"][-2] = 63
    res, _ = _check(_dump(tmp_path, [other]), "--calls", str(cap))
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert "trajectory 0 turn 1 (position 25): no recorded call sampled its 4 policy token(s)" in lines[0], lines
    assert "of 4 recorded calls met no turn" in lines[0], lines


def test_calls_without_a_dump_to_join_are_refused(tmp_path, upstream, record):  # noqa: F811
    cap = _record(upstream, record)
    res = CliRunner().invoke(main, ["check", str(cap), "--calls", str(cap)])
    assert res.exit_code == 2 and "--calls" in res.output and "Traceback" not in res.output, res.output
