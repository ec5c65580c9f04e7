"""The lines `rollout-audit capture` writes (rollout_audit.contract.capture) as the request/response
pairs the `openai` adapter reads, and what makes a recorded session incomplete.

An exchange's bodies are the bytes that went through: the request is parsed as JSON; the
response as JSON, or, when it streamed, its Server-Sent Events put back together the way a client
does (vLLM: `prompt_token_ids` on the first chunk, each chunk's `choices[0].token_ids`, log-prob
entries and text appended, the last `finish_reason`; SGLang's native `/generate`: every event
holds the whole output so far, so the last one is the response). SGLang's `/generate` exchange
(`input_ids`, `sampling_params`, `meta_info.output_token_logprobs` as `[logprob, id, text]`) is read
as a completion: the request's `input_ids` are the engine's context, the response's `output_ids`
the sampled ids, each log-prob entry's id the id it names. An exchange that failed (a status other
than 200, an upstream unreachable, an error event) produced nothing the loop went on with: it is
not a turn. Nothing is corrected: null log-probs stay null."""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

from ..contract import capture as F
from .base import AdapterError, Record, located, short

TURN_ENDPOINTS = ("chat/completions", "completions", "generate")
MAX_DECODED = 256 << 20  # a compressed body is bounded as a dump line is


def version_error(rec: Mapping[str, Any], where: str) -> str | None:
    """One line refusing a capture record of a newer (or no) format version; None when it is readable."""
    v = F.newer(dict(rec))
    if v is None:
        return None
    if v == -1:
        return f"{where}: {F.KEY}: {short(rec.get(F.KEY))} is not a capture format version"
    return (
        f"{where}: capture record format {v} is newer than the format {F.VERSION} this rollout-audit "
        "reads; upgrade rollout-audit to audit it"
    )


def pair(rec: Record, where: str) -> Record | None:
    """The request/response pair of one exchange line (the `openai` adapter's shape, with the
    exchange's `weight_version`), or None when the exchange is not a turn."""
    endpoint = rec.get("endpoint")
    if rec.get("status") != 200 or rec.get("error") is not None or endpoint not in TURN_ENDPOINTS:
        return None
    sent = _decoded(_bytes(rec, "request_body", where), rec.get("request_content_encoding"), f"{where}: request_body")
    request = _json(sent, f"{where}: request_body")
    data = _decoded(_bytes(rec, "response_body", where), rec.get("content_encoding"), f"{where}: response_body")
    streamed = "event-stream" in str(rec.get("content_type") or "") or data.lstrip().startswith(b"data:")
    if endpoint == "generate":
        response = _sglang_stream(data, where) if streamed else _json(data, f"{where}: response_body")
        if response is None or "error" in response:
            return None
        request, response = _sglang(request, response, where)
    else:
        response = _assembled(data, where) if streamed else _json(data, f"{where}: response_body")
        if response is None or "error" in response:
            return None
    version = rec.get("weight_version")
    if version is None and endpoint == "generate":
        version = mapping_of(response, "meta_info").get("weight_version")
    out = {"session": rec.get("session"), "turn": rec.get("turn"), "endpoint": endpoint}
    out |= {"request": request, "response": response, "weight_version": version}
    return located(out, getattr(rec, "origin", None))


