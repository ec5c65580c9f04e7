"""slime fixtures: `Sample.to_dict()` records (slime/utils/types.py) as the dump hook writes them,
with the engine calls the generate hook keeps in `metadata`, the train data record and the actor
record. Compliant: `compliant`, `partial_rollout`, `partial_rollout_mask_offpolicy` (M102 warnings
on the masked stale prefix), `partial_rollout_multi_turn` (no engine calls, an ambiguous resumed
turn), `removed_sample` (with the train data record) and `reinforce_plus_plus` (with the actor
record). Faults: `openrlhf_cut_not_truncated` (T306), `removed_sample_in_denominator` (U601),
`removed_sample_trained` (U607), `failed_in_statistics` (U608), `group_norm_over_batch` (U603) and
`returns_kl_unmasked` (THUDM/slime#1370, R413). With top-p replay: `top_p_nucleus` (compliant, the
nucleus SGLang returned for every sampled token) and `top_p_nucleus_shifted` (L210: the spans one
position late). With a critic (contract 1.4): `ppo_masked_gae` (compliant, GAE over the loss-mask
tokens) and `ppo_gae_over_every_position` (R416: slime's own GAE, over every response token).
Asynchronous training (contract 1.4 ratio anchor): `async_ratio_on_current_weights`
(U610: half the batch sampled one version behind, the ratio recomputed by the current weights with no
correction, radixark/miles#1829) and `compliant_async_tis` (the same batch under `--use-tis`).

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

import random
import statistics

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
        "metadata": {"engine_calls": calls(ep, "5")},
    }


def calls(ep: Episode, version: str) -> list[dict]:
    """What the generate hook keeps per engine call: the sample's response_length before the call,
    the ids SGLang returned (output_token_logprobs) and the call's weight_version."""
    out, at = [], 0
    for o, obs in zip(ep.outputs, ep.observations):
        out.append({"response_length": at, "tokens": list(o), "weight_version": version})
        at += len(o) + len(obs)
    return out


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
            first, rest = (
                rec["metadata"]["engine_calls"][0]["tokens"][:3],
                rec["metadata"]["engine_calls"][0]["tokens"][3:],
            )
            rec["metadata"] = {
                "start_rollout_id": 4,
                "engine_calls": [
                    {"response_length": 0, "tokens": first, "weight_version": "4"},
                    {"response_length": 3, "tokens": rest, "weight_version": "5"},
                ],
            }
            if mask_offpolicy:
                rec["loss_mask"][:3] = [0, 0, 0]  # the 3 tokens sampled at step 4, masked before resuming
        out.append(rec)
    return out


ARGS = {  # the slime arguments the train data hook writes with its record (slime's defaults but n and size)
    "advantage_estimator": "grpo",
    "rewards_normalization": True,
    "grpo_std_normalization": True,
    "normalize_advantages": False,
    "n_samples_per_prompt": 2,
    "rollout_batch_size": 2,
    "calculate_per_token_loss": False,
    "use_rollout_logprobs": False,
    "keep_old_actor": False,
    "use_tis": False,
    "tis_clip": 2.0,
}


def normalised(raw: list[float], per: int, size: int) -> list[float]:
    """slime's _post_process_rewards for grpo (rollout.py:612-631): consecutive blocks of `per` when
    the batch holds per·size samples, else the whole batch; mean, then Bessel std + 1e-6."""
    blocks = [raw[k : k + per] for k in range(0, len(raw), per)] if len(raw) == per * size else [raw]
    out = []
    for b in blocks:
        mean = statistics.fmean(b)
        out += [round((x - mean) / (statistics.stdev(b) + 1e-6), 6) for x in b]
    return out


