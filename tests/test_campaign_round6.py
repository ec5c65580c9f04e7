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

# one seed of each surface of each round (seed k draws surface k)
ONE_OF_EACH = [(prepare_round6, s) for s in range(len(ROUND6))] + [(prepare_round7, s) for s in range(len(ROUND7))]


@pytest.mark.parametrize(("prepare", "seed"), ONE_OF_EACH, ids=[f"{p.__name__[-6:]}-{s}" for p, s in ONE_OF_EACH])
def test_each_surface_never_crashes_writes_nor_passes_silently(tmp_path, prepare, seed):
    case = prepare(seed, tmp_path)
    out, problems = run_workflow_case(case, tmp_path, lambda args: run_cli(args, tmp_path, 120))
    assert not problems, (case.label, problems, out.exit, out.stderr[-3000:])


def test_round6_campaign(tmp_path):
    campaign(prepare_round6, ROUND6, range(20_000, 20_000 + int(os.environ.get("RA_ROUND6_CASES", "100"))), tmp_path)


def campaign(prepare, surfaces, seeds, tmp_path):
    """Every seed's case through the real CLI: none has a problem, and every surface was drawn."""
    failed: dict[int, list[str]] = {}
    drawn: collections.Counter[str] = collections.Counter()
    for seed in seeds:
        work = tmp_path / str(seed)
        work.mkdir()
        case = prepare(seed, work)
        drawn[case.label.split(":")[0]] += 1
        _, problems = run_workflow_case(case, work, lambda args, work=work: run_cli(args, work, 120))
        if problems:
            failed[seed] = problems
    assert not failed, failed
    assert set(drawn) == set(surfaces), drawn


# round 7; the figures are of `benchmarks/fuzz_campaign.py --kind round7`


def test_round7_campaign(tmp_path):
    campaign(prepare_round7, ROUND7, range(30_000, 30_000 + int(os.environ.get("RA_ROUND7_CASES", "120"))), tmp_path)
