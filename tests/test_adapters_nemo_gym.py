"""NeMo Gym token-id capture through `check --from nemo_gym`: the digests implemented a second time
against Gym's published conformance vectors, the compliant fixture audits clean, a broken parent link
and a weight-version regression are findings naming the rollout and the call, and bad records are one
line naming file, record and field (exit 2). nemo-gym 0.7.0 needs Python >= 3.13.14 and cannot be
installed here: the fixtures are written from its source shapes (tests/frameworks/nemo_gym.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adapterhelp import FIXTURES, cli, one_line, opts
from frameworks import nemo_gym as gen

from rollout_audit.adapters import load
from rollout_audit.adapters import nemo_gym_digest as D
from rollout_audit.adapters.base import read_dump

CONTEXT = opts(
    [
        "environment_id=doors",
        "environment_version=v1",
        "verifier_version=v1",
        "reset_seed=0",
        "stop_reason=success",
        "policy_version=4",
    ]
)

# nemo-gym 0.7.0 token_id_capture/staging/conformance/golden_vectors.json: language-neutral inputs and
# the digests Gym publishes for them (its `assert_golden_vectors`)
GOLDEN_EXTRAS = {"routed_experts": [[[1, 2]], [[3, 4]]]}
GOLDEN_EXTRAS_DIGEST = "032024e899456be6e9a78c6d0399c5112d2ca7fa18d4ea9cf0d8cb7d0094f3a3"
GOLDEN_CALL = {
    "schema_version": 2,
    "digest_version": 2,
    "extras_digest_version": 1,
    "rollout_id": "rollout-1",
    "model_call_id": "call-1",
    "parent_call_id": "parent-1",
    "mode": "token_in",
    "prev_len": 3,
    "delta_len": 2,
    "cum_len": 5,
    "weight_version": 7,
    "token_ids_delta": [10, 11],
    "token_mask_delta": [0.0, 1.0],
    "generation_log_probs_delta": [0.0, -0.25],
    "extras_digest": GOLDEN_EXTRAS_DIGEST,
    "chain_hash": "1" * 64,
    "cumulative_hash": "2" * 64,
}
GOLDEN_CALL_DIGEST = "1122c7fe7e914c809eb9b1c09b26d94a50c1eb2790e7430fbcd8363b846ccf27"
# Gym publishes no vectors for these three: the values Gym 0.7.0's own functions return
# (records.compute_digest, staging.digest.hash_token_ids and compute_chain_hash, run once from the wheel)
ENTRY_123 = "bf99633051449f0f3248b4995a7c8468b9561d7732447341916085f12ff9ff54"
ENTRY_EMPTY = "2e222d36d0c6ae1db1ec18b3f96d9a46df5db61b40137bbfbac4cdf0acde9763"
PREFIX_123 = "4684ad7ad2412b902ad240cdfb11427345d0ff81f93cacabeb48914a4ea9e32e"
CHAIN_ROOT_567 = "ebccb4279798822b793da7a290af5d7b17b559fd8c900c1c0b8ff8152c99161a"
CHAIN_CHILD_89 = "cbfdb0bd9623c8d18a1ac5ac2c04c603778f1d39af3e90d5628ab132e76b2793"


def test_the_digests_match_gyms_conformance_vectors():
    assert D.extras_digest(GOLDEN_EXTRAS) == GOLDEN_EXTRAS_DIGEST
    assert D.staged_digest(GOLDEN_CALL) == GOLDEN_CALL_DIGEST
    assert D.staged_digest({**GOLDEN_CALL, "weight_version": 8}) != GOLDEN_CALL_DIGEST
    assert D.entry_digest([1, 2, 3]) == ENTRY_123 and D.entry_digest([]) == ENTRY_EMPTY
    assert D.prefix_hash([1, 2, 3]) == PREFIX_123
    assert D.chain_hash(None, [5, 6, 7]) == CHAIN_ROOT_567
    assert D.chain_hash(CHAIN_ROOT_567, [8, 9]) == CHAIN_CHILD_89


def check(path: Path | str, *extra: str):
    res = cli("check", "--from", "nemo_gym", path, *CONTEXT, "--format", "json", *extra)
    return res, (json.loads(res.stdout) if res.stdout.startswith("{") else None)


def test_the_compliant_fixture_audits_clean():
    res, rep = check(FIXTURES / "nemo_gym" / "compliant.jsonl")
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    # two rebuilt rollouts, the capture of one rollout, one sealed receipt
    assert rep["summary"]["rows_read"] == 4, rep["summary"]


def test_a_call_whose_prompt_leaves_its_parents_sequence_is_m105_at_that_call():
    res, rep = check(FIXTURES / "nemo_gym" / "parent_prefix_mismatch.jsonl")
    assert res.exit_code == 1, res.output
    found = {(f["code"], f["trajectory_id"], f["turn"]) for f in rep["findings"]}
    # call-b (turn 1) names call-a as its parent but re-rendered the history; call-c extends call-b
    assert ("M105", "1-0/capture", 1) in found and {c for c, _, _ in found} == {"M105"}, found


def test_a_staged_call_on_older_weights_than_its_parent_is_p502():
    res, rep = check(FIXTURES / "nemo_gym" / "weight_version_regressed.jsonl")
    assert res.exit_code == 1, res.output
    errors = {(f["code"], f["trajectory_id"], f["turn"]) for f in rep["findings"] if f["severity"] == "error"}
    assert errors == {("P502", "2-0", 1)}, errors


def _write(tmp: Path, records: list[dict], name: str = "dump.jsonl") -> Path:
    p = tmp / name
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return p


def _m112(path: Path):
    res, rep = check(path)
    return res, {(f["code"], f["trajectory_id"], f["turn"]) for f in rep["findings"]}, rep


def test_the_captures_digests_are_recomputed_by_m112_on_the_compliant_capture(tmp_path):
    res, found, rep = _m112(_write(tmp_path, gen.captured("1-0")))
    assert res.exit_code == 0 and not found and "M112" in rep["summary"]["checks_run"], res.output


def test_an_entry_whose_digest_disagrees_with_its_tokens_is_m112_at_that_call(tmp_path):
    recs = gen.captured("1-0")
    recs[1]["digest"] = D.entry_digest([9, 9, 9])
    res, found, rep = _m112(_write(tmp_path, recs))
    assert res.exit_code == 1 and found == {("M112", "1-0/capture", 1)}, res.output
    f = rep["findings"][0]
    assert f["file"].endswith("dump.jsonl:1") and "nemo-gym-tokens-v1" in f["message"], f  # the path's root entry
    # M112 is stable: a plain check runs it, no --preview needed
    res, rep = check(_write(tmp_path, recs))
    assert res.exit_code == 1 and "M112" in rep["summary"]["counts"], rep["summary"]


def test_a_delta_prompt_is_rebuilt_through_its_parent_before_its_digest_is_checked(tmp_path):
    recs = gen.captured("1-0")
    assert recs[2]["prompt_is_delta"] and recs[2]["prompt_token_ids"] == gen.TOOL
    table = load("nemo_gym").to_contract(read_dump(_write(tmp_path, recs)), policy_version=1)
    assert table.column("token_ids").to_pylist()[0][-2:] == [54, 2]
    recs[2]["prompt_token_ids"] = [99, *gen.TOOL[1:]]  # the suffix was rewritten: the chain no longer hashes
    res, found, _ = _m112(_write(tmp_path, recs))
    assert res.exit_code == 1 and found == {("M112", "1-0/capture", 2)}, res.output


def test_a_re_rendered_child_is_m105_and_not_also_m112(tmp_path):
    """The child's digest is true to its own (re-rendered) prompt: M105 names the broken link, M112
    judges only calls whose context is the trainer's prefix."""
    res, found, _ = _m112(_write(tmp_path, gen.captured("1-0", break_link=True)))
    assert res.exit_code == 1 and {c for c, _, _ in found} == {"M105"}, res.output


