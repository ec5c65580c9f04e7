"""An OpenAI-compatible completions server on loopback backed by the tiny GPT-2 of `benchmarks.tinylm`:
it samples (temperature / top-p through transformers' warpers, seeded), returns vLLM's
`return_token_ids` fields and per-token log-probs, either processed (the sampled distribution) or raw
(the base softmax, vLLM V1's default `--logprobs-mode raw_logprobs`), and scores prompts
(`prompt_logprobs`, for replay) as `benchmarks.tinylm` does."""

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
    """POST /v1/completions: sample when the request has no prompt_logprobs, else score (the parent)."""

    mode = "processed_logprobs"

    def do_POST(self) -> None:
        import torch

        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = json.loads(body)
        if self.path.rstrip("/") != "/v1/completions" or req.get("prompt_logprobs") is not None:
            self.rfile = io.BytesIO(body)  # the parent reads the body again
            self.headers.replace_header("Content-Length", str(len(body)))
            return super().do_POST()
        ids = list(req["prompt"])
        temperature, top_p = float(req.get("temperature", 1.0)), float(req.get("top_p", 1.0))
        gen = torch.Generator().manual_seed(int(req.get("seed", 0)))
        sampled: list[int] = []
        lps: list[float] = []
        finish = "length"
        for _ in range(int(req.get("max_tokens", 4))):
            with torch.no_grad():
                scores = self.model(torch.tensor([ids + sampled])).logits[:, -1].double()
            processed = torch.log_softmax(_processed(scores, temperature, top_p, 0), -1)
            tok = int(torch.multinomial(processed.exp(), 1, generator=gen)[0, 0])
            recorded = processed if self.mode == "processed_logprobs" else torch.log_softmax(scores, -1)
            sampled.append(tok)
            lps.append(float(recorded[0, tok]))
            if tok == 0:  # eos
                finish = "stop"
                break
        choice = {
            "index": 0,
            "text": " ".join(str(t) for t in sampled),
            "token_ids": sampled,
            "prompt_token_ids": ids,
            "logprobs": {"tokens": [f"token_id:{t}" for t in sampled], "token_logprobs": lps},
            "finish_reason": finish,
        }
        self._send(200, {"object": "text_completion", "model": self.name, "choices": [choice]})


def serve(model_dir: str, mode: str) -> tuple[ThreadingHTTPServer, str]:
    """Serve the model of `model_dir` on a free loopback port; `mode` is the log-prob mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    handler: Any = type("Handler", (_Sampler,), {"model": model, "mode": mode})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"
