"""Mask and provenance checks M101-M106: each fires on its own fault, naming the trajectory,
turn and position, stays silent on a compliant log, and is not run without its inputs."""

from __future__ import annotations

import copy

import polars as pl
from checkhelp import EXCLUDED, drop_turn_field, loud, only, positions
from conftest import write_log

import rollout_audit as ra
from rollout_audit.contract.config import Config
from rollout_audit.contract.schema import context_sha256


def test_compliant_log_is_silent(records):
    rep = ra.audit(*records)
    assert not loud(rep), rep.render()
    # every stable M check whose inputs the synthetic log records ran (M107 needs template renders,
    # M110 loss streams or weights, M111 a split's exposed token, M112 a capture layer's digests)
    runnable = {c for c, r in ra.all_rules().items() if c.startswith("M") and not r.preview}
    runnable -= {"M107", "M110", "M111", "M112"}
    for code in runnable:
        assert code not in rep.not_run and code in rep.summary["checks_run"], code


# ---------------------------------------------------------------- M101


def test_m101_counts_non_policy_tokens_per_source(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    obs = positions(tr, 3, turn=2)[:2]
    tmpl = positions(tr, 4, turn=4)[0]
    for p in (*obs, tmpl):
        tr["loss_mask"][p] = True
    tr["num_trainable_tokens"] += 3
    f = only(ra.audit(trajs, ups), "M101")
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["trajectory_id"] == tr["trajectory_id"] and r["severity"] == "error"
    assert r["position"] == obs[0] and r["turn"] == 2
    assert "3 non-policy token(s) (observation 2, template 1)" in r["message"]


def test_m101_user_prompt_token_has_no_turn(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    tr["loss_mask"][4] = True  # a user token, token_turn -1
    tr["num_trainable_tokens"] += 1
    r = only(ra.audit(trajs, ups), "M101").row(0, named=True)
    assert r["position"] == 4 and r["turn"] is None and "(user 1)" in r["message"]


# ---------------------------------------------------------------- M102


def unmask_turn(tr: dict, turn: int) -> list[int]:
    """Take the policy tokens of `turn` out of the loss (keeping the recorded count right)."""
    p = positions(tr, 2, turn=turn)
    for q in p:
        tr["loss_mask"][q] = False
    tr["num_trainable_tokens"] -= len(p)
    return p


def test_m102_warns_on_unmasked_policy_tokens(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    p = unmask_turn(tr, 3)
    rep = ra.audit(trajs, ups)
    f = only(rep, "M102")
    r = f.row(0, named=True)
    assert f.height == 1 and r["severity"] == "warning" and rep.ok
    assert r["trajectory_id"] == tr["trajectory_id"] and r["turn"] == 3 and r["position"] == p[0]
    assert r["message"].startswith(f"{len(p)} of {sum(s == 2 for s in tr['token_source'])} policy-sampled")


def test_m102_silenced_by_declared_finish_reason(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    unmask_turn(tr, 3)
    tr["turns"][3]["finish_reason"] = "length"
    assert "M102" in ra.audit(trajs, ups).codes()
    rep = ra.audit(trajs, ups, config=Config(masked_ok_reasons=["length"]))
    assert not loud(rep), rep.render()
    # a declared reason excuses only its own turn
    tr["loss_mask"][positions(tr, 2, turn=1)[0]] = False
    tr["num_trainable_tokens"] -= 1
    r = only(ra.audit(trajs, ups, config=Config(masked_ok_reasons=["length"])), "M102").row(0, named=True)
    assert r["turn"] == 1 and r["message"].startswith("1 of")


# ---------------------------------------------------------------- M103


def test_m103_recorded_trainable_count(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    real = sum(tr["loss_mask"])
    tr["num_trainable_tokens"] = real + 5
    r = only(ra.audit(trajs, ups), "M103").row(0, named=True)
    assert r["trajectory_id"] == tr["trajectory_id"]
    assert r["message"] == f"num_trainable_tokens is {real + 5}, but loss_mask is true on {real} token(s)"


def test_m103_not_run_without_column(records):
    trajs, ups = records
    for tr in trajs:
        del tr["num_trainable_tokens"]
    rep = ra.audit(trajs, ups)
    assert "M103" in rep.not_run and "num_trainable_tokens" in rep.not_run["M103"]
    assert "M103" not in rep.codes()


# ---------------------------------------------------------------- M104


def test_m104_turn_policy_token_count(records):
    trajs, ups = records
    tr = trajs[5]
    n = tr["turns"][1]["num_policy_tokens"]
    tr["turns"][1]["num_policy_tokens"] = n + 2
    r = only(ra.audit(trajs, ups), "M104").row(0, named=True)
    assert (r["trajectory_id"], r["turn"], r["position"]) == (tr["trajectory_id"], 1, positions(tr, 2, 1)[0])
    assert r["message"] == f"num_policy_tokens is {n + 2}, but {n} token(s) have token_source policy and token_turn 1"


def test_m104_not_run_without_field(records):
    trajs, ups = records
    drop_turn_field(trajs, "num_policy_tokens")
    rep = ra.audit(trajs, ups)
    assert "turns.num_policy_tokens" in rep.not_run["M104"] and "M104" not in rep.codes()


# ---------------------------------------------------------------- M105


def test_m105_template_reapplied_breaks_every_later_context(records):
    trajs, ups = records
    tr = trajs[11]  # 5 turns
    tr["token_ids"][1] += 7  # the system prompt as the trainer rendered it differs
    f = only(ra.audit(trajs, ups), "M105").sort("turn")
    assert f["trajectory_id"].to_list() == [tr["trajectory_id"]] * 5
    assert f["turn"].to_list() == list(range(5))
    assert f["position"].to_list() == [positions(tr, 2, t)[0] for t in range(5)]
    assert all("context_sha256 is" in m and "context_length" not in m.split(";")[0] for m in f["message"])


def test_m105_dropped_separator_shifts_the_context(records):
    """The engine saw one more token before turn 2 than the trainer has (a separator the
    trainer dropped): context_length no longer ends at the first policy token."""
    trajs, ups = records
    tr = trajs[11]
    t2 = tr["turns"][2]
    engine_ids = list(tr["token_ids"])
    engine_ids.insert(t2["context_length"] - 1, 999)
    t2["context_length"] += 1
    t2["context_sha256"] = context_sha256(engine_ids, t2["context_length"])
    r = only(ra.audit(trajs, ups), "M105").row(0, named=True)
    first = positions(tr, 2, 2)[0]
    assert (r["trajectory_id"], r["turn"], r["position"]) == (tr["trajectory_id"], 2, first)
    assert r["message"].startswith(
        f"context_length is {first + 1}, but the turn's first policy token is at "
        f"position {first}; sha256 of token_ids[:{first + 1}]"
    )


def test_m105_context_length_out_of_range_and_case_of_hex(records):
    trajs, ups = records
    tr = trajs[11]
    tr["turns"][0]["context_sha256"] = tr["turns"][0]["context_sha256"].upper()  # hex case is not a fault
    tr["turns"][4]["context_length"] = 10_000
    r = only(ra.audit(trajs, ups), "M105").row(0, named=True)
    assert r["turn"] == 4 and "outside the trajectory's" in r["message"]


def test_m105_near_miss_digests_are_malformed(records):
    """64 characters that are not all hex digits never pass as the digest, whatever their case:
    a control character one bit away from a digit, a non-ASCII letter, upper case beyond F."""
    trajs, ups = records
    tr = trajs[11]
    right = [t["context_sha256"] for t in tr["turns"][:3]]
    digit = next(i for i, ch in enumerate(right[0]) if ch.isdigit())
    tr["turns"][0]["context_sha256"] = right[0][:digit] + chr(ord(right[0][digit]) - 0x20) + right[0][digit + 1 :]
    tr["turns"][1]["context_sha256"] = "é" + right[1][2:]  # two UTF-8 bytes: still 64 bytes
    tr["turns"][2]["context_sha256"] = "G" * 64
    f = only(ra.audit(trajs, ups), "M105")
    assert f["turn"].to_list() == [0, 1, 2], f
    assert all("is not a 64-digit hex SHA-256" in m for m in f["message"])


def test_m105_same_result_from_files_in_several_parts(tmp_path, records):
    trajs, ups = records
    trajs[3]["turns"][1]["context_sha256"] = "0" * 64
    trajs[29]["token_ids"][0] += 1
    one = ra.audit(write_log(tmp_path / "one", trajs, ups))
    many = ra.audit(write_log(tmp_path / "many", trajs, ups, parts=3))
    key = ["trajectory_id", "turn", "position", "message"]
    a = one.findings.filter(pl.col("code") == "M105").select(key).sort(key)
    assert a.height == 1 + len(trajs[29]["turns"]) and loud(one) == {"M105"}
    assert a.equals(many.findings.filter(pl.col("code") == "M105").select(key).sort(key))


def test_m105_not_run_without_context_fields(records):
    trajs, ups = records
    drop_turn_field(trajs, "context_sha256")
    rep = ra.audit(trajs, ups)
    assert "turns.context_sha256" in rep.not_run["M105"] and not loud(rep)


# ---------------------------------------------------------------- M106


def test_m106_retokenized_action(records):
    trajs, ups = records
    tr = trajs[22]  # 6 turns
    samp = tr["turns"][3]["sampled_token_ids"]
    assert len(samp) >= 1
    samp[-1] += 1000  # the engine sampled another id than the one the trainer holds
    r = only(ra.audit(trajs, ups), "M106").row(0, named=True)
    p = positions(tr, 2, 3)
    assert (r["trajectory_id"], r["turn"], r["position"]) == (tr["trajectory_id"], 3, p[-1])
    assert f"differ from sampled_token_ids at 1 position(s); first at turn offset {len(p) - 1}" in r["message"]
    assert f"trainer has id {tr['token_ids'][p[-1]]}, the engine sampled {samp[-1]}" in r["message"]


def test_m106_length_differs(records):
    trajs, ups = records
    tr = trajs[22]
    tr["turns"][0]["sampled_token_ids"].append(5)
    tr["turns"][5]["sampled_token_ids"] = []
    f = only(ra.audit(trajs, ups), "M106").sort("turn")
    assert f["turn"].to_list() == [0, 5] and set(f["trajectory_id"]) == {tr["trajectory_id"]}
    n0 = tr["turns"][0]["num_policy_tokens"]
    assert f["message"][0] == (
        f"the engine sampled {n0 + 1} token(s) (sampled_token_ids), the trainer has {n0} policy token(s) in this turn"
    )
    assert f["position"].to_list() == [positions(tr, 2, 0)[0], positions(tr, 2, 5)[0]]


def test_m106_null_sampled_ids_not_compared_and_not_run_without_field(records):
    trajs, ups = records
    trajs[22]["turns"][2]["sampled_token_ids"] = None
    assert not loud(ra.audit(trajs, ups))
    drop_turn_field(trajs, "sampled_token_ids")
    rep = ra.audit(trajs, ups)
    assert "turns.sampled_token_ids" in rep.not_run["M106"] and not loud(rep)


def test_malformed_rows_are_left_out_only_by_checks_that_read_the_bad_list(records):
    trajs, ups = records
    tr = trajs[EXCLUDED]
    tr["loss_mask"] = tr["loss_mask"][:-1]  # loss_mask misaligned: S003
    tr["turns"][0]["num_policy_tokens"] += 1  # M104 reads token_source and token_turn, which still line up
    tr["num_trainable_tokens"] += 1  # M103 counts loss_mask alone: it still recomputes this row
    rep = ra.audit(trajs, ups)
    assert loud(rep) == {"S003", "M103", "M104"}, rep.render()
    # M101 aligns loss_mask with token_source: it leaves the row out and says so
    assert rep.partial["M101"] == "ran on 31 of 32 trajectories; 1 have token lists of different lengths (S003)"
    assert "M104" not in rep.partial and "M103" not in rep.partial and rep.exit_code() == 1


def test_m105_malformed_hash(records):
    trajs, ups = records
    tr = trajs[11]
    tr["turns"][1]["context_sha256"] = "not-a-hash"
    r = only(ra.audit(trajs, ups), "M105").row(0, named=True)
    assert (r["trajectory_id"], r["turn"]) == (tr["trajectory_id"], 1)
    assert r["message"] == "context_sha256 'not-a-hash' is not a 64-digit hex SHA-256"


def test_policy_token_tagged_with_an_earlier_turn(records):
    """A sampled token of turn 2 tagged as turn 0: both turns' counts, ids and log-prob sums
    disagree with what was recorded (the per-turn grouping must not assume turn order)."""
    trajs, ups = records
    tr = trajs[22]
    p = positions(tr, 2, turn=2)[-1]
    tr["token_turn"][p] = 0
    rep = ra.audit(trajs, ups)
    assert loud(rep) == {"M104", "M106", "L202"}, rep.render()
    for code in ("M104", "M106", "L202"):
        f = rep.findings.filter(pl.col("code") == code).sort("turn")
        assert f["turn"].to_list() == [0, 2] and set(f["trajectory_id"]) == {tr["trajectory_id"]}, code


# ---------------------------------------------------------------- M107


def with_template(tr: dict, extra_before: dict[int, int] | None = None) -> None:
    """Record the chat template's render before each turn of `tr`: the trainer's own prefix, with
    `extra_before[t]` separator tokens more before turn t (what the template writes and the
    trainer's incremental builder dropped)."""
    for t, turn in enumerate(tr["turns"]):
        pos = positions(tr, 2, t)[0]
        render = tr["token_ids"][:pos] + [198] * (extra_before or {}).get(t, 0)
        turn["template_context_length"] = len(render)
        turn["template_context_sha256"] = context_sha256(render, len(render))


def test_m107_separator_missing_before_later_turns(records):
    trajs, ups = records
    tr = trajs[11]  # 5 turns
    with_template(tr, {t: t for t in range(1, 5)})  # one separator more per earlier turn
    f = only(ra.audit(trajs, ups), "M107").sort("turn")
    assert f["turn"].to_list() == [1, 2, 3, 4] and set(f["trajectory_id"]) == {tr["trajectory_id"]}
    assert f["position"].to_list() == [positions(tr, 2, t)[0] for t in range(1, 5)]
    assert "renders the same conversation as" in f["message"][0]


def test_m107_same_length_other_ids_and_silent_when_the_render_matches(records):
    trajs, ups = records
    with_template(trajs[11])
    with_template(trajs[3])
    assert "M107" not in ra.audit(trajs, ups).codes()
    trajs[3]["turns"][1]["template_context_sha256"] = "0" * 64
    r = only(ra.audit(trajs, ups), "M107").row(0, named=True)
    assert (r["trajectory_id"], r["turn"]) == (trajs[3]["trajectory_id"], 1) and "other ids" in r["message"]


def test_m107_not_run_without_a_template_render(records):
    rep = ra.audit(*records)
    assert "turns.template_context_length" in rep.not_run["M107"]


# ---------------------------------------------------------------- M110: loss streams


def test_echo_stream_is_clean_and_m110_fires_on_a_wrong_stream_or_weight(records):
    from rollout_audit.faults import apply
    from rollout_audit.faults.base import Ctx
    from rollout_audit.faults.masks import echo_stream

    trajs, ups = records
    assert {"M110"} & set(ra.audit(trajs, ups).codes()) == set()
    ctx = Ctx(copy.deepcopy(trajs), copy.deepcopy(ups), 0)
    echoed = echo_stream(ctx)  # prime-rl's echo: tool bodies trained on purpose in stream 1
    assert not loud(ra.audit(ctx.trajs, ctx.updates))
    # the same tool tokens trained in the policy stream: M101, as without streams
    echoed[0]["loss_stream"] = [0] * len(echoed[0]["token_ids"])
    f = only(ra.audit(ctx.trajs, ctx.updates), "M101")
    assert f["trajectory_id"].to_list() == [echoed[0]["trajectory_id"]] and "observation" in f["message"][0]
    (t2, u2), touched = apply("echo_stream_takes_next_action", trajs, ups)
    f = only(ra.audit(t2, u2), "M110")
    assert f["trajectory_id"].to_list() == touched and "(policy token)" in f["message"][0]
    # the template tokens around the tool body in the echo stream: M110, and M101 (trained at all)
    t = next(t for t in ctx.trajs if 4 in t["token_source"] and t in echoed)
    for i, s in enumerate(t["token_source"]):
        if s == 4:
            t["loss_mask"][i], t["loss_stream"][i], t["loss_weight"][i] = True, 1, 1.0
    rep = ra.audit(ctx.trajs, ctx.updates, config=Config(select=["M101", "M110"]))
    assert (
        loud(rep) == {"M101", "M110"}
        and "template token" in rep.findings.filter(pl.col("code") == "M110")["message"][0]
    )
    (t2, u2), touched = apply("loss_weight_on_masked_token", trajs, ups)
    f = only(ra.audit(t2, u2), "M110")
    assert f["trajectory_id"].to_list() == touched and "positive loss_weight" in f["message"][0]
    t = next(t for t in t2 if t["trajectory_id"] not in touched and any(t["loss_mask"]))
    t["loss_weight"][t["loss_mask"].index(True)] = 0.0
    t["loss_weight"][0] = float("nan")
    msgs = ra.audit(t2, u2).findings.filter(pl.col("trajectory_id") == t["trajectory_id"])["message"].to_list()
    assert any("loss_weight 0 (dropped silently)" in m for m in msgs) and any("non-finite" in m for m in msgs)


# ---------------------------------------------------------------- M112


def _stamped(trajs):
    """Every turn stamped with NeMo Gym's digest of its context and sampled ids, as its capture does."""
    from rollout_audit.contract.digests import NEMO_GYM_TOKENS, nemo_gym_entry

    for t in trajs:
        for tr in t["turns"]:
            tr["capture_digest"] = nemo_gym_entry([*t["token_ids"][: tr["context_length"]], *tr["sampled_token_ids"]])
            tr["capture_digest_scheme"] = NEMO_GYM_TOKENS
    return trajs


def _m112(trajs, ups):
    return ra.audit(trajs, ups)


def test_m112_silent_on_true_stamps_and_firing_where_the_tokens_changed(records):
    trajs, ups = records
    _stamped(trajs)
    rep = _m112(trajs, ups)
    assert not loud(rep) and "M112" in rep.summary["checks_run"], rep.render()
    tr = trajs[3]
    tr["turns"][-1]["capture_digest"] = tr["turns"][-1]["capture_digest"][::-1].upper()  # another stamp, any case
    f = only(_m112(trajs, ups), "M112").row(0, named=True)
    last = len(tr["turns"]) - 1
    assert (f["trajectory_id"], f["turn"], f["position"]) == (
        tr["trajectory_id"],
        last,
        tr["turns"][-1]["context_length"],
    )
    assert "(nemo-gym-tokens-v1) is not the digest of the call's" in f["message"], f["message"]


def test_m112_names_a_scheme_it_does_not_know_and_leaves_m105s_turns_to_m105(records):
    trajs, ups = records
    _stamped(trajs)
    trajs[5]["turns"][0]["capture_digest_scheme"] = "sha1-of-text"
    f = only(_m112(trajs, ups), "M112").row(0, named=True)
    assert f["trajectory_id"] == trajs[5]["trajectory_id"] and "'sha1-of-text' is not one" in f["message"]
    trajs[5]["turns"][0]["capture_digest_scheme"] = trajs[6]["turns"][0]["capture_digest_scheme"]
    trajs[7]["turns"][1]["context_sha256"] = context_sha256([1, 2, 3])  # the context is not the row's prefix
    trajs[7]["turns"][1]["capture_digest"] = "0" * 64
    assert {c for c in loud(_m112(trajs, ups))} == {"M105"}


def test_m112_not_run_without_capture_digests(records):
    rep = _m112(*records)
    assert "turns.capture_digest" in rep.not_run["M112"] and "M112" not in rep.codes()