def train_data(
    samples: list[dict],
    step: int,
    count_removed: bool = False,
    keep_removed_mask: bool = False,
    args: dict | None = None,
) -> dict:
    """The second hook's record: slime's rollout ids and per-rollout denominators (rollout.py:647-700),
    the normalised rewards, raw rewards and loss masks it trains on, and the arguments that decide
    them; `count_removed` sums the removed samples' masks too, as a custom converter that forgets them
    would, and `keep_removed_mask` also leaves their loss mask as sampled."""
    ids = [s["rollout_id"] for s in samples]
    used, fresh = {r for r in ids if r is not None}, 0
    for k, r in enumerate(ids):
        if r is None:
            while fresh in used:
                fresh += 1
            ids[k] = fresh
            used.add(fresh)
    sums = [
        0 if s["remove_sample"] and not (count_removed or keep_removed_mask) else sum(s["loss_mask"]) for s in samples
    ]
    per = {r: sum(m for q, m in zip(ids, sums) if q == r) for r in ids}
    raw = [s["reward"] for s in samples]
    masks = [
        [0] * len(s["loss_mask"]) if s["remove_sample"] and not keep_removed_mask else s["loss_mask"] for s in samples
    ]
    return {
        "rollout_id": step,
        "sample_indices": [s["index"] for s in samples],
        "rollout_ids": ids,
        "rollout_mask_sums": [per[r] for r in ids],
        "rewards": normalised(raw, ARGS["n_samples_per_prompt"], ARGS["rollout_batch_size"]),
        "raw_reward": raw,
        "loss_masks": masks,
        "args": {**ARGS, **(args or {})},
    }


def _removed(count_removed: bool) -> list[dict]:
    """The compliant batch where the sample filter removed sample 2, samples 2 and 3 being siblings of
    one rollout (Sample.rollout_id 7), and the train data record."""
    out = _batch(False)
    out[2]["remove_sample"] = True
    out[2]["rollout_id"] = out[3]["rollout_id"] = 7
    return [*out, train_data(out, 5, count_removed)]


def _removed_trained() -> list[dict]:
    """A custom converter (--custom-convert-samples-to-train-data-path) that leaves the removed
    sample's loss mask as sampled: its tokens enter the loss numerator (and the denominator)."""
    out = _batch(False)
    out[2]["remove_sample"] = True
    return [*out, train_data(out, 5, keep_removed_mask=True)]


def _group_norm_over_batch() -> list[dict]:
    """A compact path that splits one rollout into two training samples sharing its rollout_id
    (rollout.py:595-600): the batch holds 5 samples, not n_samples_per_prompt × rollout_batch_size,
    so slime normalises the rewards over the whole batch (rollout.py:621-623), not per prompt group."""
    out = _batch(False)
    extra = record(episode(260, 1), 4, 1, 1.0)
    out[3]["rollout_id"] = extra["rollout_id"] = 9
    out.append(extra)
    return [*out, train_data(out, 5)]


def _failed_in_statistics() -> list[dict]:
    """A sample filter removes a FAILED sample (a tool error, reward 0) from the loss with
    remove_sample, but slime still normalises every sample's reward (rollout.py:612-631): the
    failure's 0 moves its group's mean and std."""
    out = _batch(False)
    out[1].update(status="failed", remove_sample=True, reward=0.0)
    out[0]["reward"] = 1.0
    return [*out, train_data(out, 5)]


def _partial_multi_turn() -> list[dict]:
    """A three-turn sample (a custom generate) aborted inside turn 1 at version 4 and resumed at version
    5: weight_versions ["4", "4", "5", "5"] for three turns, and the dump has no engine_calls to place
    them: turn 1 began with call 1 (4) or call 2 (5)."""
    out = _batch(False)
    for rec in out:
        del rec["metadata"]["engine_calls"]
    out[2]["weight_versions"] = ["4", "4", "5", "5"]
    return out


def nucleus(ep: Episode, seed: int, late: bool = False) -> tuple[list[int], list[int]]:
    """`rollout_top_p_token_ids` and `_offsets` as slime keeps them with top-p replay on
    (slime/utils/types.py:122-125): per response token, the ids SGLang kept, the sampled one among
    two to four (in the order SGLang returns them, not sorted); a tool output's tokens get empty
    spans (types.py:304-314). `late`: each span recorded one position after its token (the first
    response token's span empty, the last one's dropped), a hook that aligned the record with the
    logits rows."""
    rng = random.Random(seed)
    spans: list[list[int]] = []
    for out, obs in zip(ep.outputs, ep.observations):
        for tok in out:
            others = rng.sample(range(3, 900), rng.randint(1, 3))
            kept = [k for k in others if k != tok]
            kept.insert(rng.randint(0, len(kept)), tok)
            spans.append(kept)
        spans += [[] for _ in obs]
    if late:
        spans = [[], *spans[:-1]]
    ids, offsets = [], [0]
    for s in spans:
        ids += s
        offsets.append(len(ids))
    return ids, offsets


