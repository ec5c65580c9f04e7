"""A tiny randomly initialised Hugging Face causal LM, its tokenizer trained in-process, a rollout log it
samples (with optional behaviour log-prob faults), and an OpenAI-compatible completions server for it.
Nothing is downloaded. Used by the replay tests and `python -m benchmarks.replay`."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

CORPUS = (
    "open the red door",
    "take the blue key",
    "the door is stuck",
    "call one tool per turn",
    "you are an agent in a room",
    "the clue is red",
    "the clue is blue",
    "finish when done",
)
FAULT_NAMES = ("base_softmax", "wrong_version", "top_p_ignored")


def build(out: Path, versions: int = 2, seed: int = 0) -> dict[str, str]:
    """Train a word-level tokenizer on CORPUS, build a 2-layer GPT-2 with peaked logits, save one checkpoint
    directory per policy version (v ≥ 1 perturbs the previous weights). Returns {version: directory}."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tokenizer()
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        initializer_range=0.4,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = GPT2LMHeadModel(cfg).eval()
    dirs = {}
    for v in range(versions):
        if v:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.1 * torch.randn_like(p))
        d = out / f"v{v}"
        model.save_pretrained(d)
        tok.save_pretrained(d)
        dirs[str(v)] = str(d)
    return dirs


def tokenizer() -> Any:
    """A word-level Hugging Face tokenizer trained on CORPUS in-process (a PreTrainedTokenizerFast)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<obs>", "</obs>"]))
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", unk_token="<unk>")


def _processed(scores: Any, temperature: float, top_p: float, top_k: int) -> Any:
    """transformers' own logits warpers (temperature → top-k → top-p): the sampler's distribution."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    z = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        z = TopKLogitsWarper(top_k)(None, z)
    return TopPLogitsWarper(top_p)(None, z) if top_p < 1.0 else z


def sample_log(
    dirs: dict[str, str],
    out: Path,
    n: int = 16,
    temperature: float = 0.7,
    top_p: float = 0.9,
    top_k: int = 0,
    turn_tokens: int = 4,
    fault: str | None = None,
    seed: int = 0,
) -> Path:
    """Sample n two-turn trajectories per version (prompt, policy turn, observation, policy turn) and write
    a contract log to out/trajectories. `fault` records wrong behaviour log-probs (FAULT_NAMES)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout_audit.reading.records import records_to_table

    tok = AutoTokenizer.from_pretrained(dirs["0"])
    prompt = tok("you are an agent in a room")["input_ids"]
    obs = tok("<obs> the door is stuck </obs>")["input_ids"]
    gen = torch.Generator().manual_seed(seed)
    records: list[dict[str, Any]] = []
    for v in sorted(dirs, key=int):
        model = AutoModelForCausalLM.from_pretrained(dirs[v]).eval()
        scorer = (
            AutoModelForCausalLM.from_pretrained(dirs[str(int(v) - 1)]).eval()
            if fault == "wrong_version" and int(v) > 0
            else model
        )
        ids = torch.tensor([prompt] * n)
        source, turn_of = [1] * len(prompt), [-1] * len(prompt)
        lps: list[list[float | None]] = [[None] * len(prompt) for _ in range(n)]
        turns: list[list[dict]] = [[] for _ in range(n)]
        for t in range(2):
            ctx = ids.shape[1]
            for _ in range(turn_tokens):
                with torch.no_grad():
                    scores = model(ids).logits[:, -1].float()
                    logp = torch.log_softmax(_processed(scores, temperature, top_p, top_k), -1)
                    nxt = torch.multinomial(logp.exp(), 1, generator=gen)
                    rec_scores = scorer(ids).logits[:, -1].float()
                if fault == "base_softmax":
                    rec = torch.log_softmax(rec_scores, -1)
                elif fault == "top_p_ignored":
                    rec = torch.log_softmax(rec_scores / temperature, -1)
                else:
                    rec = torch.log_softmax(_processed(rec_scores, temperature, top_p, top_k), -1)
                for b, lp in enumerate(rec.gather(1, nxt)[:, 0].tolist()):
                    lps[b].append(lp)
                ids = torch.cat([ids, nxt], 1)
                source.append(2)
                turn_of.append(t)
            for b in range(n):
                turns[b].append(
                    {
                        "turn_id": t,
                        "policy_version": int(v),
                        "temperature": temperature,
                        "top_p": top_p,
                        "logprob": float(np.sum([x for x in lps[b][ctx:] if x is not None])),
                        "context_length": ctx,
                        "num_policy_tokens": turn_tokens,
                        "finish_reason": "tool_calls" if t == 0 else "stop",
                        "sampled_token_ids": ids[b, ctx:].tolist(),
                    }
                )
            if t == 0:
                ids = torch.cat([ids, torch.tensor([obs] * n)], 1)
                source += [3] * len(obs)
                turn_of += [0] * len(obs)
                for b in range(n):
                    lps[b] += [None] * len(obs)
        for b in range(n):
            records.append(
                {
                    "trajectory_id": f"v{v}-t{b}",
                    "task_id": "tiny",
                    "environment_id": "tiny",
                    "environment_version": "1",
                    "reset_seed": b,
                    "verifier_version": "1",
                    "token_ids": ids[b].tolist(),
                    "token_source": source,
                    "loss_mask": [s == 2 for s in source],
                    "behavior_logprobs": lps[b],
                    "token_turn": turn_of,
                    "turns": turns[b],
                    "terminated": True,
                    "truncated": False,
                    "infra_error": False,
                    "stop_reason": "success",
                    "reward": 1.0,
                }
            )
    path = out / "trajectories" / "part-0000.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    table = records_to_table(list(records))  # type: ignore[arg-type]
    pq.write_table(
        table.replace_schema_metadata({"rollout_log.schema_version": "1", "rollout_log.kind": "trajectories"}), path
    )
    return out


class _Handler(BaseHTTPRequestHandler):
    """GET /v1/models and POST /v1/completions with vLLM-style `prompt_logprobs` (token ids in and out)."""

    model: Any = None
    name = "tiny"

    def log_message(self, *args: Any) -> None:  # quiet
        return

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.name, "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        import torch

        if self.path.rstrip("/") != "/v1/completions":
            self._send(404, {"error": "not found"})
            return
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompts = req["prompt"] if req["prompt"] and isinstance(req["prompt"][0], list) else [req["prompt"]]
        k = int(req.get("prompt_logprobs") or 0)
        choices = []
        for i, p in enumerate(prompts):
            with torch.no_grad():
                logp = torch.log_softmax(self.model(torch.tensor([p])).logits[0].double(), -1)
            entries: list[Any] = [None]
            for pos in range(1, len(p)):
                row = logp[pos - 1]
                top = torch.arange(len(row)) if k < 0 else torch.topk(row, k).indices
                ids = set(top.tolist()) | {p[pos]}
                entries.append(
                    {str(j): {"logprob": float(row[j]), "rank": int((row > row[j]).sum()) + 1} for j in sorted(ids)}
                )
            choices.append({"index": i, "text": "", "prompt_logprobs": entries, "finish_reason": "length"})
        self._send(200, {"object": "text_completion", "model": self.name, "choices": choices})


def serve(model_dir: str) -> tuple[ThreadingHTTPServer, str]:
    """Serve the model of `model_dir` on a free loopback port in a daemon thread; returns (server, base URL)."""
    from transformers import AutoModelForCausalLM

    handler = type("Handler", (_Handler,), {"model": AutoModelForCausalLM.from_pretrained(model_dir).eval()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"
