"""prime-rl's trainer batches through `check --from prime_rl`: the msgpack `list[MicroBatch]` files the
filesystem transport writes, unpacked with the real `msgpack` and joined to the verifiers traces they
came from. The compliant batch audits clean; a mask over a tool reply and log-probs one position late
are flagged; a truncated or mistyped batch is one line naming file, micro batch and field (exit 2).
prime-rl itself (and its msgspec encoder) is not installed: the batches are msgpack of the arrays its
`MicroBatch` encodes to (tests/frameworks/prime_rl.py)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import msgpack
import pytest
from adapterhelp import FIXTURES, cli, one_line, opts
from frameworks import prime_rl as gen

CONTEXT = opts(
    ["policy_version=3", "environment_id=doors", "environment_version=v1", "verifier_version=v1", "reset_seed=0"]
)
BIN = Path("rollouts") / "step_0" / "rank_0.bin"


def check(path: Path, *extra: str):
    res = cli("check", "--from", "prime_rl", path, *CONTEXT, "--format", "json", *extra)
    return res, (json.loads(res.stdout) if res.stdout.startswith("{") else None)


def test_the_compliant_batch_audits_clean():
    res, rep = check(FIXTURES / "prime_rl" / "compliant")
    assert res.exit_code == 0 and rep["findings"] == [], res.output
    assert rep["summary"]["rows_read"] == 4 and rep["summary"]["dump_files"] == 2, rep["summary"]
    assert "4 trainer samples joined" in res.stderr


def test_a_mask_over_the_tool_reply_is_m101_on_the_sample_that_trained_it():
    res, rep = check(FIXTURES / "prime_rl" / "tool_reply_trained")
    assert res.exit_code == 1, res.output
    m101 = [f for f in rep["findings"] if f["code"] == "M101"]
    assert [(f["trajectory_id"], f["position"]) for f in m101] == [("trace-0", 20)], m101
    assert "rank_0.bin: micro batch 0 sample 0" in m101[0]["file"]


def test_log_probs_one_position_late_are_l208_on_every_sample():
    res, rep = check(FIXTURES / "prime_rl" / "logprobs_shifted")
    assert res.exit_code == 0, res.output  # a warning
    assert {f["trajectory_id"] for f in rep["findings"] if f["code"] == "L208"} == {f"trace-{n}" for n in range(4)}


def test_the_advantages_are_the_group_relative_credit_prime_rl_grpo_gives():
    ok, rep = check(FIXTURES / "prime_rl" / "compliant", "--context", "algo=grpo")
    assert ok.exit_code == 0 and rep["findings"] == [], ok.output
    assert {"U603", "U604", "U605", "U606"} <= set(rep["summary"]["checks_run"]), rep["summary"]["checks_run"]
    res, rep = check(FIXTURES / "prime_rl" / "baseline_dropped", "--context", "algo=grpo")
    assert res.exit_code == 1, res.output
    assert {(f["code"], f["trajectory_id"]) for f in rep["findings"]} == {("U603", f"trace-{n}") for n in range(4)}
    # without the algorithm prime-rl was configured with, no estimator is assumed
    res, rep = check(FIXTURES / "prime_rl" / "baseline_dropped")
    assert res.exit_code == 0 and "U603" in {n["code"] for n in rep["not_run"]}, res.output
    line = one_line(check(FIXTURES / "prime_rl" / "compliant", "--context", "algo=ppo")[0])
    assert "algo" in line and "grpo" in line, line


def _dump(tmp: Path, data: bytes) -> Path:
    root = tmp / "run"
    shutil.copytree(FIXTURES / "prime_rl" / "compliant", root)
    (root / BIN).write_bytes(data)
    return root


def test_a_truncated_batch_is_one_line_naming_the_file(tmp_path):
    data = (FIXTURES / "prime_rl" / "compliant" / BIN).read_bytes()
    line = one_line(check(_dump(tmp_path, data[: len(data) // 2]))[0])
    assert "rank_0.bin" in line and "not a complete msgpack batch" in line, line


def test_bytes_after_the_batch_areone_line(tmp_path):
    data = (FIXTURES / "prime_rl" / "compliant" / BIN).read_bytes()
    line = one_line(check(_dump(tmp_path, data + b"\x00"))[0])
    assert "rank_0.bin" in line and "bytes after" in line, line


@pytest.mark.parametrize(
    "index, value, field",
    [(1, "yes", "loss_mask"), (0, [1, "2"], "input_ids"), (3, {"a": 1}, "inference_logprobs")],
)
def test_a_field_of_the_wrong_type_is_one_line_naming_it(tmp_path, index, value, field):
    batches = msgpack.unpackb((FIXTURES / "prime_rl" / "compliant" / BIN).read_bytes(), raw=False)
    batches[1][index] = value
    line = one_line(check(_dump(tmp_path, msgpack.packb(batches)))[0])
    assert "micro batch 1" in line and field in line, line


def test_a_micro_batch_of_the_wrong_arity_or_lengths_isone_line(tmp_path):
    batches = msgpack.unpackb((FIXTURES / "prime_rl" / "compliant" / BIN).read_bytes(), raw=False)
    line = one_line(check(_dump(tmp_path, msgpack.packb([batches[0][:4]])))[0])
    assert "micro batch 0" in line and "fields" in line, line
    batches[0][2] = batches[0][2][:-1]
    line = one_line(check(_dump(tmp_path / "b", msgpack.packb(batches)))[0])
    assert "micro batch 0" in line and "advantages" in line, line


def test_padding_in_the_loss_isone_line():
    line = one_line(check(FIXTURES / "prime_rl" / "padding_trained")[0])
    assert "micro batch 0 sample 0" in line and "padding" in line, line


def test_a_sample_no_trace_has_isone_line(tmp_path):
    batches = msgpack.unpackb((FIXTURES / "prime_rl" / "compliant" / BIN).read_bytes(), raw=False)
    batches[0][0][0] = 999
    line = one_line(check(_dump(tmp_path, msgpack.packb(batches)))[0])
    assert "micro batch 0 sample 0" in line and "input_ids" in line and "no verifiers trace" in line, line


def test_batches_without_traces_areone_line(tmp_path):
    root = tmp_path / "run"
    (root / BIN).parent.mkdir(parents=True)
    shutil.copy(FIXTURES / "prime_rl" / "compliant" / BIN, root / BIN)
    line = one_line(check(root)[0])
    assert "no verifiers trace files" in line, line


def test_the_committed_batches_are_msgpack_of_microbatch_arrays():
    """The fixture holds what the transport writes: a list of positional MicroBatch arrays whose
    sample lengths add up to their input ids."""
    batches = msgpack.unpackb((FIXTURES / "prime_rl" / "compliant" / BIN).read_bytes(), raw=False)
    assert isinstance(batches, list) and all(len(mb) == 9 for mb in batches)
    assert all(sum(mb[5]) == len(mb[0]) == len(mb[1]) for mb in batches)
    assert gen.micro_batch(gen._samples(gen.traces())[:1])[4][-1] == 5  # padding restarts its position ids


_PEAK = r"""
import resource, sys
import msgpack, polars, pyarrow.parquet  # noqa: F401 - what the audit maps, before the baseline
from rollout_audit.cli import main