def test_a_ledger_chain_hash_that_does_not_chain_isone_line(tmp_path):
    recs = gen.ledger("2-0")
    receipt, a, b = recs
    b["chain_hash"] = D.chain_hash(None, b["token_ids_delta"])  # chained from nothing, not from call-1
    b["digest"] = D.staged_digest(b)  # the staged record is consistent with itself
    receipt["manifest"][1] |= {"chain_hash": b["chain_hash"], "digest": b["digest"]}
    line = one_line(check(_write(tmp_path, [receipt, a, b]))[0])
    assert "rollout 2-0" in line and "call call-2" in line and "chain_hash" in line, line


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda r: r["manifest"][1].update(prev_len=3), "prev_len"),
        (lambda r: r["manifest"][1].update(parent_call_id="call-9"), "parent_call_id"),
        (lambda r: r.update(terminal_model_call_id="call-7"), "terminal_model_call_id"),
    ],
)
def test_a_receipt_whose_manifest_does_not_form_a_chain_isone_line(tmp_path, edit, field):
    receipt, a, b = gen.ledger("2-0")
    edit(receipt)
    line = one_line(check(_write(tmp_path, [receipt, a, b]))[0])
    assert "receipt of rollout 2-0" in line and field in line, line


def test_a_staged_record_edited_after_staging_isone_line(tmp_path):
    receipt, a, b = gen.ledger("2-0")
    a["generation_log_probs_delta"][-1] = -9.0
    line = one_line(check(_write(tmp_path, [receipt, a, b]))[0])
    assert "dump.jsonl:2" in line and "call call-1" in line and "digest" in line, line


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda item: item.update(generation_log_probs=item["generation_log_probs"][:-1]), "generation_log_probs"),
        (lambda item: item.update(prompt_token_ids="1 2 3"), "prompt_token_ids"),
        (lambda item: item.update(generation_token_ids=[1, "x"]), "generation_token_ids"),
    ],
)
def test_a_rebuilt_item_of_the_wrong_shape_isone_line(tmp_path, edit, field):
    rec = gen.rollout(0, 0, 1.0, [[50, 51, 2], [52, 53, 2]])
    edit(rec["response"]["output"][1])
    line = one_line(check(_write(tmp_path, [rec]))[0])
    assert "dump.jsonl:1" in line and "rollout 0-0" in line and "output[1]" in line and field in line, line


