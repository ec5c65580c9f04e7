"""verifiers adapter: `RolloutOutput` rows with their trajectory audit clean with the not-run list
docs/frameworks/verifiers.md predicts; a stored prompt missing the assistant header the server rendered
(PrimeIntellect-ai/verifiers#476) is M105 on the trajectory's second turn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from adapterhelp import (
    IDENTITY,
    cli,
    documented_not_run,
    fails_naming,
    finding_keys,
    fixture,
    records,
    report,
    same_after_convert,
    without,
)

import rollout_audit as ra
from rollout_audit.contract.config import Config

CONTEXT = [*IDENTITY, "policy_version=3"]


def test_compliant_audits_clean_with_the_documented_not_run_list() -> None:
    rep = report([fixture("verifiers", "compliant")], "verifiers", CONTEXT)
    assert rep["findings"] == []
    assert {n["code"] for n in rep["not_run"]} == documented_not_run("verifiers")


def test_v1_trace_audits_clean_without_an_engine_context() -> None:
    rep = report([fixture("verifiers", "v1_compliant")], "verifiers", CONTEXT)
    assert rep["findings"] == []
    assert {n["code"] for n in rep["not_run"]} == documented_not_run("verifiers") | {"M105"}


def test_missing_assistant_header_is_m105_on_the_turn() -> None:
    rep = report([fixture("verifiers", "assistant_header_missing")], "verifiers", CONTEXT)
    assert finding_keys(rep) == [("M105", "rollout-1", 1)]


def test_convert_then_check_equals_check_from(tmp_path: Path) -> None:
    same_after_convert("verifiers", "assistant_header_missing", CONTEXT, tmp_path)


def test_missing_field_exits_2_naming_it(tmp_path: Path) -> None:
    recs = records("verifiers", "compliant")
    fails_naming(
        "verifiers",
        [without(recs[0], ["trajectory", 1, "tokens", "completion_logprobs"])],
        "completion_logprobs",
        tmp_path,
    )


# ---------------------------------------------------------------- v1 stop conditions and context


def test_every_stop_condition_maps_to_a_known_flag_and_reason() -> None:
    """user_closed, empty_action, limits (truncations), a stage timeout and boundary errors: no T301/T302."""
    rep = report([fixture("verifiers", "v1_stop_conditions")], "verifiers", CONTEXT)
    assert rep["findings"] == []
    from rollout_audit.adapters.base import read_dump
    from rollout_audit.adapters.verifiers import to_contract

    rows = {
        r["trajectory_id"]: r for r in to_contract(read_dump(fixture("verifiers", "v1_stop_conditions"))).to_pylist()
    }
    got = {
        tid[6:]: (next(f for f in ("terminated", "truncated", "infra_error") if r[f]), r["stop_reason"])
        for tid, r in rows.items()
    }
    assert got == {
        "user_closed": ("terminated", "end_of_sequence"),
        "empty_action": ("terminated", "end_of_sequence"),
        "max_output_tokens": ("truncated", "max_tokens"),
        "context_length": ("truncated", "max_tokens"),
        "compaction_failed": ("truncated", "max_tokens"),
        "agent_timeout": ("truncated", "timeout"),
        "provider_error": ("infra_error", "engine_error"),
        "toolset_error": ("infra_error", "tool_error"),
    }


def test_scored_truncation_is_t304() -> None:
    """verifiers calls context_length (a60a606) and max_output_tokens truncations: scoring them as a
    failure (reward 0.0) is T304 under the default truncation policy."""
    rep = report([fixture("verifiers", "v1_truncation_scored")], "verifiers", CONTEXT)
    assert finding_keys(rep) == [("T304", "trace-context_length", None), ("T304", "trace-max_output_tokens", None)]


def test_unknown_context_key_or_bad_value_exits_2_naming_it() -> None:
    src = fixture("verifiers", "v1_compliant")
    for kv, says in (
        ("temperature=hot", "temperature"),
        ("policy_version=new", "policy_version"),
        ("temprature=1", "'temprature'"),
    ):
        res = cli("check", "--from", "verifiers", src, "--context", kv)
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and says in lines[0], (kv, res.stderr)


# ---------------------------------------------------------------- verifiers' own classes, dumped with the hook

CONDITIONS = ("agent_completed", "user_closed", "empty_action", "max_turns", "max_input_tokens", "max_output_tokens",
              "max_total_tokens", "compaction_failed", "agent_timeout", "provider_error", "sandbox_error", "error")  # fmt: skip


def _trace(vf_trace, vf_graph, vf_types, n: int, reward: float | None):
    """A verifiers 0.4.0 `Trace`: system, user, a sampled assistant turn that calls a tool, the tool's
    reply, a sampled answer; each sampled node's generation prompt unmasked, its completion masked."""
    tr = vf_trace.Trace(
        task=vf_trace.TraceTask(type="DoorTask", data={}, key="door-3"), agent=vf_trace.AgentInfo(config={})
    )
    header = [1, 30, 3]
    nodes = [
        (None, vf_types.SystemMessage(content="you are an agent"), [1, 32, 3, 20, 21, 2, 3], None),
        (0, vf_types.UserMessage(content="which door?"), [1, 31, 3, 22, 23, 2, 3], None),
        (1, vf_types.AssistantMessage(content="open"), [*header, 50 + n, 51, 2], [-0.5, -0.25, -0.125]),
        (2, vf_types.ToolMessage(tool_call_id="c0", content="stuck"), [3, 1, 33, 3, 40, 41, 2, 3], None),
        (3, vf_types.AssistantMessage(content="red"), [*header, 60 + n, 61, 2], [-0.75, -0.375, -0.0625]),
    ]
    for parent, message, ids, lps in nodes:
        mask = [False] * len(header) + [True] * (len(ids) - len(header)) if lps else [False] * len(ids)
        tr.nodes.append(vf_graph.MessageNode(parent=parent, message=message, sampled=lps is not None, token_ids=ids,
                                             mask=mask, logprobs=lps or []))  # fmt: skip
    for node, finish in ((2, "tool_calls"), (4, "stop")):
        sampling = vf_types.SamplingConfig(temperature=0.7, top_p=1.0, max_tokens=64)
        tr.calls.append(vf_trace.ModelCall(node=node, model="policy", sampling=sampling, finish_reason=finish))
    if reward is not None:
        tr.rewards["correct"] = vf_trace.Reward(score=reward)
    return tr


