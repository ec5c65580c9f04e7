"""verl's agent-loop registry builds rollout-audit's recording loop by configuration (no source edit):
the shipped YAML loaded as verl loads it, `hydra.utils.instantiate` of the entry with the arguments
verl passes, a user loop inside calling the engine through a real HTTP server on 127.0.0.1; the record
the adapter reads has the engine's ids, and the output is forwarded unchanged. The drift test fails
when verl's registry or the arguments it passes change."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

pytest.importorskip("verl")
pytest.importorskip("cachetools")


class _Engine(BaseHTTPRequestHandler):
    """Stands in for the inference server: returns the next three ids after the prompt."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        last = body["prompt_ids"][-1]
        out = {"token_ids": [last + 1, last + 2, last + 3], "log_probs": [-0.5, -0.25, -0.125]}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class HttpClient:
    """A server manager that posts to the loopback engine and returns verl's TokenOutput."""

    def __init__(self, url):
        self.url = url

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        import urllib.request

        from verl.workers.rollout.replica import TokenOutput

        req = urllib.request.Request(self.url, json.dumps({"prompt_ids": prompt_ids}).encode(), method="POST")
        raw = await asyncio.get_running_loop().run_in_executor(None, lambda: urllib.request.urlopen(req).read())
        out = json.loads(raw)
        return TokenOutput(stop_reason="completed", extra_fields={"global_steps": 3}, **out)


class ResumedClient(HttpClient):
    """The fully-async client's answer to a call it resumed across a weight update: the merged tokens,
    versions 3 to 4, and the engine's routes (R3), one row per context and sampled token."""

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        import numpy as np

        out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        out.extra_fields = {"global_steps": 4, "min_global_steps": 3, "max_global_steps": 4}
        out.routed_experts = np.zeros((len(prompt_ids) + len(out.token_ids), 1, 2), dtype=np.int32)
        return out


class UserLoop:
    """A user's loop: one engine call, the AgentLoopOutput verl expects."""

    def __init__(self, server_manager, **kwargs):
        self.server_manager = server_manager

    async def run(self, sampling_params, **kwargs):
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

        out = await self.server_manager.generate("req-1", prompt_ids=[1, 2], sampling_params=sampling_params)
        return AgentLoopOutput(
            routed_experts=out.routed_experts,
            prompt_ids=[1, 2],
            response_ids=out.token_ids,
            response_mask=[1, 1, 1],
            response_logprobs=out.log_probs,
            reward_score=1.0,
            num_turns=2,
            metrics=AgentLoopMetrics(),
        )


@pytest.fixture
def engine():
    srv = HTTPServer(("127.0.0.1", 0), _Engine)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/generate"
    srv.shutdown()