def _top_p(late: bool) -> list[dict]:
    """The compliant batch sampled with --rollout-top-p 0.9 and top-p replay: each sample carries its
    recorded nucleus (with `late`, sample 2's record is one position late)."""
    out = []
    for i, (group, turns) in enumerate(((0, 1), (0, 1), (1, 3), (1, 3))):
        ep = episode(200 + i, turns)
        rec = record(ep, i, group, float(i % 2))
        ids, offsets = nucleus(ep, 300 + i, late=late and i == 2)
        rec["rollout_top_p_token_ids"], rec["rollout_top_p_token_offsets"] = ids, offsets
        out.append(rec)
    return out


def actor(samples: list[dict], step: int, unmasked_kl: bool = False) -> dict:
    """The actor hook's record (--rollout-data-postprocess-path, after compute_advantages_and_returns,
    slime/backends/megatron_utils/actor.py:503-506) for --advantage-estimator reinforce_plus_plus:
    each sample's `kl` over its response, and `returns` as get_reinforce_plus_plus_returns computes
    them (ppo_utils.py:371-445): -kl_coef·kl·loss_mask, the reward on the last loss-mask token, summed
    from the end at gamma 1. `unmasked_kl` leaves the mask off the KL, as slime did before
    THUDM/slime#1370 (the tool tokens' KL accumulates into the returns of the policy tokens before them)."""
    coef, rng = 0.05, random.Random(step)
    kls, rets = [], []
    for s in samples:
        kl = [round(rng.uniform(0.0, 0.4), 4) for _ in s["loss_mask"]]
        terms = [-coef * k * (1 if unmasked_kl else m) for k, m in zip(kl, s["loss_mask"])]
        last = max(i for i, m in enumerate(s["loss_mask"]) if m)
        terms[last] += s["reward"]
        ret, acc = [], 0.0
        for t in reversed(terms):
            acc += t
            ret.append(round(acc, 6))
        kls.append(kl)
        rets.append(ret[::-1])
    return actor_record(
        samples, step, kls, rets, {"advantage_estimator": "reinforce_plus_plus", "kl_coef": coef, "gamma": 1.0}
    )


def actor_record(samples: list[dict], step: int, kls: list, rets: list, args: dict, **more: list) -> dict:
    """The actor hook's record of `samples` (rollout_data's keys, integrations/slime.py ACTOR_KEYS)."""
    return {
        "rollout_id": step,
        "sample_indices": [s["index"] for s in samples],
        "loss_masks": [s["loss_mask"] for s in samples],
        "rewards": [s["reward"] for s in samples],
        "kl": kls,
        "returns": rets,
        **more,
        "args": args,
    }


def actor_ppo(samples: list[dict], step: int, every_position: bool = False) -> dict:
    """The actor hook's record for --advantage-estimator ppo (a critic): each sample's `values` over its
    response, `kl` (--kl-coef 0: no KL term), and `returns` = A + V of GAE with --gamma 1 and --lambd 0.95,
    the reward on the last response token (slime/backends/megatron_utils/loss.py:769-781 at 624b824).
    `every_position`: slime 624b824's recursion (ppo_utils.py:586-607, vanilla_gae; chunked_gae computes the same), over every
    response token whatever its loss mask, as radixark/miles#1827 describes; else over the loss-mask
    tokens only, as miles computes it after that fix."""
    gamma, lambd, rng = 1.0, 0.95, random.Random(100 + step)
    values, kls, rets = [], [], []
    for s in samples:
        n, mask = len(s["loss_mask"]), s["loss_mask"]
        v = [round(rng.uniform(-1.0, 1.0), 4) for _ in range(n)]
        rewards = [0.0] * (n - 1) + [s["reward"]]
        ret, adv, v_next = [0.0] * n, 0.0, 0.0
        for t in reversed(range(n)):
            if every_position or mask[t]:
                adv = rewards[t] + gamma * v_next - v[t] + gamma * lambd * adv
                v_next = v[t]
            ret[t] = round(adv + v[t], 6)
        values.append(v)
        kls.append([round(rng.uniform(0.0, 0.4), 4) for _ in range(n)])
        rets.append(ret)
    args = {"advantage_estimator": "ppo", "kl_coef": 0.0, "gamma": gamma, "lambd": lambd}
    return actor_record(samples, step, kls, rets, args, values=values)