def test_verifiers_traces_through_the_hook_audit_clean(tmp_path: Path) -> None:
    """Traces built with verifiers 0.4.0's own classes and stopped through its own methods (Trace.stop,
    record_timeout, record_error), dumped with `trace.to_record()` (the documented hook) and audited:
    no error, and every condition verifiers itself calls truncated (Trace.is_truncated) is truncated."""
    pytest.importorskip("verifiers.v1")
    from verifiers.v1 import graph, trace, types
    from verifiers.v1.errors import ProviderError, SandboxError

    from rollout_audit.adapters.verifiers import to_contract

    traces = []
    for n, cond in enumerate(CONDITIONS):
        truncating = cond.startswith("max_") or cond in ("compaction_failed", "agent_timeout")
        tr = _trace(trace, graph, types, n, None if truncating or cond.endswith("error") else float(n % 2))
        tr.ok = True  # a rollout that ran to its end; record_error clears it
        if cond == "agent_timeout":
            tr.record_timeout("agent")
        elif cond == "provider_error":
            tr.record_error(ProviderError("prompt too long"))
        elif cond == "sandbox_error":
            tr.record_error(SandboxError("sandbox lost"))
        elif cond == "error":
            tr.record_error(RuntimeError("harness crashed"))
        else:
            tr.stop(cond)
        assert tr.stop_condition == cond
        traces.append(tr)
    dump = tmp_path / "traces.jsonl"
    dump.write_text("".join(json.dumps(t.to_record()) + "\n" for t in traces))
    rep = report([dump], "verifiers", CONTEXT)
    assert [f for f in rep["findings"] if f["severity"] != "info"] == [], rep["findings"]
    rows = to_contract([t.to_record() for t in traces]).to_pylist()
    for tr, row in zip(traces, rows):
        assert row["truncated"] == (tr.is_truncated or tr.is_timeout), tr.stop_condition
        assert row["infra_error"] == (not tr.ok), tr.stop_condition