unit = 1024 if sys.platform == "darwin" else 1  # ru_maxrss is in bytes there, in kB on Linux
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    main(sys.argv[1:], prog_name="rollout-audit")
finally:
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // unit, file=sys.stderr)
"""
_EMPTIES = 8_000_000  # one byte each: an 8 MB file that decodes whole to ~700 MB of empty lists
_HOSTILE = {
    "empty micro batches": b"\xdd" + _EMPTIES.to_bytes(4, "big") + b"\x90" * _EMPTIES,
    "empty arrays in input_ids": b"\x91\x99\xdd" + _EMPTIES.to_bytes(4, "big") + b"\x90" * _EMPTIES + b"\x00" * 8,
}


@pytest.mark.skipif(sys.platform == "win32", reason="reads ru_maxrss (the resource module)")
@pytest.mark.parametrize(
    "name, expected", [("empty micro batches", "fields"), ("empty arrays in input_ids", "input_ids")]
)
def test_a_batch_of_nested_empty_arrays_is_refused_within_memory_bounded_by_its_size(tmp_path, name, expected):
    """Every element of a msgpack array takes one byte and an empty list ~60 bytes of Python: 8 MB of
    them decoded whole reached ~700 MB before the structure check refused them. The headers are walked
    and a field stops building at its first inner container, so the peak grows by a few times the
    file's size: one line naming the file, micro batch and field."""
    import os
    import subprocess

    script = tmp_path / "peak.py"
    script.write_text(_PEAK)
    root = _dump(tmp_path, _HOSTILE[name])
    args = ["check", "--from", "prime_rl", str(root), *CONTEXT, "--format", "json"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # this checkout's package
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300)
    *lines, grown = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "rank_0.bin: micro batch 0" in lines[0] and expected in lines[0], lines[0]
    assert "not a complete" not in lines[0], lines[0]
    assert int(grown) < 150_000, grown  # kB above what the audit's imports take: 8 MB read, no lists built
