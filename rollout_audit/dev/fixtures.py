"""The committed fixtures (a developer tool): a small compliant log that the reference agent
trains (`reference_agent.fixtures.agent_log`) and one broken log per named fault, with a manifest
of the codes each must raise.

    python -m rollout_audit.dev generate --fixtures   # regenerate fixtures/ with every derived file (agent extra)
    python -m rollout_audit.dev fixtures --check      # exit 1 if the committed fixtures drift

Measured columns (wall-clock and latencies) are excluded from the drift comparison; everything
but floats compares exactly, floats to FLOAT_TOL. The trained policy's floats depend on the CPU's
kernels: ATEN_CPU_CAPABILITY=default against avx2 on one machine moved behaviour log-probs, values
and TD residuals by up to 5.2e-6, and an AVX-512 machine moved them by up to 4.5e-6.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures"
MEASURED = {"wall_clock_s", "latency_s", "tool_latency_s"}
FIXTURE_SEED = 0  # the seed each fault chooses its trajectory with
USER_CONFIG = "broken/{fault}.user.toml"  # a fault's user configuration, relative to fixtures/
FLOAT_TOL = 1e-4  # about 20x the largest difference measured across CPU instruction sets (above)


def generate(root: Path) -> dict:
    """Write compliant/ (the agent trained), broken/<fault>/ and manifest.json under `root`;
    returns the manifest."""
    from reference_agent.fixtures import agent_log

    shutil.rmtree(root / "compliant", ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    agent_log(root / "compliant")
    return write_broken(root)


def write_broken(root: Path) -> dict:
    """Write broken/<fault>/ (and broken/<fault>.user.toml for a fault the user configures) and
    manifest.json under `root` from `root`/compliant and every registered fault (no training);
    returns the manifest. Every fault is applied before anything is removed or written: a fault
    that finds no target (NoTarget, naming it) leaves the committed fixtures as they were."""
    from reference_agent.tokenizer import Tokenizer

    from ..faults import FAULTS, apply, declared_components, read_records, settings_toml, write_fault_log

    trajs, ups = read_records(root / "compliant")
    broken = {name: apply(name, trajs, ups, seed=FIXTURE_SEED) for name in FAULTS}
    tokenizer = Tokenizer().declaration()  # the broken logs decode like the agent's own
    declared = declared_components(root / "compliant")  # the agent's declaration, carried to each broken log
    shutil.rmtree(root / "broken", ignore_errors=True)
    manifest: dict = {"source": "reference agent, profile 'fixture', seed 0", "compliant": "compliant", "faults": {}}
    for name, f in FAULTS.items():
        (bt, bu), touched = broken[name]
        write_fault_log(root / "broken" / name, f, bt, bu, tokenizer=tokenizer, reward_components=declared | f.declares)
        entry = {
            "codes": sorted(f.codes),
            "touched": touched,
            "config": f.config,
            "user_config": f.user_config,
            "description": f.description,
        }
        if f.user_config:  # the user's own file, beside the log: passed with --config, never found in the log
            (root / USER_CONFIG.format(fault=name)).write_text(settings_toml(f.user_config))
            entry["user_config_file"] = USER_CONFIG.format(fault=name)
        manifest["faults"][name] = entry
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    out = []
    for f in sorted(path.rglob("*.parquet")):
        try:
            out += pq.read_table(f).to_pylist()
        except Exception:  # noqa: BLE001 - a deliberately corrupt fixture: compare its bytes' length
            out.append({"corrupt_file": f.relative_to(path).as_posix()})
    return out


def _same(a, b, key: str = "") -> bool:
    if key in MEASURED or a == b:  # equal values are the same; only unequal ones need the tolerant walk
        return True
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], k) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, key) for x, y in zip(a, b))
    return a == b


def drift(committed: Path, fresh: Path) -> list[str]:
    """Differences between two fixture trees (file sets, manifest, record contents)."""
    problems = []

    def files(r: Path) -> list[str]:  # what the generator writes (not the README)
        return sorted(
            p.relative_to(r).as_posix()
            for p in r.rglob("*")
            if p.is_file() and (p.suffix in (".parquet", ".toml") or p.name == "manifest.json")
        )

    if files(committed) != files(fresh):
        problems.append(f"file sets differ: {sorted(set(files(committed)) ^ set(files(fresh)))[:10]}")
    if (committed / "manifest.json").read_text() != (fresh / "manifest.json").read_text():
        problems.append("manifest.json differs")
    for p in sorted(fresh.rglob("*.toml")):  # the configurations inside and beside the logs
        rel = p.relative_to(fresh)
        if (committed / rel).is_file() and (committed / rel).read_text() != p.read_text():
            problems.append(f"{rel.as_posix()} differs")
    for d in sorted({p.parent for p in fresh.rglob("*.parquet")}):
        rel = d.relative_to(fresh)
        if not _same(_rows(committed / rel), _rows(d)):
            problems.append(f"{rel}: records differ")
        elif _declared(committed / rel) != _declared(d):
            problems.append(f"{rel}: declared reward components differ")
    return problems


def _declared(path: Path) -> list[dict]:
    """Each readable file's `rollout_log.reward_components` declaration."""
    import pyarrow.parquet as pq

    from ..contract.schema import reward_components

    out = []
    for f in sorted(path.rglob("*.parquet")):
        try:
            out.append(reward_components(pq.read_schema(f).metadata))
        except Exception:  # noqa: BLE001 - the deliberately corrupt fixture has no footer
            out.append({})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rollout_audit.dev fixtures", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare a fresh generation with the committed fixtures")
    ap.add_argument("--out", type=Path, default=FIXTURES)
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401 - the fixtures are written by training the reference agent
    except ImportError:
        print("rollout_audit.dev fixtures: error: needs torch: pip install -e '.[agent]'", file=sys.stderr)
        return 2
    if not args.check:
        m = generate(args.out)
        print(f"wrote {args.out}: compliant log and {len(m['faults'])} broken logs")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        problems = drift(args.out, Path(tmp))
    for p in problems:
        print(p)
    print(
        "fixtures up to date"
        if not problems
        else f"{len(problems)} difference(s): regenerate with `python -m rollout_audit.dev generate --fixtures`"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
