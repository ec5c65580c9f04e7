"""The seeds the round-6 and round-7 campaigns (test_campaign_round6, slow) failed on, replayed in the fast tier:
each case runs the real CLI in its own process, forked from `fuzzlib`'s preloaded server, and is
judged as the campaign judges it."""

from __future__ import annotations

import importlib.util

import pytest

# the campaign's libraries are imported where a case runs: at collection every worker would pay for
# fuzzlib (hypothesis, pandas)
for _needed in ("aiohttp", "msgpack", "hypothesis"):
    if importlib.util.find_spec(_needed) is None:
        pytest.skip(f"could not import {_needed!r}", allow_module_level=True)

# what the campaign found (seeds of fuzzround6.prepare_round6): 42 (a gateway store with a -wal beside
# it: SQLite wrote a -shm beside the input), 59 (a dump folder's penalty: its verl fault a warning, exit
# 0 by design; now an error fault), 1740 (a recorder body nested too deeply: a RecursionError escaped
# its handler), 2598 (a null compare_logprobs row: "has -1 entries"), 6625 (a NeMo Gym parent_call_id
# that is a list: no field named)
REGRESSION_SEEDS = [42, 59, 1740, 2598, 6625]


def test_round6_campaign_cases_stay_fixed(tmp_path):
    """Every seed in one test: the worker that runs it starts fuzzlib's server once for them all."""
    from fuzzround6 import prepare_round6

    replay(REGRESSION_SEEDS, prepare_round6, tmp_path)


def test_round7_campaign_cases_stay_fixed(tmp_path):
    """The round-7 seeds (`fuzzround6.REGRESSION_SEEDS_7`, which names what each found)."""
    from fuzzround6 import REGRESSION_SEEDS_7, prepare_round7

    replay(REGRESSION_SEEDS_7, prepare_round7, tmp_path)


def replay(seeds, prepare, tmp_path):
    """Each seed's case through the real CLI, judged as the campaign judges it; every failure at once."""
    from fuzzlib import run_cli, run_workflow_case

    failed = {}
    for seed in seeds:
        work = tmp_path / str(seed)
        work.mkdir()
        case = prepare(seed, work)
        out, problems = run_workflow_case(case, work, lambda args, work=work: run_cli(args, work, 120))
        if problems:
            failed[seed] = (case.label, problems, out.exit, out.stderr[-3000:])
    assert not failed, failed
