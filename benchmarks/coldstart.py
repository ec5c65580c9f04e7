"""Cold start: `rollout-audit` in a fresh process, as CI or pre-commit runs it.

    python -m benchmarks.coldstart [--log benchmarks/data/12M] [--repeat 5] [--out /tmp/coldstart]

Times, each in a fresh `python -m rollout_audit.cli` process, `--repeat` runs, median:
`check` on a one-trajectory log (written under `--out` with `RolloutWriter`), `check` on each
`--log`, `explain U602`, `explain --list`, `--help`, `--version`, and `python -c "import rollout_audit"`. Wall seconds, and
CPU seconds (user + system of the child, from `resource.getrusage(RUSAGE_CHILDREN)`): on a
machine shared with other jobs the wall time stretches and CPU is the figure to compare. Also
lists the heavy modules (pandas, pandera, rich, torch, ray, a trainer framework) each command
left loaded. `benchmarks.run` reports the same cold figures for its sizes (`cold s`, `cold CPU s`).

`--pycache` gives the processes a bytecode cache under `--out` (PYTHONPYCACHEPREFIX, one unmeasured
run per command and tree first), as an installed package has its `.pyc` files; without it they
inherit the environment, and under PYTHONDONTWRITEBYTECODE a checkout without `__pycache__` is
compiled from source in every process (about 0.1 s of CPU for rollout_audit's modules).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("pandas", "pandera", "rich", "torch", "ray", "transformers", "verl", "trl", "verifiers", "openai", "asyncio")

# Runs the command line as `python -m rollout_audit.cli` does, then names the top-level modules loaded
# on stderr's last line and exits with the command's code.
_PROBE = """
import json, sys
from rollout_audit.cli.main import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
sys.stderr.write("\\n" + json.dumps(sorted({m.split(".")[0] for m in sys.modules})) + "\\n")
sys.exit(code)
"""
_IMPORT = """
import json, sys
import rollout_audit
sys.stderr.write("\\n" + json.dumps(sorted({m.split(".")[0] for m in sys.modules})) + "\\n")
"""


def one_trajectory_log(out: Path) -> Path:
    """A compliant log of one trajectory (a group of one) and the update that trains it, under `out`."""
    from rollout_audit import RolloutWriter
    from rollout_audit.synth import make_log

    trajs, updates = make_log(n_tasks=1, group_size=1, n_versions=1, seed=0, truncated_share=0.0)
    shutil.rmtree(out, ignore_errors=True)
    with RolloutWriter(out / "trajectories" / "part-00000.parquet") as w:
        w.write(trajs)
    with RolloutWriter(out / "updates" / "updates.parquet", kind="updates") as w:
        w.write(updates)
    return out


ROOT = Path(__file__).resolve().parents[1]


def fresh(args: list[str], repeat: int, trees: dict[str, str | None], pycache: Path | None = None) -> dict[str, dict]:
    """Per tree (a name, and the checkout put first on PYTHONPATH, None: this one's), the
    median wall and CPU seconds of `args` in a fresh interpreter (`["import"]`: `import
    rollout_audit` only), runs of the trees interleaved so that load hits them alike; the exit
    codes and the heavy modules (`HEAVY`) the last run left loaded. With `pycache`, the
    bytecode is cached there and a first run per tree, unmeasured, writes it."""
    cmd = [sys.executable, "-c", _IMPORT] if args == ["import"] else [sys.executable, "-c", _PROBE, *args]
    runs: dict[str, dict] = {name: {"walls": [], "cpus": [], "exit": set(), "loads": []} for name in trees}
    envs = {}
    for name, tree in trees.items():
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([tree or str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        if pycache is not None:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(pycache)
            subprocess.run(cmd, capture_output=True, env=env, cwd=tempfile.gettempdir())
        envs[name] = env
    for _ in range(repeat):
        for name in trees:
            env = envs[name]
            got = runs[name]
            got["loads"].append(os.getloadavg()[0])
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            # not run from a checkout: `python -c` puts the working directory first on sys.path
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
            got["walls"].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            got["cpus"].append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
            got["exit"].add(r.returncode)
            got["loaded"] = ",".join(m for m in json.loads(r.stderr.rstrip().rsplit("\n", 1)[-1]) if m in HEAVY)
    for got in runs.values():
        got["wall s"], got["CPU s"] = statistics.median(got["walls"]), statistics.median(got["cpus"])
        got["load"] = f"{min(got['loads']):.1f}–{max(got['loads']):.1f}"
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="rollout-audit cold start: fresh-process wall and CPU")
    ap.add_argument("--log", action="append", default=[], help="a log to `check` as well (repeatable)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="/tmp/coldstart", help="where the one-trajectory log is written")
    ap.add_argument("--against", help="another checkout (e.g. main's) to time the same commands from, interleaved")
    ap.add_argument("--pycache", action="store_true", help="cache the bytecode under --out, as an install has it")
    a = ap.parse_args(argv)
    pycache = Path(a.out).resolve() / "pycache" if a.pycache else None
    one = one_trajectory_log(Path(a.out).resolve() / "one-trajectory")
    commands = [
        ("import rollout_audit", ["import"]),
        ("--version", ["--version"]),
        ("--help", ["--help"]),
        ("explain U602", ["explain", "U602"]),
        ("explain --list", ["explain", "--list"]),
        ("check (one trajectory)", ["check", str(one)]),
        *((f"check {p}", ["check", str(Path(p).resolve())]) for p in a.log),
    ]
    trees: dict[str, str | None] = {"this": None}
    if a.against:
        trees = {"against": str(Path(a.against).resolve()), **trees}
    rows = []
    for name, args in commands:
        got = fresh(args, a.repeat, trees, pycache)
        for tree, g in got.items():
            print(
                f"{name} [{tree}]: wall {[round(x, 2) for x in g['walls']]} CPU {[round(x, 2) for x in g['cpus']]}",
                file=sys.stderr,
                flush=True,
            )
        rows.append((name, got))
    print(
        f"median of {a.repeat} fresh processes each"
        + (f"; against = {a.against}" if a.against else "")
        + ("; bytecode cached" if pycache else "")
        + "\n"
    )
    print("| command | tree | wall s | CPU s | exit | heavy modules loaded | load |")
    print("|---|---|---|---|---|---|---|")
    for name, got in rows:
        for tree, g in got.items():
            print(
                f"| `{name}` | {tree} | {g['wall s']:.2f} | {g['CPU s']:.2f} | {','.join(map(str, sorted(g['exit'])))} "
                f"| {g['loaded'] or 'none'} | {g['load']} |"
            )


if __name__ == "__main__":
    main()