def test_a_newer_token_entry_is_refused(tmp_path):
    recs = gen.captured("1-0")
    recs[0]["schema_version"] = 2
    line = one_line(check(_write(tmp_path, recs))[0])
    assert "schema_version 2" in line, line


def test_a_masked_rollout_is_excluded_from_the_loss(tmp_path):
    rec = gen.rollout(0, 0, 1.0, [[50, 51, 2]]) | {"mask_sample": True}
    row = load("nemo_gym").to_contract(read_dump(_write(tmp_path, [rec])), policy_version=1).to_pylist()[0]
    assert row["loss_excluded"] is True and not any(row["loss_mask"])


def test_a_masked_rollout_gym_could_not_rebuild_is_named_not_audited(tmp_path):
    tokenless = gen.rollout(1, 0, 0.0, [[50, 2]]) | {"mask_sample": True}
    for item in tokenless["response"]["output"]:
        del item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"]
    res, rep = check(_write(tmp_path, [gen.rollout(0, 0, 1.0, [[50, 2]]), tokenless]))
    assert res.exit_code == 0 and rep["summary"]["rows_read"] == 1, res.output
    assert "1 rollout record(s) masked by NeMo Gym" in res.stderr and "dump.jsonl:2" in res.stderr
    del tokenless["mask_sample"]  # not masked, and no token ids: the capture was never rebuilt
    line = one_line(check(_write(tmp_path, [tokenless]))[0])
    assert "rollout 1-0" in line and "no output item carries generation_token_ids" in line, line


def test_a_capture_store_directory_reads_entries_and_names_what_it_does_not_read(tmp_path):
    store = tmp_path / "captures"
    store.mkdir()
    _write(store, gen.captured("1-0"), "1-0.tokens.jsonl")
    (store / "1-0.tokens.state.json").write_text('{"frozen": true, "version": 4}\n')
    (store / "1-0.tokens.lock").write_text("")
    _write(store, gen.captured("3-0"), "3-0.tokens.jsonl")
    (store / "3-0.tokens.intents").write_text("call-a\ncall-b\ncall-c\ncall-d\n")  # call-d was lost
    _write(store, gen.captured("4-0"), "4-0.tokens.jsonl")
    (store / "4-0.tokens.incomplete").write_text("call-z\n")
    res, rep = check(store)
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    assert rep["summary"]["rows_read"] == 1, rep["summary"]
    skipped = {Path(f).name for f in rep["summary"]["dump_files_not_read"]}
    assert {"3-0.tokens.jsonl", "4-0.tokens.jsonl", "4-0.tokens.incomplete", "1-0.tokens.state.json"} <= skipped


def test_a_line_of_no_known_kind_isone_line(tmp_path):
    line = one_line(check(_write(tmp_path, [{"hello": 1}]))[0])
    assert "dump.jsonl:1" in line and "not a NeMo Gym record" in line, line


@pytest.mark.parametrize(
    "kind, field, value",
    [
        ("entry", "created_at", [1]),
        ("entry", "prompt_token_ids", [1, -5]),
        ("staged", "rollout_id", 7),
        ("staged", "prev_len", -1),
        ("rollout", "content", 3),
    ],
)
def test_a_field_of_the_wrong_type_found_by_fuzzing_is_one_line(tmp_path, kind, field, value):
    if kind == "entry":
        recs = gen.captured("1-0")
        recs[1][field] = value
    elif kind == "staged":
        recs = gen.ledger("2-0")
        recs[1][field] = value
    else:
        recs = [gen.rollout(0, 0, 1.0, [[50, 2]])]
        recs[0]["response"]["output"][0][field] = value
    res = check(_write(tmp_path, recs))[0]
    if kind == "rollout":  # content is the action's text only: an odd one is no text, not an error
        assert res.exit_code == 0, res.output
        return
    line = one_line(res)
    assert "dump.jsonl:2" in line and field in line, line


def test_a_sampled_id_rewritten_after_the_capture_is_m112_at_that_call():
    res, found, rep = _m112(FIXTURES / "nemo_gym" / "token_rewritten_after_capture.jsonl")
    assert res.exit_code == 1 and found == {("M112", "1-0/capture", 2)}, res.output
    assert "context 39, then 2 sampled" in rep["findings"][0]["message"], rep["findings"][0]
