"""An OpenAI-compatible completions server on loopback backed by the tiny GPT-2 of `benchmarks.tinylm`:
it samples (temperature / top-p through transformers' warpers, seeded), returns vLLM's
`return_token_ids` fields and per-token log-probs, either processed (the sampled distribution) or raw
(the base softmax, vLLM V1's default `--logprobs-mode raw_logprobs`), and scores prompts
(`prompt_logprobs`, for replay) as `benchmarks.tinylm` does; and vLLM's token-in/token-out
`/inference/v1/generate`, which verifiers' training client calls."""

from __future__ import annotations

import io
import json
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` lives at the repo root

from benchmarks.tinylm import _Handler, _processed


class _Sampler(_Handler):
    """POST /v1/completions: sample when the request has no prompt_logprobs, else score (the parent).
    POST /inference/v1/generate: vLLM's token-in/token-out endpoint, which verifiers' training client
    (renderers) calls with ids it rendered itself."""

    mode = "processed_logprobs"
    stop_ids: frozenset[int] = frozenset({0})  # the ids sampling stops on (the tiny GPT-2's eos)

    def _sample(
        self, ids: list[int], params: dict[str, Any], stop_ids: frozenset[int] | set[int]
    ) -> tuple[list[int], list[float], str]:
        """(sampled ids, their log-probs, finish reason): seeded sampling through transformers' warpers,
        stopping on an id of `stop_ids` ("stop") or after max_tokens ("length")."""
        import torch

        temperature, top_p = float(params.get("temperature") or 1.0), float(params.get("top_p") or 1.0)
        gen = torch.Generator().manual_seed(int(params.get("seed") or 0))
        sampled: list[int] = []
        lps: list[float] = []
        for _ in range(int(params.get("max_tokens") or 4)):
            with torch.no_grad():
                scores = self.model(torch.tensor([ids + sampled])).logits[:, -1].double()
            processed = torch.log_softmax(_processed(scores, temperature, top_p, 0), -1)
            tok = int(torch.multinomial(processed.exp(), 1, generator=gen)[0, 0])
            recorded = processed if self.mode == "processed_logprobs" else torch.log_softmax(scores, -1)
            sampled.append(tok)
            lps.append(float(recorded[0, tok]))
            if tok in stop_ids:
                return sampled, lps, "stop"
        return sampled, lps, "length"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = json.loads(body)
        if self.path.rstrip("/") == "/inference/v1/generate":
            return self._generate(req)
        if self.path.rstrip("/") != "/v1/completions" or req.get("prompt_logprobs") is not None:
            self.rfile = io.BytesIO(body)  # the parent reads the body again
            self.headers.replace_header("Content-Length", str(len(body)))
            return super().do_POST()
        # one prompt of ids, or a batch of them (TRL's VLLMClient.generate); `n` samples of each, prompt-major,
        # each choice with its own prompt_token_ids and seed (the request's seed plus the choice's index)
        prompts = req["prompt"] if req["prompt"] and isinstance(req["prompt"][0], list) else [req["prompt"]]
        n, seed = int(req.get("n") or 1), int(req.get("seed") or 0)
        choices = []
        for index, ids in enumerate(list(p) for p in prompts for _ in range(n)):
            sampled, lps, finish = self._sample(ids, {**req, "seed": seed + index}, self.stop_ids)
            named = [f"token_id:{t}" for t in sampled]
            logprobs = {"tokens": named, "token_logprobs": lps, "top_logprobs": [{e: lp} for e, lp in zip(named, lps)]}
            choices.append(
                {
                    "index": index,
                    "text": " ".join(str(t) for t in sampled),
                    "token_ids": sampled,
                    "prompt_token_ids": ids,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }
            )
        self._send(200, {"object": "text_completion", "model": self.name, "choices": choices})

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/health":  # vLLM's liveness route, which TRL's VLLMClient polls
            return self._send(200, {})
        return super().do_GET()

    def _generate(self, req: dict[str, Any]) -> None:
        """vLLM's /inference/v1/generate: token_ids and sampling_params in; the prompt's and the sampled
        ids, the finish reason and per-token log-probs (`token_id:<id>` entries) out."""
        ids = [int(i) for i in req["token_ids"]]
        params = req.get("sampling_params") or {}
        stop = {int(i) for i in params.get("stop_token_ids") or []}
        sampled, lps, finish = self._sample(ids, params, stop)
        content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(sampled, lps)]
        choice = {"index": 0, "token_ids": sampled, "finish_reason": finish, "logprobs": {"content": content}}
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(sampled), "total_tokens": len(ids) + len(sampled)}
        self._send(200, {"request_id": "tiny-0", "prompt_token_ids": ids, "choices": [choice], "usage": usage})


def serve(model_dir: str, mode: str) -> tuple[ThreadingHTTPServer, str]:
    """Serve the model of `model_dir` on a free loopback port; `mode` is the log-prob mode."""
    from transformers import AutoModelForCausalLM

    return serve_model(AutoModelForCausalLM.from_pretrained(model_dir).eval(), mode)


def serve_model(model: Any, mode: str, stop_ids: set[int] | None = None) -> tuple[ThreadingHTTPServer, str]:
    """Serve `model` (a causal LM in memory) on a free loopback port, stopping on `stop_ids`."""
    attrs = {"model": model, "mode": mode} | ({"stop_ids": frozenset(stop_ids)} if stop_ids is not None else {})
    handler: Any = type("Handler", (_Sampler,), attrs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"
