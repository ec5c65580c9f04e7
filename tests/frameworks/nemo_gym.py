"""NeMo Gym token-id capture fixtures (nemo-gym 0.7.0 needs Python >= 3.13.14, so its classes cannot be
installed here: the records are written from the shapes of its source, as each model would dump them).

- rebuilt rollouts: the rollout collection's output lines, `response.output` rebuilt by
  `builder.project_chain_to_output_items` (each token-bearing item's `prompt_token_ids` the contiguous
  sequence so far), top-level `reward`, `_ng_task_index` / `_ng_rollout_index` (rollout_collection.py:2596-2610);
- TokenEntry lines (`records.py:108-180`, `orjson.dumps(..., OPT_SORT_KEYS)`, store.py:234) with their
  lineage (`parent_call_id`, `cum_len`, `digest`, `parent_resolution`), one child stored as a delta prompt;
- a RolloutReceipt and its StagedCallRecords (`staging/records.py:139-409`), digests computed from the
  layout `staging/digest.py` documents.

ChatML-style ids: 1 <|im_start|>, 2 <|im_end|>, 3 newline, 30 assistant, 31 user, 33 tool."""

from __future__ import annotations

import copy

from rollout_audit.adapters import nemo_gym_digest as D

HEADER = [1, 30, 3]
PROMPT = [1, 31, 3, 22, 23, 24, 2, 3, *HEADER]
TOOL = [3, 1, 33, 3, 40, 41, 2, 3, *HEADER]


def _item(prompt: list[int], gen: list[int], lps: list[float], text: str) -> dict:
    return {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
        "prompt_token_ids": prompt,
        "generation_token_ids": gen,
        "generation_log_probs": lps,
    }


def rollout(task: int, index: int, reward: float, gens: list[list[int]]) -> dict:
    """A finished rollout record whose output was rebuilt from two or more captured calls."""
    seq = list(PROMPT)
    output = []
    for t, gen in enumerate(gens):
        if t:
            seq += TOOL
        output.append(_item(list(seq), gen, [-0.5 / (k + 1) for k in range(len(gen))], f"action {t}"))
        seq += gen
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "open the door"}]},
        "response": {"id": f"resp-{task}-{index}", "object": "response", "model": "policy", "output": output},
        "reward": reward,
        "_ng_task_index": task,
        "_ng_rollout_index": index,
        "_ng_token_capture": {"n_calls": len(gens), "chains": 1, "roots": 1, "delivered_fraction": 1.0},
    }


def entry(rid: str, cid: str, prompt: list[int], gen: list[int], parent: dict | None, delta: bool = False) -> dict:
    """A TokenEntry with its lineage stamped (records.py:235-261): `digest` of prompt + generation."""
    full = (parent["_full"] + prompt) if delta and parent else prompt
    rec = {
        "schema_version": 1,
        "rollout_id": rid,
        "model_call_id": cid,
        "model": "policy",
        "prompt_token_ids": prompt,
        "generation_token_ids": gen,
        "generation_log_probs": [-0.25] * len(gen),
        "routed_experts": None,
        "output_items": [{"type": "message", "role": "assistant", "content": []}],
        "token_item_index": 0,
        "response_id": f"resp-{cid}",
        "created_at": float(len(full)),
        "parent_call_id": None if parent is None else parent["model_call_id"],
        "cum_len": len(full) + len(gen),
        "digest": D.entry_digest(full + gen),
        "parent_resolution": "root" if parent is None else "resolved",
        "parent_resolution_reason": "",
        "continuation_fingerprint": "",
        "continuation_context_len": 0,
        "continuation_context_digest": "",
        "fingerprint_version": None,
        "prompt_is_delta": delta,
        "prefix_requested": False,
        "prefix_supplied": False,
        "_full": full + gen,
    }
    return rec


def captured(rid: str, *, break_link: bool = False) -> list[dict]:
    """Three calls of one rollout: a root, a child stored whole, a grandchild stored as a delta."""
    root = entry(rid, "call-a", list(PROMPT), [50, 51, 2], None)
    child_prompt = root["_full"] + TOOL
    if break_link:  # the harness re-rendered the history: the child's prompt no longer extends its parent
        child_prompt = [*PROMPT[:4], 29, *PROMPT[5:], 50, 51, 2, *TOOL]
    child = entry(rid, "call-b", child_prompt, [52, 53, 2], root)
    grandchild = entry(rid, "call-c", list(TOOL), [54, 2], child, delta=True)
    return [{k: v for k, v in e.items() if k != "_full"} for e in (root, child, grandchild)]


