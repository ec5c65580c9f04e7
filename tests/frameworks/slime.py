"""slime fixtures: `Sample.to_dict()` records (slime/utils/types.py) as the dump hook writes them.
Cases: `compliant`; `openrlhf_cut_not_truncated` (OpenRLHF-style: a multi-turn episode cut at
the response budget is recorded COMPLETED instead of TRUNCATED, as OpenRLHF's multi-turn agent
never sets truncated); `partial_rollout` and `partial_rollout_mask_offpolicy` (samples aborted at
one rollout step and resumed at the next); `removed_sample` (a sample filter removed one, with the
train data record of the second hook); `removed_sample_in_denominator` (a custom converter that
counts the removed sample's tokens in its rollout's denominator).

Shapes as at THUDM/slime 624b824: Sample fields `group_index`, `index`, `rollout_id`, `tokens`,
`response_length`, `reward`, `loss_mask`, `weight_versions`, `rollout_log_probs`, `remove_sample`,
`status`, `metadata` (slime/utils/types.py:93-146; `to_dict` :222-227 writes the status as its
value). `weight_versions` gains one entry per engine call that returns a finish reason
(types.py:397-408); a partial rollout resumes an aborted sample (status "aborted", finish "abort")
with another call on prompt + partial response (slime/rollout/sglang_rollout.py:160-173, 206-219),
so a resumed single-turn sample has two versions, and `--mask-offpolicy-in-partial-rollout` zeroes
the earlier response's loss mask first (sglang_rollout.py:232-233); `abort()` notes
`metadata["start_rollout_id"]` (:363-364). The train data record is what `_convert_samples_to_train_data`
builds (slime/ray/rollout.py:647-700): `rollout_ids` (None -> fresh ids from 0 skipping used
ones), loss masks zeroed for `remove_sample` (:680-681), and `rollout_mask_sums`, each sample's
rollout's summed loss mask."""

from __future__ import annotations

from .chat import Episode, episode

MAX_RESPONSE = 76  # --rollout-max-response-len of these rollouts: the budget runs out inside turn 3's output


def record(ep: Episode, index: int, group: int, reward: float, status: str = "completed") -> dict:
    """One sample as the hook writes it: the Sample.to_dict() fields the adapter reads."""
    resp = ep.response()
    return {
        "rollout_id": None,
        "group_index": group,
        "index": index,
        "tokens": ep.prompt + resp,
        "response_length": len(resp),
        "reward": reward,
        "loss_mask": ep.mask(),
        "weight_versions": ["5"] * len(ep.outputs),
        "rollout_log_probs": ep.response_logprobs(),
        "remove_sample": False,
        "status": status,
        "metadata": {},
    }


def _cut(ep: Episode, limit: int) -> Episode:
    """The episode as the engine left it when the response budget ran out mid-turn."""
    total = 0
    for t, (o, obs) in enumerate(zip(ep.outputs, ep.observations)):
        if total >= limit:
            raise ValueError("the limit falls inside an observation")
        if total + len(o) >= limit:
            keep = limit - total
            return Episode(
                ep.prompt,
                ep.outputs[:t] + [o[:keep]],
                ep.logprobs[:t] + [ep.logprobs[t][:keep]],
                ep.observations[:t] + [[]],
            )
        total += len(o) + len(obs)
    raise ValueError("episode shorter than the limit")


def _batch(cut: bool) -> list[dict]:
    """Two groups of two; with `cut`, sample 3 ran into the budget and is still COMPLETED."""
    out = []
    for i, (group, turns) in enumerate(((0, 1), (0, 1), (1, 3), (1, 3))):
        ep = episode(200 + i, turns)
        if cut and i == 3:
            ep = _cut(episode(200 + i, 6), MAX_RESPONSE)
        out.append(record(ep, i, group, float(i % 2)))
    return out


def _partial(mask_offpolicy: bool) -> list[dict]:
    """Two groups of two single-turn samples (slime's default generate) at rollout step 5: samples 1
    and 2 were aborted at step 4 after a few tokens and resumed with step 5's weights."""
    out = []
    for i, group in enumerate((0, 0, 1, 1)):
        rec = record(episode(300 + i, 1), i, group, float(i % 2))
        rec["weight_versions"] = ["5"]
        if i in (1, 2):
            rec["weight_versions"] = ["4", "5"]  # the aborted call's version, then the resumed call's
            rec["metadata"] = {"start_rollout_id": 4}
            if mask_offpolicy:
                rec["loss_mask"][:3] = [0, 0, 0]  # the 3 tokens sampled at step 4, masked before resuming
        out.append(rec)
    return out


def train_data(samples: list[dict], step: int, count_removed: bool = False) -> dict:
    """The second hook's record: slime's rollout ids and per-rollout denominators (rollout.py:647-700);
    `count_removed` sums the removed samples' masks too, as a custom converter that forgets them would."""
    ids = [s["rollout_id"] for s in samples]
    used, fresh = {r for r in ids if r is not None}, 0
    for k, r in enumerate(ids):
        if r is None:
            while fresh in used:
                fresh += 1
            ids[k] = fresh
            used.add(fresh)
    sums = [0 if s["remove_sample"] and not count_removed else sum(s["loss_mask"]) for s in samples]
    per = {r: sum(m for q, m in zip(ids, sums) if q == r) for r in ids}
    return {
        "rollout_id": step,
        "sample_indices": [s["index"] for s in samples],
        "rollout_ids": ids,
        "rollout_mask_sums": [per[r] for r in ids],
    }


def _removed(count_removed: bool) -> list[dict]:
    """The compliant batch where the sample filter removed sample 2, samples 2 and 3 being siblings of
    one rollout (Sample.rollout_id 7), and the train data record."""
    out = _batch(False)
    out[2]["remove_sample"] = True
    out[2]["rollout_id"] = out[3]["rollout_id"] = 7
    return [*out, train_data(out, 5, count_removed)]


def cases() -> dict[str, list[dict]]:
    """The slime fixture cases."""
    return {
        "compliant": _batch(False),
        "openrlhf_cut_not_truncated": _batch(True),
        "partial_rollout": _partial(False),
        "partial_rollout_mask_offpolicy": _partial(True),
        "removed_sample": _removed(False),
        "removed_sample_in_denominator": _removed(True),
    }
