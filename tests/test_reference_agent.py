"""Tests of the key-and-door reference agent: env, controller, tokenizer, log-probs, stop causes, shaping, logs."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file

from reference_agent.env import (
    ACTIONS,
    ALL_OBSERVATIONS,
    OBS_CLUE,
    OBS_JAMMED,
    OBS_NO_KEY,
    OBS_NOTE_GONE,
    OBS_OPENS,
    OBS_RESET,
    OBS_STUCK,
    OBS_TAKE,
    OBS_TIME_UP,
    KeyDoorEnv,
    controller_mask,
    potential,
    task_from_seed,
)
from reference_agent.policy import (
    PolicyConfig,
    RecurrentActorCritic,
    decoding_distribution,
    load_checkpoint,
)
from reference_agent.replay import replay_logprobs
from reference_agent.tokenizer import SYSTEM_PROMPT, TASK_STATEMENT, Tokenizer
from reference_agent.train import PROFILES, grpo_advantages, run_episode, train

TIMING_TURN_FIELDS = {"latency_s", "tool_latency_s"}
TEST_CFG = replace(PROFILES["tiny"], iterations=3, groups_per_iter=4, group_size=4, infra_failure_rate=0.05)


def _mask(*allowed: str) -> list[bool]:
    return [a in allowed for a in ACTIONS]


# ----------------------------------------------------------------------------- environment


def test_reset_is_reproducible_and_seed_names_the_task() -> None:
    env = KeyDoorEnv()
    _, a = env.reset(5)
    _, b = env.reset(5)
    _, c = env.reset(6)
    assert a["checksum"] == b["checksum"] != c["checksum"]
    assert task_from_seed(4)[0] == "red" and task_from_seed(5)[0] == "blue"
    assert a["potential"] == 0.0


def test_success_path_transitions_and_reward() -> None:
    env = KeyDoorEnv()
    obs, info = env.reset(3, {"target": "blue", "budget": 5, "stuck": False})
    assert obs == OBS_RESET and "blue" not in obs.replace("a blue key", "").replace("a blue door", "")
    assert env.step("inspect")[0] == OBS_CLUE.format(colour="blue")
    assert env.step("inspect")[0] == OBS_NOTE_GONE  # the clue is shown once
    obs, r, term, trunc, info = env.step("pickup_blue")
    assert (obs, r, term, trunc) == (OBS_TAKE, 0.0, False, False) and "blue" not in obs
    assert info["potential"] == pytest.approx(0.5)
    obs, r, term, _, info = env.step("open_blue")
    assert obs == OBS_OPENS and not term and info["verifier_success"] and info["potential"] == 1.0
    obs, r, term, trunc, info = env.step("finish")
    assert (r, term, trunc, info["stop_reason"]) == (1.0, True, False, "success")
    assert info["potential"] == 0.0  # terminal potential is zero
    assert env.state is not None and env.state.budget == 1


def test_failures_wrong_key_no_key_budget_and_early_finish() -> None:
    env = KeyDoorEnv()
    env.reset(0, {"target": "red", "budget": 5, "stuck": False})
    assert env.step("open_red")[0] == OBS_NO_KEY
    env.step("pickup_blue")
    obs, r, term, _, info = env.step("open_blue")  # the blue door opens, but it is not the target
    assert obs == OBS_OPENS and not info["verifier_success"]
    assert env.step("finish")[1:3] == (0.0, True)

    env.reset(0, {"target": "red", "budget": 5})
    env.step("pickup_blue")
    obs, r, term, _, info = env.step("open_red")
    assert (obs, r, term, info["stop_reason"]) == (OBS_JAMMED, 0.0, True, "failure")

    env.reset(0, {"budget": 1})
    env.step("inspect")
    obs, r, term, trunc, info = env.step("pickup_red")  # budget exhausted: refused, terminal
    assert (obs, r, term, trunc, info["stop_reason"]) == (OBS_TIME_UP, 0.0, True, False, "task_budget")
    assert env.state is not None and env.state.key is None

    env.reset(0)
    assert env.step("finish")[1:3] == (0.0, True)


def test_stuck_door_opens_on_second_try() -> None:
    env = KeyDoorEnv()
    env.reset(0, {"target": "red", "budget": 5, "stuck": True})
    env.step("pickup_red")
    assert env.step("open_red")[0] == OBS_STUCK
    assert env.step("open_red")[0] == OBS_OPENS


def test_infra_failure_leaves_state_unchanged() -> None:
    env = KeyDoorEnv(infra_failure_rate=1.0)
    _, info0 = env.reset(2)
    obs, r, term, trunc, info = env.step("inspect")
    assert info["tool_status"] == "timeout" and not term and not trunc and info["checksum"] == info0["checksum"]


def test_potential_over_true_state() -> None:
    env = KeyDoorEnv()
    env.reset(0, {"target": "red"})
    env.step("pickup_blue")  # a wrong key is no progress
    assert env.state is not None and potential(env.state) == 0.0


# ----------------------------------------------------------------------------- controller


def test_controller_mask_phases_without_revealing_colour() -> None:
    assert list(controller_mask([OBS_RESET])) == _mask("inspect", "pickup_red", "pickup_blue", "finish")
    red = controller_mask([OBS_RESET, OBS_CLUE.format(colour="red"), OBS_TAKE])
    blue = controller_mask([OBS_RESET, OBS_CLUE.format(colour="blue"), OBS_TAKE])
    assert list(red) == list(blue) == _mask("open_red", "open_blue", "finish")
    assert list(controller_mask([OBS_RESET, OBS_TAKE])) == _mask("inspect", "open_red", "open_blue", "finish")
    assert list(controller_mask([OBS_RESET, OBS_TAKE, OBS_OPENS])) == _mask("finish")


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trip_and_fixed_vocab() -> None:
    tok = Tokenizer()
    for text in (SYSTEM_PROMPT, TASK_STATEMENT, *ALL_OBSERVATIONS, " ".join(ACTIONS)):
        assert tok.decode(tok.encode(text)) == text
    assert len(set(tok.vocab)) == tok.vocab_size
    assert [tok.action_of(i) for i in tok.action_ids] == list(ACTIONS)
    assert tok.tokenizer_id == Tokenizer().tokenizer_id
    with pytest.raises(KeyError):
        tok.encode("an unknown word")


# ----------------------------------------------------------------------------- decoding distribution


def test_decoding_distribution_temperature_topp_mask() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 3.0, -1.0, 0.0])
    mask = torch.tensor(_mask("inspect", "pickup_red", "pickup_blue", "finish"))
    lp = decoding_distribution(logits, mask, temperature=2.0, top_p=0.6)
    z = np.where(mask.numpy(), logits.numpy() / 2.0, -np.inf)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    order = np.argsort(-p)
    keep = np.zeros(6, bool)
    keep[order[(np.cumsum(p[order]) - p[order]) < 0.6]] = True
    q = np.where(keep, p, 0.0) / p[keep].sum()
    assert np.allclose(lp.exp().numpy(), q, atol=1e-6)
    assert keep.sum() == 2 and not keep[3]  # masked action never kept despite the largest logit


# ----------------------------------------------------------------------------- logged episodes


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ra_run")
    train(TEST_CFG, out)
    return out


def _rows(out: Path) -> list[dict]:
    return pq.read_table(out / "trajectories" / "part-0000.parquet").to_pylist()


def _updates(out: Path) -> list[dict]:
    return pq.read_table(out / "updates" / "part-0000.parquet").to_pylist()


def test_log_files_checkpoints_and_metadata(run_dir: Path) -> None:
    meta = pq.read_schema(run_dir / "trajectories" / "part-0000.parquet").metadata
    # contract 1.1: the turns carry the chat template's render (template_context_length / _sha256)
    assert meta[b"rollout_log.schema_version"] == b"1.3" and meta[b"rollout_log.kind"] == b"trajectories"
    n = TEST_CFG.iterations * TEST_CFG.epochs + 1
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == sorted(f"v{i}.safetensors" for i in range(n))
    assert load_checkpoint(run_dir / "checkpoints" / f"v{n - 1}.safetensors").cfg.vocab_size == Tokenizer().vocab_size


def test_token_provenance_mask_and_context(run_dir: Path) -> None:
    for row in _rows(run_dir):
        n = len(row["token_ids"])
        assert n == len(row["token_source"]) == len(row["loss_mask"]) == len(row["behavior_logprobs"])
        assert row["loss_mask"] == [s == 2 for s in row["token_source"]]
        assert row["num_trainable_tokens"] == sum(row["loss_mask"])
        for src, lp in zip(row["token_source"], row["behavior_logprobs"]):
            assert (lp is not None) == (src == 2)
            assert lp is None or lp <= 0.0
        for t, turn in enumerate(row["turns"]):
            pos = turn["context_length"]
            assert turn["turn_id"] == t and row["token_source"][pos] == 2 and row["token_turn"][pos] == t
            assert row["token_source"][pos - 1] == 4  # the controller's scaffold precedes the action
            assert turn["sampled_token_ids"] == [row["token_ids"][pos]]
            expected = hashlib.sha256(np.asarray(row["token_ids"][:pos], dtype="<i4").tobytes()).hexdigest()
            assert turn["context_sha256"] == expected
            # the chat template's render of the messages so far is the sequence built token by token
            assert (turn["template_context_length"], turn["template_context_sha256"]) == (pos, expected)
            assert turn["logprob"] == pytest.approx(row["behavior_logprobs"][pos], abs=1e-12)
            assert json.loads(turn["parsed_action"]) == {"action": turn["action_text"]}
            assert turn["finish_reason"] == ("stop" if turn["action_text"] == "finish" else "tool_calls")
            assert (
                sum(
                    turn["reward_components"].values()
                    if isinstance(turn["reward_components"], dict)
                    else [v for _, v in turn["reward_components"]]
                )
                == turn["reward"]
            )


def test_behaviour_logprobs_match_replay_from_checkpoint(run_dir: Path) -> None:
    rows = _rows(run_dir)
    assert any(t["top_p"] < 1.0 for r in rows for t in r["turns"])
    for row in rows:
        replayed = replay_logprobs(run_dir / "checkpoints", row)
        logged = np.array([np.nan if x is None else x for x in row["behavior_logprobs"]], dtype=np.float64)
        assert np.array_equal(np.isnan(replayed), np.isnan(logged))
        assert np.nanmax(np.abs(replayed - logged)) < 1e-5


def test_nucleus_is_the_support_each_action_was_sampled_from(run_dir: Path) -> None:
    """Each action token records the token ids of the actions its mask and top-p kept (contract 1.3
    nucleus_ids / nucleus_offsets), every other token an empty span; recomputed from the checkpoint of
    its version with the run's decoding parameters, the span is the decoding distribution's support,
    and top-p cuts some of them below the mask."""
    tok = Tokenizer()
    cut = False
    for row in _rows(run_dir):
        off, ids = row["nucleus_offsets"], row["nucleus_ids"]
        assert len(off) == len(row["token_ids"]) + 1 and off[0] == 0 and off[-1] == len(ids)
        spans = {i: ids[off[i] : off[i + 1]] for i in range(len(row["token_ids"])) if off[i + 1] > off[i]}
        assert set(spans) == {i for i, s in enumerate(row["token_source"]) if s == 2}
        observations = [OBS_RESET]
        for turn in row["turns"]:
            pos, mask = turn["context_length"], controller_mask(observations)
            policy = load_checkpoint(run_dir / "checkpoints" / f"v{turn['policy_version']}.safetensors")
            logits = policy(torch.tensor([row["token_ids"][:pos]]))[0][0, -1]
            full = decoding_distribution(logits, torch.from_numpy(mask), TEST_CFG.temperature, 1.0)
            assert row["token_ids"][pos] in spans[pos]
            # top-p keeps an action when the mass of the more likely ones is below top_p; an action whose
            # mass before it lies within 1e-5 of top_p may fall either way in another float order
            p = torch.exp(full).detach().double().numpy()
            order = np.argsort(-p, kind="stable")
            before = np.empty_like(p)
            before[order] = np.cumsum(p[order]) - p[order]
            kept = {tok.action_ids[a] for a in np.flatnonzero(mask & (before < TEST_CFG.top_p - 1e-5))}
            dropped = {tok.action_ids[a] for a in np.flatnonzero(~mask | (before > TEST_CFG.top_p + 1e-5))}
            assert kept <= set(spans[pos]) and not dropped & set(spans[pos]), (kept, dropped, spans[pos])
            assert spans[pos] == sorted(spans[pos])
            cut |= len(spans[pos]) < mask.sum()
            observations.append(turn["observation_text"] or "")
    assert cut


def test_replay_detects_wrong_decoding_params(run_dir: Path) -> None:
    row = _rows(run_dir)[0]
    wrong = dict(row, turns=[dict(t, temperature=1.0, top_p=1.0) for t in row["turns"]])
    logged = np.array([np.nan if x is None else x for x in row["behavior_logprobs"]])
    assert np.nanmax(np.abs(replay_logprobs(run_dir / "checkpoints", wrong) - logged)) > 1e-3


def test_stop_causes_flags_and_rewards(run_dir: Path) -> None:
    reasons = {
        "terminated": {"success", "failure", "task_budget"},
        "truncated": {"max_turns"},
        "infra_error": {"tool_error"},
    }
    rows = _rows(run_dir)
    for row in rows:
        flags = [f for f in reasons if row[f]]
        assert len(flags) == 1 and row["stop_reason"] in reasons[flags[0]]
        if row["terminated"]:
            assert row["reward"] == sum(t["reward"] for t in row["turns"]) == float(row["verifier_success"])
            assert row["final_value"] == 0.0
        else:
            assert row["reward"] is None
    assert any(r["infra_error"] for r in rows)
    excluded = {r["trajectory_id"] for r in rows if r["reward"] is None}
    used = {tid for u in _updates(run_dir) for tid in u["trajectory_ids"]}
    assert used and not (used & excluded)


def _first_non_finish(policy: RecurrentActorCritic, tok: Tokenizer, env: KeyDoorEnv, **kw: object) -> dict:
    """Collect with successive rng seeds until the first action is not finish (finish ends any episode)."""
    for seed in range(50):
        rec = run_episode(
            env,
            policy,
            tok,
            reset_seed=1,
            rng=np.random.default_rng(seed),
            version=0,
            temperature=1.0,
            top_p=1.0,
            gamma=0.9,
            **kw,
        )  # type: ignore[arg-type]
        if rec["turns"][0]["action_text"] != "finish":
            return rec
    raise AssertionError("the policy always finished first")


def test_stop_causes_from_the_collector() -> None:
    torch.manual_seed(0)
    tok = Tokenizer()
    policy = RecurrentActorCritic(PolicyConfig(tok.vocab_size, len(ACTIONS)))
    rec = _first_non_finish(policy, tok, KeyDoorEnv(), max_turns=6, options={"budget": 0})
    assert rec["stop_reason"] == "task_budget" and rec["terminated"] and rec["reward"] == 0.0
    assert rec["turns"][-1]["observation_text"] == OBS_TIME_UP and rec["final_value"] == 0.0
    rec = _first_non_finish(policy, tok, KeyDoorEnv(), max_turns=1, options={"budget": 5})
    assert rec["stop_reason"] == "max_turns" and rec["truncated"] and not rec["terminated"]
    assert rec["reward"] is None and rec["final_value"] != 0.0  # the critic's bootstrap value is recorded
    rec = _first_non_finish(policy, tok, KeyDoorEnv(infra_failure_rate=1.0), max_turns=6)
    assert rec["stop_reason"] == "tool_error" and rec["infra_error"] and rec["reward"] is None
    assert rec["turns"][-1]["tool_status"] == "timeout" and rec["turns"][-1]["observation_text"] is None


def test_shaping_telescopes_and_td_identity(run_dir: Path) -> None:
    for row in _rows(run_dir):
        g, turns = row["gamma"], row["turns"]
        T = len(turns)
        for a, b in zip(turns, turns[1:]):
            assert a["potential_after"] == b["potential_before"]
        for t in turns:
            assert t["shaping"] == pytest.approx(g * t["potential_after"] - t["potential_before"], abs=1e-12)
        lhs = sum(g**t * turns[t]["shaping"] for t in range(T))
        rhs = -turns[0]["potential_before"] + g**T * turns[-1]["potential_after"]
        assert lhs == pytest.approx(rhs, abs=1e-9)
        if row["terminated"]:
            assert turns[-1]["potential_after"] == 0.0
        G0 = sum(g**t * (turns[t]["reward"] + turns[t]["shaping"]) for t in range(T))
        assert row["discounted_return"] == pytest.approx(G0, abs=1e-9)
        td = sum(g**t * turns[t]["td_residual"] for t in range(T))
        assert td == pytest.approx(G0 - turns[0]["value"] + g**T * row["final_value"], abs=1e-5)


def test_update_records_denominator_and_grpo(run_dir: Path) -> None:
    rows = {r["trajectory_id"]: r for r in _rows(run_dir)}
    for u in _updates(run_dir):
        assert u["reduction"] == "token" and u["advantage_estimator"] == "grpo"
        assert u["max_policy_lag"] == TEST_CFG.epochs - 1 and u["update_step"] == u["trainer_version"]
        assert u["loss_denominator"] == sum(rows[t]["num_trainable_tokens"] for t in u["trajectory_ids"])
        lags = {u["trainer_version"] - rows[t]["turns"][0]["policy_version"] for t in u["trajectory_ids"]}
        assert len(lags) == 1 and 0 <= lags.pop() <= u["max_policy_lag"]
        groups: dict[str, list[int]] = {}
        for k, tid in enumerate(u["trajectory_ids"]):
            groups.setdefault(rows[tid]["group_id"], []).append(k)
        for idx in groups.values():
            r = [rows[u["trajectory_ids"][k]]["reward"] for k in idx]
            assert np.allclose([u["advantages"][k] for k in idx], grpo_advantages(r))


def test_same_seed_same_log(run_dir: Path, tmp_path: Path) -> None:
    train(TEST_CFG, tmp_path)

    def strip(rows: list[dict]) -> list[dict]:
        return [
            {
                k: (
                    [{f: v for f, v in t.items() if f not in TIMING_TURN_FIELDS} for t in r["turns"]]
                    if k == "turns"
                    else v
                )
                for k, v in r.items()
                if k != "wall_clock_s"
            }
            for r in rows
        ]

    assert strip(_rows(run_dir)) == strip(_rows(tmp_path))
    assert _updates(run_dir) == _updates(tmp_path)
    for name in ("v0.safetensors", f"v{TEST_CFG.iterations * TEST_CFG.epochs}.safetensors"):
        a, b = load_file(str(run_dir / "checkpoints" / name)), load_file(str(tmp_path / "checkpoints" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_audit_finds_no_errors_or_warnings(run_dir: Path) -> None:
    import rollout_audit as ra

    report = ra.audit(str(run_dir))
    text = report.render()
    assert "0 errors, 0 warnings" in text, text


def test_greedy_evaluation_values_are_rates(run_dir: Path) -> None:
    from reference_agent.demo import format_table
    from reference_agent.train import run_profile

    result = run_profile("tiny", str(run_dir / "demo"))
    for name in ("trained", "untrained", "no_memory"):
        assert set(result["evaluation"][name]) == {"red", "blue"}
        assert all(0.0 <= v <= 1.0 for v in result["evaluation"][name].values())
    assert "no memory" in format_table(result)


def test_ci_profile_learns_and_needs_memory(tmp_path: Path) -> None:
    """The CI learning test (about 30 s on 2 cores): the trained greedy policy solves both colours, and
    neither the untrained policy nor the trained one without memory can solve both.

    Learning is a property of the algorithm, not of one run: another CPU's float bits flip a sample and
    make seed 0 another run. Measured on 13 seeds, 12 learn within the profile's 22 rounds, so a second
    seed is tried when the first does not (a false failure then needs two, about 1 in 150). A policy that
    has not learnt cannot pass: without memory it solves at most one colour."""
    from reference_agent.train import run_profile

    runs = []
    for seed in (0, 1):
        ev = run_profile("ci", str(tmp_path / f"seed{seed}"), seed)["evaluation"]
        runs.append(ev)
        if min(ev["trained"].values()) >= 0.9:
            break
    else:
        raise AssertionError(f"neither seed learnt both colours: {runs}")
    for ev in runs:  # what holds whether or not a run learnt
        assert min(ev["untrained"].values()) <= 0.5, ev
        assert min(ev["no_memory"].values()) <= 0.5, ev


@pytest.mark.skipif(os.environ.get("RA_SMOKE") != "1", reason="set RA_SMOKE=1 to run the ~1 min smoke profile")
def test_smoke_profile_learns(tmp_path: Path) -> None:
    from reference_agent.demo import run_demo

    result = run_demo(str(tmp_path), "smoke", 0)
    assert min(result["evaluation"]["trained"].values()) >= 0.95
    assert math.isfinite(result["train_seconds"])


def test_the_agent_hashes_contexts_with_its_own_code_and_agrees_with_the_contract():
    """The reference agent is the project's stand-in for a third-party producer: train.py writes
    its log without importing rollout_audit, so its compliant fixture tests the audit against a
    second implementation of the contract (a shared helper would make a wrong hash agree with
    itself). The two implementations of the context hash must agree."""
    import ast

    from reference_agent.train import context_sha256 as agent_hash
    from rollout_audit.contract.schema import context_sha256

    tree = ast.parse(Path(__file__).resolve().parent.parent.joinpath("reference_agent", "train.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.startswith("rollout_audit") for m in imported)
    ids = [0, 1, 198, 2**31 - 1, -1, 70000]
    for length in (0, 1, 3, len(ids)):
        assert agent_hash(ids, length) == context_sha256(ids, length)
    assert (
        context_sha256(ids) == hashlib.sha256(b"".join(i.to_bytes(4, "little", signed=True) for i in ids)).hexdigest()
    )