def test_a_real_rollout_on_loopback_dumped_and_audited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verifiers 0.4.0 agent (null chat harness, subprocess runtime, the training client that renders
    with a qwen3 renderer and calls vLLM's /inference/v1/generate) against the tiny model server on
    loopback; the trace is dumped with `to_record()` and audited: no error. The tiny model's answer is
    cut at max_tokens, so verifiers calls the trace truncated although the harness completed, and so
    does the audit (no T305)."""
    vf = pytest.importorskip("verifiers.v1")
    if shutil.which("uv") is None:
        pytest.skip("verifiers' harness runs as a uv script: uv is not on PATH")
    import asyncio

    import torch
    from tinyserver import serve
    from transformers import GPT2Config, GPT2LMHeadModel
    from verifiers.v1.harnesses.null import NullHarnessConfig
    from verifiers.v1.runtimes.subprocess import SubprocessConfig

    from benchmarks.tinylm import tokenizer
    from rollout_audit.adapters.verifiers import to_contract

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TINY_API_KEY", "unused")
    tok = tokenizer()  # the qwen3 renderer's special tokens on the tiny word-level vocabulary
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                "</tool_response>", "<think>", "</think>"]  # fmt: skip
    tok.add_special_tokens({"additional_special_tokens": specials})
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=512, n_embd=32, n_layer=2, n_head=2))
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    server, base = serve(str(tmp_path / "model"), "processed_logprobs")
    client = vf.TrainClientConfig(
        base_url=base,
        api_key_var="TINY_API_KEY",
        renderer_model_name=str(tmp_path / "model"),
        renderer={"name": "qwen3"},
    )
    cfg = vf.AgentConfig(model="tiny", harness=NullHarnessConfig(), runtime=SubprocessConfig(), client=client,
                         sampling=vf.SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=8), max_turns=3)  # fmt: skip

    async def rollout():
        async with vf.make_agent(cfg) as agent:
            return await agent.run(vf.Task(vf.TaskData(prompt="open the red door")))

    try:
        trace = asyncio.run(rollout())
    finally:
        server.shutdown()
    assert trace.errors == [] and trace.stop_condition == "agent_completed"
    sampled = [n for n in trace.nodes if n.sampled]
    assert sampled and all(sum(n.mask) == len(n.logprobs) > 0 for n in sampled)
    dump = tmp_path / "traces.jsonl"
    dump.write_text(json.dumps(trace.to_record()) + "\n")  # the documented hook
    rep = report([dump], "verifiers", CONTEXT)
    assert [f for f in rep["findings"] if f["severity"] != "info"] == [], rep["findings"]
    row = to_contract([trace.to_record()]).to_pylist()[0]
    assert row["truncated"] == trace.is_truncated
    assert [t["temperature"] for t in row["turns"]] == [1.0] * len(sampled)


# ---------------------------------------------------------------- the trainer's half: prime-rl's policy, trainer log-probs

PRIME_RL = [*CONTEXT, "trainer=prime-rl"]


def test_prime_rl_trains_scored_truncations_so_they_audit_clean_under_its_policy() -> None:
    """prime-rl credits every error-free trace from its reward, truncated or not: the group prime-rl
    trained (two truncations scored 0.0, node advantages stamped) is T304 ×2 without the trainer,
    clean with `--context trainer=prime-rl`, and the report says which policy came from where."""
    src = fixture("verifiers", "compliant_prime_rl")
    assert {f["code"] for f in report([src], "verifiers", CONTEXT)["findings"]} == {"T304"}
    rep = report([src], "verifiers", PRIME_RL)
    assert rep["findings"] == [], rep["findings"]
    res = cli("check", "--from", "verifiers", src, *[a for kv in PRIME_RL for a in ("--context", kv)])
    assert res.exit_code == 0 and "prime-rl trains every error-free trace" in res.stderr, res.stderr
    assert 'from the trainer\'s settings: truncation = "penalize"' in res.output


def test_an_unknown_trainer_is_exit_2_naming_the_known_ones() -> None:
    res = cli("check", "--from", "verifiers", fixture("verifiers", "v1_compliant"), "--context", "trainer=verl")
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "unknown trainer 'verl'" in lines[0] and "prime-rl" in lines[0]


def test_trainer_logprobs_on_real_nodes_feed_l207(tmp_path: Path) -> None:
    """`MessageNode.trainer_logprobs` (verifiers 0.4.0) become the second log-prob column L207 compares:
    silent when the trainer reproduces the engine's log-probs, a warning on the turn whose ratio is far
    from 1 (a top-p 0.3 sampler against a full-vocabulary trainer: each token off by about ln 0.3)."""
    pytest.importorskip("verifiers.v1")
    from verifiers.v1 import graph, trace, types

    def dump(shift: float) -> Path:
        traces = [_trace(trace, graph, types, n, float(n % 2)) for n in range(2)]
        for tr in traces:
            tr.ok = True
            tr.stop("agent_completed")
            for node in tr.nodes:
                if node.sampled:
                    node.trainer_logprobs = [lp + shift for lp in node.logprobs]
        path = tmp_path / f"traces-{shift}.jsonl"
        path.write_text("".join(json.dumps(t.to_record()) + "\n" for t in traces))
        return path

    same = report([dump(0.0)], "verifiers", CONTEXT)
    assert same["findings"] == [] and "L207" not in {n["code"] for n in same["not_run"]}
    biased = report([dump(-1.2)], "verifiers", CONTEXT)
    l207 = [f for f in biased["findings"] if f["code"] == "L207"]
    assert len(l207) == 2 and {f["severity"] for f in l207} == {"warning"}, biased["findings"]
    assert all("π_trainer_logprobs/π_beh" in f["message"] for f in l207)


def test_a60a606_error_stops_are_told_apart_by_the_recorded_exception_class() -> None:
    """At a60a606 every failure stops with the plain "error" (trace.py:585-600) and the class name of
    the exception goes to `Trace.errors`: a provider's failure is the engine's, a toolset's the tool's,
    any other the environment's, as 0.4.0's typed conditions said."""
    from rollout_audit.adapters.verifiers import to_contract

    base = records("verifiers", "v1_compliant")[0]
    got = {}
    for kind in ("ProviderError", "OverlongPromptError", "ToolsetError", "RuntimeError"):
        tr = {**base, "id": kind, "stop_condition": "error", "ok": False, "rewards": {}}
        tr["errors"] = [{"type": kind, "message": "failed", "status_code": None, "traceback": None}]
        row = to_contract([tr]).to_pylist()[0]
        got[kind] = (row["infra_error"], row["stop_reason"])
    assert got == {
        "ProviderError": (True, "engine_error"),
        "OverlongPromptError": (True, "engine_error"),
        "ToolsetError": (True, "tool_error"),
        "RuntimeError": (True, "env_error"),
    }


# ---------------------------------------------------------------- contract 1.3: prime-rl's loss streams, expert routes

STREAM_CASES = {
    "compliant_prime_rl_echo": set(),
    "prime_rl_echo_on_next_action": {"M101", "M110"},  # the template of the next turn, and its first action token
    "prime_rl_echo_on_scaffold": {"M101", "M110"},  # the tool reply's wrap, which is_content marks as scaffold
    "compliant_prime_rl_moe": set(),
    "prime_rl_routes_duplicated": {"P505"},
    "prime_rl_routes_lost": {"P505"},
}


@pytest.mark.parametrize("case", STREAM_CASES)
def test_prime_rl_streams_and_routes_through_check_from(case: str) -> None:
    """Each fixture through `check --from verifiers` with prime-rl's context: the compliant echo run and
    MoE run audit clean with M110 / P505 run, each fault raises exactly its codes (every trace of the echo
    faults, trace-1 of the route faults)."""
    rep = report([fixture("verifiers", case)], "verifiers", PRIME_RL)
    assert {f["code"] for f in rep["findings"]} == STREAM_CASES[case], rep["findings"]
    ran = {"M110"} | ({"P505"} if "moe" in case or "routes" in case else set())
    assert not ran & {n["code"] for n in rep["not_run"]}
    named = {f["trajectory_id"] for f in rep["findings"]}
    assert named == (set() if case.startswith("compliant") else {"trace-1"} if "routes" in case else
                     {f"trace-{n}" for n in range(4)})  # fmt: skip


def test_echo_weights_are_read_only_with_the_trainer_that_names_them() -> None:
    """Without `--context trainer=prime-rl` the nodes' named weights are not read (their names are the
    trainer's): M110 is not run and the echo tokens stay out of the loss mask (no M101 either)."""
    rep = report([fixture("verifiers", "prime_rl_echo_on_next_action")], "verifiers", CONTEXT)
    assert "M110" in {n["code"] for n in rep["not_run"]}
    assert not {"M101", "M110"} & {f["code"] for f in rep["findings"]}


def _episode(tmp_path: Path, name: str, traces: list, span: tuple[int, int], group: str = "g0") -> Path:
    """verifiers 0.4.0 `Episode`s (one trace each) stamped as prime-rl's dispatcher stamps them, dumped
    with `Episode.to_record()` and the documented routes encoding (the engine's payload: base64)."""
    import base64

    from verifiers.v1 import episode as vf_episode

    lines = []
    for tr in traces:
        work = vf_episode.TrainWorkInfo(step=span[1], policy=vf_episode.PolicySpan(start=span[0], end=span[1]))
        ep = vf_episode.Episode(task=tr.task, traces=[tr], group=vf_episode.GroupInfo(id=group), ok=True)
        ep.record_run(vf_episode.TrainRunInfo(id="run-0", work=work))
        rec = ep.to_record()
        for t, out in zip(ep.traces, rec["traces"]):
            for node, node_out in zip(t.nodes, out["nodes"]):
                if node.routed_experts is not None:
                    arr = node.routed_experts
                    data = base64.b64encode(arr.tobytes()).decode()
                    node_out["routed_experts"] = {"dtype": str(arr.dtype), "shape": list(arr.shape), "data": data}
        lines.append(json.dumps(rec) + "\n")
    path = tmp_path / name
    path.write_text("".join(lines))
    return path


def test_real_episodes_with_echo_weights_and_routes(tmp_path: Path) -> None:
    """Traces built with verifiers 0.4.0's classes, echo's `ce` weights stamped on the tool reply's body
    (`MessageNode.loss_weights`, `is_content`), the engine's routes on every node (`routed_experts`),
    wrapped in `Episode`s whose policy span has no drift: clean, with M110 and P505 run, the digest of
    the routes `Branch.routed_experts` gives. A negative weight is M110; a second version inside the
    span leaves the routes their digest only (P505 not run: no call's version is known)."""
    pytest.importorskip("verifiers.v1")
    import hashlib

    import numpy as np
    from verifiers.v1 import graph, trace, types

    def traces(weight: float) -> list:
        out = []
        for n in range(2):
            tr = _trace(trace, graph, types, n, float(n % 2))
            tr.ok = True
            tr.stop("agent_completed")
            for k, node in enumerate(tr.nodes):
                rows = len(node.token_ids)
                node.routed_experts = (np.arange(rows * 4, dtype=np.int64).reshape(rows, 2, 2) + k) % 64
                node.routed_experts = node.routed_experts.astype(np.uint8)
            tool = tr.nodes[3]
            tool.is_content = [False] * 4 + [True] * 2 + [False] * 2
            tool.loss_weights = {"ce": [weight if c else 0.0 for c in tool.is_content]}
            out.append(tr)
        return out

    good = traces(0.1)
    path = _episode(tmp_path, "good.jsonl", good, (3, 3))
    rep = report([path], "verifiers", PRIME_RL)
    assert [f for f in rep["findings"] if f["severity"] != "info"] == [], rep["findings"]
    assert not {"M110", "P505"} & {n["code"] for n in rep["not_run"]}

    from rollout_audit.adapters.verifiers import to_contract

    rows = to_contract([json.loads(x) for x in path.read_text().splitlines()], trainer="prime-rl").to_pylist()
    branch = good[0].branches[0]
    assert rows[0]["routed_experts_sha256"] == hashlib.sha256(branch.routed_experts.astype("<i4").tobytes()).hexdigest()
    assert rows[0]["routed_experts_version"] == [3] * len(branch.token_ids)
    assert rows[0]["loss_weight"] == pytest.approx([w or float(m) for w, m in zip(branch.loss_weights("ce"),
                                                                                   branch.sampled_mask)])  # fmt: skip
    assert rows[0]["group_id"] == "g0"

    bad = report([_episode(tmp_path, "negative.jsonl", traces(-0.1), (3, 3))], "verifiers", PRIME_RL)
    m110 = [f for f in bad["findings"] if f["code"] == "M110"]
    assert len(m110) == 2 and all("negative or non-finite" in f["message"] for f in m110), bad["findings"]

    drift = _episode(tmp_path, "drift.jsonl", traces(0.1), (3, 4))
    rep = report([drift], "verifiers", [a for a in PRIME_RL if not a.startswith("policy_version")])
    assert "P505" in {n["code"] for n in rep["not_run"]}
    rows = to_contract([json.loads(x) for x in drift.read_text().splitlines()], trainer="prime-rl").to_pylist()
    assert "routed_experts_version" not in rows[0] and len(rows[0]["routed_experts_sha256"]) == 64


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda ep: ep["run"]["work"]["policy"].update(start=4, end=4), "run.work.policy says version 4"),
        (lambda ep: ep["traces"][0]["nodes"][0]["routed_experts"].update(data="not base64!"), "not base64"),
        (lambda ep: ep["traces"][0]["nodes"][0]["routed_experts"].update(dtype="float32"), "uint8 or uint16"),
        (lambda ep: ep["traces"][0]["nodes"][0]["routed_experts"].update(shape=[9, 2, 2]), "bytes for a shape"),
        (lambda ep: ep["traces"][0]["nodes"][3].update(loss_weights={"ce": [0.1]}), "loss_weights.ce"),
        (lambda ep: ep["traces"][0]["nodes"][3].update(is_content=[True]), "is_content of 1"),
    ],
)
def test_bad_routes_weights_or_versions_exit_2_naming_them(tmp_path: Path, edit, says: str) -> None:
    """A contradicted policy version, routes that do not decode to the shape they claim, weights or
    content flags that do not line up with the node's tokens: one line naming the field, exit 2."""
    recs = records("verifiers", "compliant_prime_rl_moe")
    edit(recs[0])
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = cli("check", "--from", "verifiers", path, *[a for kv in PRIME_RL for a in ("--context", kv)])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and says in lines[0], res.stderr


