"""The round-6 and round-7 campaigns. Round 6 over the capture layer and the trust rule (`fuzzround6.prepare_round6`): the
recorder's HTTP input and its records, each capture-layer reader's format (the rLLM gateway's SQLite
store and JSON, agent-lightning, NeMo Gym, prime-rl's batches, ART), the verl V1 trainer record, and
files under audit that try to weaken it. Each case runs the real CLI in its own process and is judged
by `fuzzlib.judge` and its follow-ups (no traceback, internal error, hang or exit outside {0, 1, 2}; an
exit 2 says why in one line naming the input; no input written; a trust case never exits 0), and the
recorder's cases by what the recorder did (every request answered, nothing escaped its handlers,
every forwarded body unchanged). One seed of each surface and RA_ROUND6_CASES cases (100 by default; the
issue's figures are of `benchmarks/fuzz_campaign.py --kind round6`); the seeds it failed on replay in the
fast tier (test_round6_regressions). Round 7 (`prepare_round7`): the round-6 surfaces with more SQLite and
msgpack shapes, the `--calls` join and every integration's dump."""

from __future__ import annotations

import collections
import os

import pytest
from fuzzlib import run_cli, run_workflow_case

pytest.importorskip("aiohttp")
pytest.importorskip("msgpack")

from fuzzround6 import ROUND6, ROUND7, prepare_round6, prepare_round7


@pytest.mark.parametrize("seed", range(len(ROUND6)))
def test_round6_surfaces_never_crash_write_nor_pass_silently(tmp_path, seed):
    case = prepare_round6(seed, tmp_path)
    out, problems = run_workflow_case(case, tmp_path, lambda args: run_cli(args, tmp_path, 120))
    assert not problems, (case.label, problems, out.exit, out.stderr[-3000:])


def test_round6_campaign(tmp_path):
    cases = int(os.environ.get("RA_ROUND6_CASES", "100"))
    failed: dict[int, list[str]] = {}
    surfaces: collections.Counter[str] = collections.Counter()
    for seed in range(20_000, 20_000 + cases):
        work = tmp_path / str(seed)
        work.mkdir()
        case = prepare_round6(seed, work)
        surfaces[case.label.split(":")[0]] += 1
        _, problems = run_workflow_case(case, work, lambda args, work=work: run_cli(args, work, 120))
        if problems:
            failed[seed] = problems
    assert not failed, failed
    assert set(surfaces) == set(ROUND6), surfaces


# round 7; the figures are of `benchmarks/fuzz_campaign.py --kind round7`


@pytest.mark.parametrize("seed", range(len(ROUND7)))
def test_round7_surfaces_never_crash_write_nor_pass_silently(tmp_path, seed):
    case = prepare_round7(seed, tmp_path)
    out, problems = run_workflow_case(case, tmp_path, lambda args: run_cli(args, tmp_path, 120))
    assert not problems, (case.label, problems, out.exit, out.stderr[-3000:])


def test_round7_campaign(tmp_path):
    cases = int(os.environ.get("RA_ROUND7_CASES", "120"))
    failed: dict[int, list[str]] = {}
    surfaces: collections.Counter[str] = collections.Counter()
    for seed in range(30_000, 30_000 + cases):
        work = tmp_path / str(seed)
        work.mkdir()
        case = prepare_round7(seed, work)
        surfaces[case.label.split(":")[0]] += 1
        _, problems = run_workflow_case(case, work, lambda args, work=work: run_cli(args, work, 120))
        if problems:
            failed[seed] = problems
    assert not failed, failed
    assert set(surfaces) == set(ROUND7), surfaces
