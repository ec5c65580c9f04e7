"""`records_from_batch` and `update_from_step` on hand-built TRL batches (padded tensors, as
`_generate_and_score_completions` returns them): fast, no trainer."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from rollout_audit.adapters.trl import records_from_batch, update_from_step

PAD, EOS = 0, 9
TOK = SimpleNamespace(pad_token_id=PAD, eos_token_id=EOS, name_or_path="tiny", chat_template="{{ x }}")


def batch(**extra) -> dict:
    """Two rows: row 0 ends with eos and has a tool span; row 1 is cut by the length limit."""
    out = {
        "prompt_ids": torch.tensor([[PAD, 5, 6], [7, 8, 6]]),
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        "completion_ids": torch.tensor([[11, 12, 40, 41, 13, EOS], [21, 22, 23, 24, 25, 26]]),
        "completion_mask": torch.ones(2, 6, dtype=torch.long),
        "tool_mask": torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1]]),
        "advantages": torch.tensor([0.5, -0.5]),
        "num_items_in_batch": torch.tensor(10),
    }
    return {**out, **extra}


def rows(table) -> list[dict]:
    return table.to_pylist()


def test_tokens_sources_masks_and_turns():
    r0, r1 = rows(records_from_batch(batch(), tokenizer=TOK, policy_version=3, batch_id="b", group_size=2))
    assert r0["token_ids"] == [5, 6, 11, 12, 40, 41, 13, EOS]  # left padding dropped
    assert r0["token_source"] == [1, 1, 2, 2, 3, 3, 2, 2]
    assert r0["loss_mask"] == [False, False, True, True, False, False, True, True]
    assert r0["token_turn"] == [-1, -1, 0, 0, 0, 0, 1, 1]
    assert [t["turn_id"] for t in r0["turns"]] == [0, 1] and {t["policy_version"] for t in r0["turns"]} == {3}
    assert (r0["terminated"], r0["truncated"], r0["stop_reason"]) == (True, False, "end_of_sequence")
    assert (r1["terminated"], r1["truncated"], r1["stop_reason"]) == (False, True, "max_tokens")
    assert r0["group_id"] == r1["group_id"] == "b/g0" and r0["trajectory_id"] == "b/0"


def test_logprobs_only_on_policy_tokens_and_absent_without_sampling():
    lp = torch.tensor([[-0.1, -0.2, 0.0, 0.0, -0.3, -0.4], [-1.0] * 6])
    r0 = rows(records_from_batch(batch(sampling_per_token_logps=lp), tokenizer=TOK, policy_version=0, batch_id="b"))[0]
    assert r0["behavior_logprobs"][:2] == [None, None] and r0["behavior_logprobs"][4:6] == [None, None]
    assert r0["behavior_logprobs"][2] == pytest.approx(-0.1) and r0["behavior_logprobs"][7] == pytest.approx(-0.4)
    table = records_from_batch(batch(), tokenizer=TOK, policy_version=0, batch_id="b")
    assert "behavior_logprobs" not in table.column_names
    assert b"TRL does not record behaviour log-probs" in table.schema.metadata[b"rollout_log.not_recorded"]


def test_masked_truncated_row_keeps_its_tokens_out_of_the_loss():
    cm = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])  # mask_truncated_completions zeroed row 1
    r1 = rows(records_from_batch(batch(completion_mask=cm), tokenizer=TOK, policy_version=0, batch_id="b"))[1]
    assert r1["token_ids"][3:] == [21, 22, 23, 24, 25, 26] and not any(r1["loss_mask"]) and r1["truncated"]


def test_excluded_rows_keep_their_provenance():
    r0 = rows(records_from_batch(batch(), tokenizer=TOK, policy_version=0, batch_id="b", excluded=[True, False]))[0]
    assert r0["token_source"] == [1, 1, 2, 2, 3, 3, 2, 2] and not any(r0["loss_mask"])


def test_rewards_nan_is_null_and_ids_are_stable():
    a = records_from_batch(batch(), tokenizer=TOK, policy_version=0, batch_id="b", rewards=[1.0, math.nan])
    b = records_from_batch(batch(), tokenizer=TOK, policy_version=0, batch_id="b", rewards=[1.0, math.nan])
    assert a.column("reward").to_pylist() == [1.0, None]
    assert a.column("trajectory_id").equals(b.column("trajectory_id"))
    assert a.column("task_id").to_pylist()[0] != a.column("task_id").to_pylist()[1]


@pytest.mark.parametrize(
    "loss_type, reduction, denom, scale",
    [
        ("dapo", "token_window", 10 * 4 / (2 * 1), 2.0),  # num_items / P × GA / spg
        ("bnpo", "token", 10 * 4, 4.0),  # the micro-batch's 10 trainable tokens × GA
        ("grpo", "seq_mean_token_mean", 2 * 4, 4.0),
        ("dr_grpo", "constant", 2 * 6 * 4, 24.0),  # B × max_completion_length × GA
    ],
)
def test_update_denominators_as_trl_divides(loss_type, reduction, denom, scale):
    rec = update_from_step(
        batch(),
        trajectory_ids=["b/0", "b/1"],
        loss_type=loss_type,
        update_step=1,
        trainer_version=1,
        gradient_accumulation_steps=4,
        steps_per_generation=2,
        max_completion_length=6,
    )
    assert (rec["reduction"], rec["loss_denominator"], rec["denominator_scale"]) == (reduction, denom, scale)
    assert rec["advantages"] == [0.5, -0.5]


def test_trainer_logprobs_are_a_second_column_on_policy_tokens_only():
    old = torch.tensor([[-0.5, -0.6, 0.0, 0.0, -0.7, -0.8], [-2.0] * 6])
    table = records_from_batch(batch(old_per_token_logps=old), tokenizer=TOK, policy_version=0, batch_id="b")
    r0 = rows(table)[0]
    assert table.column_names[-1] == "old_per_token_logps"
    assert r0["old_per_token_logps"][:2] == [None, None] and r0["old_per_token_logps"][4:6] == [None, None]
    assert r0["old_per_token_logps"][2] == pytest.approx(-0.5) and r0["old_per_token_logps"][7] == pytest.approx(-0.8)
    assert (
        "old_per_token_logps"
        not in records_from_batch(batch(), tokenizer=TOK, policy_version=0, batch_id="b").column_names
    )
