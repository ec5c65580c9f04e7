"""Replay with a tiny random Hugging Face model (built and saved in the test, tokenizer trained in-process):
the in-process replayer and a real OpenAI-compatible HTTP server on loopback agree with the sampler, and
every producer bug is caught (L205-L207); the numpy decoding distribution matches transformers' warpers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` lives at the repo root

import rollout_audit as ra
from benchmarks.tinylm import FAULT_NAMES, _processed, build, sample_log, serve
from rollout_audit.contract.config import Config
from rollout_audit.replay import HFReplayer, HTTPReplayer, processed_logprobs
from rollout_audit.replay.frame import token_frame
from rollout_audit.replay.run import _request, sampled_rows

REPLAY = ["L205", "L206", "L207"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    torch.set_num_threads(1)
    return build(tmp_path_factory.mktemp("tinylm"))


@pytest.fixture(scope="module")
def clean(dirs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_log(dirs, tmp_path_factory.mktemp("clean"), n=8)


def _audit(path: Path, **kw: object) -> tuple[set[str], ra.Report]:
    rep = ra.audit(str(path), config=Config(**{"replay": 64, **kw}), select=REPLAY)  # type: ignore[arg-type]
    return set(rep.findings["code"].to_list()), rep


def test_numpy_distribution_matches_transformers_warpers() -> None:
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 50, generator=gen, dtype=torch.float64) * 3
    for t, p, k in ((0.7, 0.9, 0), (1.3, 0.5, 5), (1.0, 1.0, 7), (0.5, 0.95, 3)):
        expected = torch.log_softmax(_processed(scores, t, p, k), -1).numpy()
        found = processed_logprobs(scores.numpy(), np.full(64, t), np.full(64, p), np.full(64, k))
        assert np.array_equal(np.isinf(found), np.isinf(expected))
        assert np.allclose(found[np.isfinite(found)], expected[np.isfinite(expected)], atol=1e-9)


def test_clean_log_replays_within_float_tolerance(dirs: dict[str, str], clean: Path) -> None:
    codes, rep = _audit(clean, replay_checkpoints=dirs)
    assert codes == set() and not set(rep.not_run) & set(REPLAY), rep.render()
    assert all(v["max"] < 1e-4 for v in rep.summary["statistics"]["L205"])


@pytest.mark.parametrize("fault", FAULT_NAMES)
def test_faults_caught_on_the_tiny_model_log(dirs: dict[str, str], fault: str, tmp_path: Path) -> None:
    top_p = 1.0 if fault == "wrong_version" else 0.9  # v-1 under top-p would log -inf (L201's business)
    codes, rep = _audit(sample_log(dirs, tmp_path, n=8, top_p=top_p, fault=fault), replay_checkpoints=dirs)
    assert "L205" in codes and ("L206" in codes) == (fault == "base_softmax"), rep.render()
    # per-turn ratios: up to e^1.5 (base softmax), e^17 (v-1); top-p ignored shifts a turn by < ln 2
    assert ("L207" in codes) == (fault != "top_p_ignored"), rep.render()


def test_stale_mapping_and_undecidable_temperature(dirs: dict[str, str], clean: Path, tmp_path: Path) -> None:
    codes, rep = _audit(clean, replay_checkpoints={"0": dirs["0"], "1": dirs["0"]})
    assert "L205" in codes and "policy version 1:" in " ".join(rep.findings["message"].to_list())
    codes, rep = _audit(sample_log(dirs, tmp_path, n=4, temperature=1.0, top_p=1.0), replay_checkpoints=dirs)
    assert codes == set() and "cannot decide" in rep.not_run["L206"]
    _, rep = _audit(clean, replay_checkpoints=str(Path(dirs["0"]).parent / "v{version}-missing"))
    assert "checkpoint of policy version 0 not found" in rep.not_run["L205"]


def test_http_endpoint_matches_in_process_replay(dirs: dict[str, str], clean: Path) -> None:
    servers = {v: serve(d) for v, d in dirs.items()}
    try:
        urls = {v: url for v, (_, url) in servers.items()}
        rows = sampled_rows(
            pl.DataFrame(
                {
                    "file": [str(clean / "trajectories" / "part-0000.parquet")] * 2,
                    "trajectory_id": ["v0-t0", "v1-t1"],
                    "pv_min": [0, 1],
                }
            ),
            4,
        )
        tokens = token_frame(rows)
        for v in (0, 1):
            req, _ = _request(rows, tokens, v)
            local, remote = HFReplayer(dirs).replay(req), HTTPReplayer(urls, batch_size=1).replay(req)
            assert np.allclose(local.sampled, remote.sampled, atol=1e-5)
            assert np.allclose(local.base, remote.base, atol=1e-5)
        codes, rep = _audit(clean, replay_endpoints=urls)
        assert codes == set() and not set(rep.not_run) & set(REPLAY), rep.render()
        _, rep = _audit(clean, replay_endpoints={"0": urls["0"]})
        assert "no replay endpoint configured for policy version 1" in rep.not_run["L205"]
    finally:
        for server, _ in servers.values():
            server.shutdown()


def test_l207_on_a_second_logprob_column(clean: Path, tmp_path: Path) -> None:
    table = pq.read_table(clean / "trajectories" / "part-0000.parquet")
    lp = table.column("behavior_logprobs").combine_chunks()
    shift = np.where(np.arange(table.num_rows) == 3, 1.5, 0.0)  # one trajectory's tokens, +1.5 each
    flat = pc.list_flatten(lp).to_numpy(zero_copy_only=False) + np.repeat(shift, pc.list_value_length(lp))
    other = pa.ListArray.from_arrays(lp.offsets, pa.array(flat, pa.float32(), mask=np.isnan(flat)))
    for name, col in (("same", lp), ("shifted", other)):
        (tmp_path / name / "trajectories").mkdir(parents=True)
        pq.write_table(table.append_column("old_logprobs", col), tmp_path / name / "trajectories" / "p.parquet")
    codes, _ = _audit(tmp_path / "same", replay=0, compare_logprobs="old_logprobs")
    assert codes == set()
    codes, rep = _audit(tmp_path / "shifted", replay=0, compare_logprobs="old_logprobs")
    found = rep.findings.filter(pl.col("code") == "L207")
    assert found["trajectory_id"].to_list() == [table.column("trajectory_id")[3].as_py()], rep.render()
    assert "π_old_logprobs/π_beh" in found["message"][0]


def _both_versions(clean: Path) -> tuple[pa.Table, pl.DataFrame]:
    rows = sampled_rows(
        pl.DataFrame(
            {
                "file": [str(clean / "trajectories" / "part-0000.parquet")] * 2,
                "trajectory_id": ["v0-t0", "v1-t1"],
                "pv_min": [0, 1],
            }
        ),
        4,
    )
    return rows, token_frame(rows)


def test_replay_scores_within_replay_max_bytes_with_the_same_result(dirs: dict[str, str], clean: Path) -> None:
    """Scored a few rows at a time (a budget of one trajectory's logits), in process and over HTTP, replay
    gives the log-probs it gives with the whole batch at once: what it holds is bounded, not its answer."""
    rows, tokens = _both_versions(clean)
    req, _ = _request(rows, tokens, 0)
    whole = HFReplayer(dirs).replay(req)
    vocab = HFReplayer(dirs)._model(0).get_output_embeddings().weight.shape[0]
    budget = max(len(t) for t in req.token_ids) * vocab * 4
    small = HFReplayer(dirs, max_scores=budget).replay(req)
    assert np.allclose(whole.sampled, small.sampled, atol=1e-6) and np.allclose(whole.base, small.base, atol=1e-6)
    server, url = serve(dirs["0"])
    try:
        one_row = HTTPReplayer({"0": url}, max_scores=1).replay(req)  # one scored row per block
    finally:
        server.shutdown()
    assert np.allclose(whole.sampled, one_row.sampled, atol=1e-5) and np.allclose(whole.base, one_row.base, atol=1e-5)


def test_a_trajectory_beyond_replay_max_bytes_is_exit_2_naming_it(dirs: dict[str, str], clean: Path, tmp_path: Path):
    """Through the CLI: a budget smaller than one trajectory's logits refuses replay in one line naming
    the trajectory and the setting (exit 2), never an allocation of whatever the log asks for."""
    from hostilehelp import assert_clean_exit, cli

    table = ", ".join(f'"{v}" = "{d}"' for v, d in dirs.items())
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[tool.rollout-audit]\nreplay_checkpoints = {{{table}}}\nreplay_max_bytes = 64\n")
    r = cli("check", str(clean), "--config", str(cfg), "--replay", "4", "--select", "L205")
    assert_clean_exit(r, (2,))
    assert "over replay_max_bytes (64)" in r.stdout + r.stderr and "trajectory v" in r.stdout + r.stderr, r.stdout


def test_an_answer_too_long_for_the_response_cap_is_refused_before_it_is_asked(dirs: dict[str, str], clean: Path):
    """Every prompt position costs the answer at least one entry: a trajectory whose answer cannot fit
    replay_max_response_bytes is refused naming it, before its prompt is sent."""
    from rollout_audit.replay.base import NotConfigured

    rows, tokens = _both_versions(clean)
    req, _ = _request(rows, tokens, 0)
    with pytest.raises(NotConfigured, match=r"trajectory v0-t0 has \d+ tokens: .*replay_max_response_bytes \(16\)"):
        HTTPReplayer({"0": "http://127.0.0.1:9/v1"}, max_bytes=16).replay(req)


def test_a_token_id_past_the_checkpoints_vocabulary_is_a_finding_naming_it(
    dirs: dict[str, str], clean: Path, tmp_path: Path
) -> None:
    """Through the CLI: an id the model has no embedding for was "check L205 failed: IndexError" (the
    whole replay incomplete); it is L205 naming the trajectory and the position, and the other sampled
    trajectories are replayed as before."""
    import json

    from hostilehelp import assert_clean_exit, cli

    log = tmp_path / "log"
    (log / "trajectories").mkdir(parents=True)
    table = pq.read_table(clean / "trajectories" / "part-0000.parquet")
    ids = table.column("token_ids").combine_chunks()
    flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False).copy()
    first = int(ids.offsets[3].as_py())  # trajectory 3, position 2
    flat[first + 2] = 10**6
    table = table.set_column(
        table.schema.get_field_index("token_ids"),
        "token_ids",
        pa.ListArray.from_arrays(ids.offsets, pa.array(flat, ids.type.value_type)),
    )
    pq.write_table(table, log / "trajectories" / "part-0000.parquet")
    mapping = ", ".join(f'"{v}" = "{d}"' for v, d in dirs.items())
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[tool.rollout-audit]\nreplay_checkpoints = {{{mapping}}}\n")
    r = cli("check", str(log), "--config", str(cfg), "--replay", "64", "--select", "L205", "--format", "json")
    assert_clean_exit(r, (1,))
    rep = json.loads(r.stdout)
    found = [f for f in rep["findings"] if f["code"] == "L205"]
    assert [(f["trajectory_id"], f["position"]) for f in found] == [(table.column("trajectory_id")[3].as_py(), 2)]
    assert "token id 1000000 at position 2 is past the" in found[0]["message"], found
    assert rep["summary"]["replay"]["trajectories"] == table.num_rows - 1, rep["summary"]["replay"]