def rewritten_after_capture(rid: str) -> list[dict]:
    """The three calls, the last one's final sampled id rewritten in its entry after the capture stamped
    its digest (a parser normalising the end token, an edit in staging): Gym's builder never compares
    an entry's digest with its own tokens, M112 does."""
    recs = captured(rid)
    recs[2]["generation_token_ids"] = [*recs[2]["generation_token_ids"][:-1], 7]
    return recs


def staged(rid: str, cid: str, parent: dict | None, carry: list[int], gen: list[int], version: int) -> dict:
    """A StagedCallRecord of one call's delta (staging/digest.py:266-287) with every digest computed."""
    ids = carry + gen
    prev = 0 if parent is None else parent["cum_len"]
    rec = {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": rid,
        "model_call_id": cid,
        "parent_call_id": None if parent is None else parent["model_call_id"],
        "mode": "text" if parent is None else "token_in",
        "prev_len": prev,
        "delta_len": len(ids),
        "cum_len": prev + len(ids),
        "weight_version": version,
        "token_ids_delta": ids,
        "token_mask_delta": [0.0] * len(carry) + [1.0] * len(gen),
        "generation_log_probs_delta": [0.0] * len(carry) + [-0.125] * len(gen),
        "extras_digest": D.extras_digest(None),
        "chain_hash": D.chain_hash(None if parent is None else parent["chain_hash"], ids),
        "cumulative_hash": D.prefix_hash((parent["_seq"] if parent else []) + ids),
        "extras": None,
        "_seq": (parent["_seq"] if parent else []) + ids,
    }
    rec["digest"] = D.staged_digest(rec)
    return rec


def ledger(rid: str, versions: tuple[int, int] = (4, 4)) -> list[dict]:
    """A sealed rollout of the external-staging path: its receipt and the two staged calls."""
    a = staged(rid, "call-1", None, list(PROMPT), [60, 61, 2], versions[0])
    b = staged(rid, "call-2", a, list(TOOL), [62, 2], versions[1])
    keys = ("model_call_id", "parent_call_id", "prev_len", "delta_len", "cum_len", "weight_version", "digest")
    keys += ("extras_digest", "mode", "chain_hash", "cumulative_hash")
    manifest = [
        {
            "schema_version": 2,
            "digest_version": 2,
            "extras_digest_version": 1,
            **{k: s[k] for k in keys},
            "staging_key": f"{rid}/{s['model_call_id']}",
            "response_id": f"resp-{s['model_call_id']}",
            "admitted_at": None,
            "output_fingerprint": None,
            "continuation_fingerprint": None,
            "fingerprint_version": 0,
        }
        for s in (a, b)
    ]
    receipt = {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": rid,
        "reward": 1.0,
        "terminal_model_call_id": "call-2",
        "manifest": manifest,
        "capture_poisoned": False,
        "failure_reason": None,
        "terminal_selection": "response_id",
        "terminal_attribution_reason": "response_id matched",
    }
    return [receipt, *({k: v for k, v in s.items() if k != "_seq"} for s in (a, b))]


def cases() -> dict[str, list[dict]]:
    base = [rollout(0, 0, 1.0, [[50, 51, 2], [52, 53, 2]]), rollout(0, 1, 0.0, [[55, 2], [56, 57, 2]])]
    compliant = base + captured("1-0") + ledger("2-0")
    broken = copy.deepcopy(base) + captured("1-0", break_link=True)
    regressed = copy.deepcopy(base) + ledger("2-0", versions=(5, 4))
    rewritten = copy.deepcopy(base) + rewritten_after_capture("1-0")
    return {
        "compliant": compliant,
        # a call's recorded parent whose sequence its prompt does not begin with (M105 at that call)
        "parent_prefix_mismatch": broken,
        # the second call answered by an engine on older weights than the first (P502)
        "weight_version_regressed": regressed,
        # an entry's sampled id rewritten after the capture stamped its digest (M112 at that call)
        "token_rewritten_after_capture": rewritten,
    }