def test_a_calls_top_k_becomes_the_turns_cut_off() -> None:
    """`SamplingConfig(extra_body={"top_k": 20})` (verifiers 0.4.0 keeps a provider's keys) is the turn's
    contract 1.3 `top_k`; a call without one leaves the field out (replay assumes no cut-off)."""
    pytest.importorskip("verifiers.v1")
    from verifiers.v1 import graph, trace, types

    from rollout_audit.adapters.verifiers import to_contract

    tr = _trace(trace, graph, types, 0, 1.0)
    tr.calls[0].sampling = types.SamplingConfig(temperature=0.7, top_p=1.0, extra_body={"top_k": 20})
    row = to_contract([tr.to_record()]).to_pylist()[0]
    assert [t.get("top_k") for t in row["turns"]] == [20, None]


PENALIZE = {"truncation": "penalize"}  # what --context trainer=prime-rl sets


def test_rl_weights_are_gated_by_the_mask_as_prime_rl_trains_them() -> None:
    """prime-rl's `rl` component trains `mask & (rl_w != 0)` (loss.py:382): an `rl` weight of 0 on the
    sampled answer is a token dropped silently (M110 on the turn), an `rl` weight off the mask is not
    trained and no finding."""
    from rollout_audit.adapters.verifiers import to_contract

    def rows(edit):
        recs = records("verifiers", "compliant_prime_rl_echo")
        for tr in recs:
            edit(tr["nodes"])
        return to_contract(recs, **dict(kv.split("=", 1) for kv in PRIME_RL))

    def off_mask(nodes):
        nodes[1]["loss_weights"] = {"rl": [1.0] * len(nodes[1]["token_ids"])}

    assert ra.audit_tables(rows(off_mask), config=Config(**PENALIZE)).findings.height == 0

    def dropped(nodes):
        nodes[4]["loss_weights"] = {"rl": [0.0] * len(nodes[4]["token_ids"])}

    found = ra.audit_tables(rows(dropped), config=Config(**PENALIZE)).findings
    assert set(found["code"]) == {"M110"} and found.height == 4, found
    assert all("dropped silently" in m for m in found["message"])


@pytest.mark.parametrize("case", ["prime_rl_echo_on_next_action", "prime_rl_routes_duplicated"])
def test_convert_keeps_the_streams_and_routes(case: str, tmp_path: Path) -> None:
    same_after_convert("verifiers", case, PRIME_RL, tmp_path)
