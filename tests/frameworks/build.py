"""Write (or verify) the framework fixtures from their generators.

    python tests/frameworks/build.py            # (re)write fixtures/frameworks/<name>/<case>.jsonl
    python tests/frameworks/build.py --check    # exit 1 if a committed fixture differs or is missing

(Not `python -m tests.frameworks.build`: verl installs a top-level `tests` package into site-packages,
which wins over this directory; the tests import these modules as the package `frameworks`.)

For every name in `rollout_audit.adapters.NAMES` that has a module `tests/frameworks/<name>.py`, the
module's `cases() -> dict[str, list[dict]]` maps a case name (`compliant`, or the bug it carries) to
that framework's per-sample records, in the framework's own field names and types (tensors as plain
lists). Each case becomes one JSON Lines file, one record a line, keys in the order given, so the
fixtures read like a real dump. Generators must be deterministic (no clock, no unseeded randomness).
Names without a module are skipped, so each adapter adds its own generator independently. A module
may also have `files() -> dict[str, bytes]`: binary fixtures (prime-rl's msgpack batches) by their path
under fixtures/frameworks/<name>/.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

from rollout_audit.adapters import NAMES

if not __package__:  # run as a script: the generators are the package `frameworks` in tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
PACKAGE = __package__ or "frameworks"
ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "frameworks"


def generators() -> dict[str, ModuleType]:
    """The generator module of every adapter name that has one."""
    here = Path(__file__).resolve().parent
    return {n: importlib.import_module(f"{PACKAGE}.{n}") for n in NAMES if (here / f"{n}.py").exists()}


def render(records: list[dict]) -> str:
    """JSON Lines text of a case: one compact record a line."""
    return "".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False) + "\n" for r in records)


def expected() -> dict[Path, str | bytes]:
    """Every fixture file and its text (or bytes), as the generators make them."""
    out: dict[Path, str | bytes] = {
        ROOT / name / f"{case}.jsonl": render(records)
        for name, mod in generators().items()
        for case, records in mod.cases().items()
    }
    for name, mod in generators().items():
        out |= {ROOT / name / rel: data for rel, data in getattr(mod, "files", dict)().items()}
    return out


def _differs(p: Path, content: str | bytes) -> bool:
    if not p.exists():
        return True
    return p.read_bytes() != content if isinstance(content, bytes) else p.read_text(encoding="utf-8") != content


def main(argv: list[str] | None = None) -> int:
    """Write the fixtures, or with --check list those that differ and return 1."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    files = expected()
    if args.check:
        stale = [p for p, content in files.items() if _differs(p, content)]
        for p in stale:
            print(f"stale: {p.relative_to(ROOT.parents[1])}", file=sys.stderr)
        return 1 if stale else 0
    for p, content in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
    print(f"wrote {len(files)} fixture files under {ROOT.relative_to(ROOT.parents[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