def _registry_loop(tmp_path, engine, client=HttpClient):
    """The recording loop as verl builds it: the shipped YAML loaded as AgentLoopWorker.__init__ loads
    agent_loop_config_path, the entry built by hydra.utils.instantiate with the arguments verl passes."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from rollout_audit.integrations.verl_loop import CONFIG

    entry = next(e for e in OmegaConf.load(CONFIG) if e.name == "single_turn_agent")
    entry.agent_loop = f"{__name__}.UserLoop"
    cfg = OmegaConf.create({"trainer": {"rollout_data_dir": str(tmp_path)}})
    return hydra.utils.instantiate(
        config=entry, trainer_config=DictConfigWrap(cfg), server_manager=client(engine), tokenizer=None,
        processor=None, hf_model_type=None, dataset_cls=None, data_config=DictConfigWrap(cfg), tools=None,
    )  # fmt: skip


def test_registry_builds_the_recording_loop_and_the_record_audits(tmp_path, engine):
    from rollout_audit.adapters.base import UNRECORDED, read_dump
    from rollout_audit.adapters.verl import to_contract
    from rollout_audit.integrations.verl_loop import RecordingServer

    loop = _registry_loop(tmp_path, engine)
    assert isinstance(loop.inner.server_manager, RecordingServer)
    out = asyncio.run(loop.run({"temperature": 1.0}, uid="u0", session_id=0, global_steps=4))
    assert out.response_ids == [3, 4, 5] and out.response_logprobs == [-0.5, -0.25, -0.125]
    recs = read_dump(tmp_path / "rollout-audit")
    assert recs[0]["request_id"] == "u0_0_0" and recs[0]["engine_calls"][0]["token_ids"] == [3, 4, 5]
    assert recs[0]["engine_calls"][0]["global_steps"] == 3
    assert set(recs[0][UNRECORDED]) == {"turns.template_context_length", "turns.template_context_sha256"}
    t = to_contract(recs).to_pylist()[0]
    assert t["token_source"] == [1, 1, 2, 2, 2] and t["turns"][0]["policy_version"] == 3


def test_check_names_what_the_loop_could_not_record_in_not_run(tmp_path, engine):
    """`check --from verl` on the wrapper's dump: the checks that need what it could not record (the
    rendered template: M107) are "not run" with the wrapper's own reason, not among the checks run;
    those its engine calls feed (M101, M105, M106) run."""
    from adapterhelp import cli, context_args

    loop = _registry_loop(tmp_path, engine)
    for uid in ("u0", "u1"):
        asyncio.run(loop.run({"temperature": 1.0}, uid=uid, session_id=0, global_steps=4))
        loop.calls.clear()  # verl builds one loop per sample
    res = cli("check", "--from", "verl", tmp_path / "rollout-audit", *context_args(), "--format", "json")
    rep = json.loads(res.stdout)
    assert res.exit_code in (0, 1), res.output
    not_run = {n["code"]: n["reason"] for n in rep["not_run"]}
    assert "rollout-audit's verl agent loop: the conversation the user's loop renders" in not_run["M107"]
    assert "M107" not in rep["summary"]["checks_run"]
    assert {"M101", "M105", "M106"} <= set(rep["summary"]["checks_run"])
    text = cli("check", "--from", "verl", tmp_path / "rollout-audit", *context_args(), "--show-not-run")
    assert "M107" in text.output and "the conversation the user's loop renders" in text.output
    assert "verl agent loop: an engine call resumed" not in text.output  # no call was


def test_routes_of_a_call_resumed_across_an_update_are_named_not_run(tmp_path, engine):
    """A call the fully-async client resumed reaches the wrapper as one call with merged routes: the
    record says their versions are not known, and P505 (routes from another version) is not run with
    that reason; the routes' digest is still recorded."""
    from adapterhelp import cli, context_args

    from rollout_audit.adapters.base import UNRECORDED, read_dump

    loop = _registry_loop(tmp_path, engine, ResumedClient)
    asyncio.run(loop.run({"temperature": 1.0}, uid="u0", session_id=0, global_steps=4))
    rec = read_dump(tmp_path / "rollout-audit")[0]
    assert (
        rec["routed_experts_rows"] == 5
        and "resumed across a weight update" in rec[UNRECORDED]["routed_experts_version"]
    )
    res = cli("check", "--from", "verl", tmp_path / "rollout-audit", *context_args(), "--format", "json")
    rep = json.loads(res.stdout)
    not_run = {n["code"]: n["reason"] for n in rep["not_run"]}
    assert "rollout-audit's verl agent loop: an engine call resumed across a weight update" in not_run["P505"]
    assert "P505" not in rep["summary"]["checks_run"]


def test_a_loop_without_a_directory_fails_loudly():
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from rollout_audit.integrations.verl_loop import AuditedAgentLoop

    with pytest.raises(ValueError, match="rollout_data_dir"):
        AuditedAgentLoop(agent_loop=f"{__name__}.UserLoop", trainer_config=DictConfigWrap(OmegaConf.create({})))


def test_drift_verl_registry_and_build_arguments():
    """What the wrapper relies on in verl: the registry dict and `register`, the config key, the keyword
    arguments AgentLoopWorker passes to hydra.utils.instantiate, and LLMServerClient.generate's signature."""
    from verl.experimental.agent_loop import agent_loop
    from verl.workers.rollout.llm_server import LLMServerClient

    from rollout_audit.integrations.verl_loop import BUILD_ARGS

    assert isinstance(agent_loop._agent_loop_registry, dict) and callable(agent_loop.register)
    src = inspect.getsource(agent_loop.AgentLoopWorker)
    assert "agent.agent_loop_config_path" in src and "hydra.utils.instantiate" in src
    build = inspect.getsource(agent_loop.AgentLoopWorker._run_agent_loop)
    assert [a for a in BUILD_ARGS if f"{a}=" not in build] == []
    params = inspect.signature(LLMServerClient.generate).parameters
    assert list(params)[:4] == ["self", "request_id", "prompt_ids", "sampling_params"]