def mapping_of(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def _bytes(rec: Mapping[str, Any], key: str, where: str) -> bytes:
    data = F.raw(rec.get(key))
    if data is None:
        raise AdapterError(f'{where}: {key}: expected {{"text": …}} or {{"base64": …}}, got {short(rec.get(key))}')
    return data


def _json(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise AdapterError(f"{where}: not JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(doc, dict):
        raise AdapterError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    return doc


def _decoded(data: bytes, encoding: Any, where: str) -> bytes:
    """The body without its HTTP content coding (gzip, deflate), at most MAX_DECODED bytes."""
    if encoding in (None, "", "identity"):
        return data
    if encoding not in ("gzip", "deflate"):
        raise AdapterError(f"{where}: content encoding {short(encoding)}: not read (gzip and deflate are)")
    d = zlib.decompressobj(47 if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = d.decompress(data, MAX_DECODED + 1)
    except zlib.error as e:
        raise AdapterError(f"{where}: cannot decompress ({encoding}): {e}") from None
    if len(out) > MAX_DECODED:
        raise AdapterError(f"{where}: decompresses to more than {MAX_DECODED} bytes")
    return out


def _events(data: bytes, where: str) -> list[dict[str, Any]]:
    """The JSON objects of a stream's `data:` fields, in order (`[DONE]` and comments left out)."""
    out = []
    for n, block in enumerate(data.replace(b"\r\n", b"\n").split(b"\n\n")):
        payload = b"\n".join(line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:"))
        if not payload or payload.strip() == b"[DONE]":
            continue
        out.append(_json(payload, f"{where}: response_body event {n}"))
    return out


def _sglang_stream(data: bytes, where: str) -> dict[str, Any] | None:
    """A streamed `/generate` response as the one response it adds up to. By default every event
    holds the whole output so far, and the last is the response; a server run with
    `incremental_streaming_output` sends each event's new ids and log-prob triples only (sglang
    0.5.23 `tokenizer_manager.py:2636-2647`, `_slice_streaming_output_meta_info` :364-374), told
    apart by the last event's ids falling short of its `meta_info.completion_tokens`: then the
    events are joined."""
    events = _events(data, where)
    if not events or "error" in events[-1]:
        return events[-1] if events else None
    last = events[-1]
    meta = mapping_of(last, "meta_info")
    total, ids = meta.get("completion_tokens"), last.get("output_ids")
    if not isinstance(total, int) or not isinstance(ids, list) or len(ids) == total:
        return last
    joined: list[Any] = []
    triples: list[Any] = []
    text: list[str] = []
    for n, ev in enumerate(events):
        part, lps = ev.get("output_ids"), mapping_of(ev, "meta_info").get("output_token_logprobs")
        if not isinstance(part, list) or (lps is not None and not isinstance(lps, list)):
            raise AdapterError(f"{where}: response_body event {n}: output_ids or meta_info.output_token_logprobs")
        joined += part
        triples += lps or []
        text.append(ev["text"] if isinstance(ev.get("text"), str) else "")
    if len(joined) != total:
        raise AdapterError(
            f"{where}: a /generate stream of {len(events)} events holds neither its whole output in the last "
            f"event nor in all of them together ({len(ids)} or {len(joined)} ids, completion_tokens {total})"
        )
    out = dict(last) | {"output_ids": joined, "text": "".join(text)}
    out["meta_info"] = dict(meta) | ({"output_token_logprobs": triples} if "output_token_logprobs" in meta else {})
    return out


def _assembled(data: bytes, where: str) -> dict[str, Any] | None:
    """A streamed chat or completions response as the one response it adds up to."""
    events = _events(data, where)
    if not events:
        return None
    out: dict[str, Any] = {}
    choice: dict[str, Any] = {}
    text: list[str] = []
    ids: list[Any] = []
    entries: list[Any] = []
    tokens: list[Any] = []
    token_logprobs: list[Any] = []
    chat = False
    have_ids = False
    for ev in events:
        if "error" in ev:
            return ev
        if ev.get("prompt_token_ids") is not None:
            out["prompt_token_ids"] = ev["prompt_token_ids"]
        choices = ev.get("choices") or []
        if not isinstance(choices, list):
            raise AdapterError(f"{where}: a stream chunk's choices is not a list")
        for c in choices:
            if not isinstance(c, Mapping):
                raise AdapterError(f"{where}: a stream chunk's choice is not an object")
            if c.get("index", 0) != 0:
                raise AdapterError(
                    f"{where}: expected exactly one choice (n=1), the stream has choice {short(c.get('index'))}"
                )
            if c.get("prompt_token_ids") is not None:
                choice["prompt_token_ids"] = c["prompt_token_ids"]
            if c.get("token_ids") is not None:
                have_ids = True
                ids.extend(c["token_ids"])
            delta = c.get("delta")
            if isinstance(delta, Mapping):
                chat = True
                if isinstance(delta.get("content"), str):
                    text.append(delta["content"])
            elif isinstance(c.get("text"), str):
                text.append(c["text"])
            lp = c.get("logprobs")
            if isinstance(lp, Mapping):
                if isinstance(lp.get("content"), list):
                    entries.extend(lp["content"])
                if isinstance(lp.get("token_logprobs"), list):
                    token_logprobs.extend(lp["token_logprobs"])
                    tokens.extend(lp.get("tokens") or [None] * len(lp["token_logprobs"]))
            if c.get("finish_reason") is not None:
                choice["finish_reason"] = c["finish_reason"]
    if have_ids:
        choice["token_ids"] = ids
    if chat:
        choice["message"] = {"role": "assistant", "content": "".join(text)}
        if entries:
            choice["logprobs"] = {"content": entries}
    else:
        choice["text"] = "".join(text)
        if token_logprobs:
            choice["logprobs"] = {"token_logprobs": token_logprobs, "tokens": tokens}
    out["choices"] = [choice]
    return out


def _sglang(request: Mapping[str, Any], response: Mapping[str, Any], where: str) -> tuple[dict, dict]:
    """SGLang's `/generate` pair as a completions pair: the context, the sampled ids, their
    log-probs and the ids the entries name, the finish reason's type, the sampling parameters."""
    if (
        isinstance(request.get("input_ids"), list)
        and request["input_ids"]
        and isinstance(request["input_ids"][0], list)
    ):
        raise AdapterError(f"{where}: a batch of {len(request['input_ids'])} prompts in one /generate: one is read")
    meta = mapping_of(response, "meta_info")
    entries = meta.get("output_token_logprobs")
    if entries is not None and not isinstance(entries, list):
        raise AdapterError(f"{where}: meta_info.output_token_logprobs: expected a list, got {short(entries)}")
    rows = [e if isinstance(e, list) else [None, None] for e in entries or []]
    sampled = response.get("output_ids")
    if sampled is None and entries is not None:
        sampled = [r[1] if len(r) > 1 else None for r in rows]
    finish = mapping_of(meta, "finish_reason").get("type")
    choice: dict[str, Any] = {"text": response.get("text"), "finish_reason": finish}
    if sampled is not None:
        choice["token_ids"] = sampled
    if entries is not None:
        named = [f"token_id:{r[1]}" if len(r) > 1 and isinstance(r[1], int) else None for r in rows]
        choice["logprobs"] = {"token_logprobs": [r[0] if r else None for r in rows], "tokens": named}
    params = mapping_of(request, "sampling_params")
    view: dict[str, Any] = {k: params[k] for k in ("temperature", "top_p") if params.get(k) is not None}
    view |= {"input_ids": request.get("input_ids"), "sampling_params": dict(params)}
    out: dict[str, Any] = {"choices": [choice], "meta_info": dict(meta)}
    if request.get("input_ids") is not None:
        out["prompt_token_ids"] = request["input_ids"]
    return view, out
