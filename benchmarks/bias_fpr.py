"""False-positive rate and power of L211 (the batch-level signed-bias test) on synthetic logs.

    python benchmarks/bias_fpr.py --runs 200

For each run r: `rollout_audit.synth.make_log(n_tasks=8, group_size=8, n_versions=2, seed=r)` (128
trajectories, about 500 turns and 1100 policy tokens), given a trainer's recomputation of its
log-probs by `rollout_audit.synth.second_logprobs` under each compliant precision (float32 noise,
bf16 rounding of the second column, a bf16 engine against a bf16 trainer), written as a log and
audited through `rollout_audit.audit` with L211 selected, in preview, and `compare_logprobs` naming
the column. A run is a false positive when L211 reports anything. The same logs broken by the fault
`top_p_against_full_vocab_trainer` measure the power. Prints, per precision: runs, false positives,
the largest |mean bias|, the farthest end of a 99.9% interval from 0 (how close a compliant run came
to ±min_logprob_bias), the runs whose interval excludes 0 (what a plain t-test without a minimum
effect would have reported), and the mean |Δ| a token.

    python benchmarks/bias_fpr.py --cost benchmarks/data/12M

The cost instead: a copy of a benchmark log (`python -m benchmarks.generate`) whose trajectory files
also hold `trainer_logprobs` (the behaviour log-probs with float32 noise), audited with L207 alone, L211
alone, and both (they share one read of the second column: the difference is the test itself), best of
three, wall and CPU seconds."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import rollout_audit as ra
from rollout_audit.contract.config import Config
from rollout_audit.faults import apply, write_records
from rollout_audit.synth import SECOND_PRECISIONS, make_log, second_logprobs

COLUMN = "trainer_logprobs"
FAULT = "top_p_against_full_vocab_trainer"


def audit(trajs: list[dict], updates: list[dict], where: Path) -> tuple[int, list[dict]]:
    """L211's findings and its per-setting statistics on the log written under `where`."""
    write_records(where, trajs, updates)
    cfg = Config.from_mapping({"preview": True, "select": ["L211"], "compare_logprobs": COLUMN})
    rep = ra.audit(where, config=cfg)
    if "L211" in rep.not_run or not rep.complete:
        raise SystemExit(f"{where}: L211 did not run: {rep.not_run.get('L211')}")
    return rep.findings.height, rep.summary["statistics"].get("L211", [])


def cost(src: Path) -> None:
    """Time L211 and L207 on a copy of the benchmark log at `src` with a second log-prob column."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        for f in sorted(src.rglob("*.parquet")):
            dst = Path(tmp) / f.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            table = pq.read_table(f)
            # a log from benchmarks.generate holds its own (relative noise of 1e-3); an older one gets this one
            if "behavior_logprobs" in table.column_names and COLUMN not in table.column_names:
                lp = table.column("behavior_logprobs").combine_chunks()
                flat = pc.list_flatten(lp).to_numpy(zero_copy_only=False).astype(np.float64)
                noisy = np.minimum(flat + rng.normal(0.0, 1e-6, flat.shape), 0.0).astype(np.float32)
                second = pa.ListArray.from_arrays(lp.offsets, pa.array(noisy, mask=np.isnan(noisy)))
                table = table.append_column(COLUMN, second)
            pq.write_table(table, dst, row_group_size=4096)
        print(f"{src}: copied with {COLUMN}")
        print("| check | wall s | CPU s | findings |")
        print("|---|---|---|---|")
        for codes in (["L207"], ["L211"], ["L207", "L211"]):
            code = "+".join(codes)
            cfg = Config.from_mapping({"preview": True, "select": codes, "compare_logprobs": COLUMN})
            best = None
            for _ in range(3):
                w, c = time.perf_counter(), time.process_time()
                rep = ra.audit(tmp, config=cfg)
                took = (time.perf_counter() - w, time.process_time() - c)
                best = took if best is None or took[0] < best[0] else best
            assert best is not None and not set(codes) & set(rep.not_run), rep.not_run
            print(f"| {code} | {best[0]:.2f} | {best[1]:.2f} | {rep.findings.height} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="synthetic logs per precision")
    ap.add_argument("--cost", type=Path, help="a benchmark log: time L211 on it instead")
    args = ap.parse_args(argv)
    if args.cost:
        cost(args.cost)
        return 0
    print(
        "| precision | runs | false positives | largest abs(mean bias) | farthest interval end | interval excludes 0 "
        "| mean abs(Δ) a token |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for precision in SECOND_PRECISIONS:
            fp, worst_m, worst_end, excludes, spread = 0, 0.0, 0.0, 0, []
            for r in range(args.runs):
                trajs, ups = make_log(n_tasks=8, group_size=8, n_versions=2, seed=r)
                second_logprobs(trajs, precision, seed=r, column=COLUMN)
                spread += [
                    abs(b - a) for t in trajs for a, b in zip(t["behavior_logprobs"], t[COLUMN]) if a is not None
                ]
                n, stats = audit(trajs, ups, Path(tmp) / f"{precision}-{r}")
                fp += n > 0
                excludes += any(s["lo"] > 0 or s["hi"] < 0 for s in stats)
                for s in stats:
                    worst_m = max(worst_m, abs(s["m"]))
                    worst_end = max(worst_end, abs(s["lo"]), abs(s["hi"]))
            print(
                f"| {precision} | {args.runs} | {fp} | {worst_m:.2g} | {worst_end:.2g} | {excludes} "
                f"| {np.mean(spread):.2g} |"
            )
        caught = 0
        for r in range(args.runs):
            trajs, ups = make_log(n_tasks=8, group_size=8, n_versions=2, seed=r)
            (bt, bu), _ = apply(FAULT, trajs, ups, seed=r)
            caught += audit(bt, bu, Path(tmp) / f"fault-{r}")[0] > 0
        print(f"\n{FAULT}: caught in {caught} of {args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