LAYERS, TOPK, EXPERTS = 2, 2, 8  # --num-layers, --moe-router-topk and the experts of the MoE fixtures


def routes(tokens: list[int], first: int, last: int, version: int) -> list[list[list[int]]]:
    """The expert ids the engine at `version` chose at positions first .. last - 1 of `tokens`: top-k
    distinct experts per layer, a function of the position, its token and the weights."""
    out = []
    for i in range(first, last):
        base = (tokens[i] * 7 + i * 3 + version * 5) % EXPERTS
        out.append([[(base + layer * 3 + k) % EXPERTS for k in range(TOPK)] for layer in range(LAYERS)])
    return out


def with_routes(rec: dict, incremental: bool = True, appended: bool = False) -> dict:
    """`rec` as a --use-rollout-routing-replay run keeps it: each engine call's routes as slime applies
    them (slime/utils/types.py:352-394), and per call the generate hook's `routed_experts_start_len`
    (SGLang's meta_info value), `routed_experts_rows` (the rows SGLang returned) and `routed_experts_len` (the sample's rows after slime applied them).
    SGLang routes every position of the call's input and output but the last; `incremental`: it
    returns them from `routed_experts_start_len`, the rows the sample already holds (else from row 0,
    recomputed by the call's weights). `appended`: a custom generate that concatenates each call's
    rows onto the sample's instead of keeping `existing[:routed_experts_start_len]`."""
    n_prompt = len(rec["tokens"]) - rec["response_length"]
    kept: list = []
    for call in rec["metadata"]["engine_calls"]:
        end = n_prompt + call["response_length"] + len(call["tokens"])  # the tokens after this call
        start = len(kept) if incremental else 0
        new = routes(rec["tokens"], start, end - 1, int(call["weight_version"]))
        kept = kept + new if appended else kept[:start] + new
        call["routed_experts_start_len"] = start
        call["routed_experts_rows"], call["routed_experts_len"] = len(new), len(kept)
    rec["rollout_routed_experts"] = kept
    return rec


def _async(**args: bool) -> list[dict]:
    """slime's train_async loop: the next rollout is generated while the actor trains on this one, so
    prompt group 1 of step 5's batch was sampled by step 4's weights (weight_versions "4"). With
    slime's defaults the actor recomputes the ratio's old log-probs with its current weights
    (loss.py:965, :985-986) and applies no correction; `--use-tis` weighs each token by the truncated
    exp(recomputed − rollout) instead (loss.py:893-897)."""
    out = _batch(False)
    for rec in out[2:]:
        rec["weight_versions"] = ["4"] * len(rec["weight_versions"])
        for call in rec["metadata"]["engine_calls"]:
            call["weight_version"] = "4"
    return [*out, train_data(out, 5, args=args)]


def _moe(batch: list[dict], **how: bool) -> list[dict]:
    return [with_routes(rec, **how) for rec in batch]


def cases() -> dict[str, list[dict]]:
    """The slime fixture cases."""
    batch = _batch(False)
    return {
        "reinforce_plus_plus": [*batch, actor(batch, 5)],
        "returns_kl_unmasked": [*batch, actor(batch, 5, unmasked_kl=True)],
        "ppo_masked_gae": [*batch, actor_ppo(batch, 5)],
        "ppo_gae_over_every_position": [*batch, actor_ppo(batch, 5, every_position=True)],
        "removed_sample_trained": _removed_trained(),
        "group_norm_over_batch": _group_norm_over_batch(),
        "failed_in_statistics": _failed_in_statistics(),
        "partial_rollout_multi_turn": _partial_multi_turn(),
        "compliant": _batch(False),
        "openrlhf_cut_not_truncated": _batch(True),
        "partial_rollout": _partial(False),
        "partial_rollout_mask_offpolicy": _partial(True),
        "removed_sample": _removed(False),
        "removed_sample_in_denominator": _removed(True),
        "compliant_moe": _moe(_batch(False)),
        "partial_rollout_moe": _moe(_partial(False)),
        "routes_resumed_duplicated": _moe(_partial(False), incremental=False, appended=True),
        "routes_of_resumed_weights": _moe(_partial(False), incremental=False),
        "top_p_nucleus": _top_p(False),
        "top_p_nucleus_shifted": _top_p(True),
        "async_ratio_on_current_weights": _async(),
        "compliant_async_tis": _async(use_tis=True),
    }
