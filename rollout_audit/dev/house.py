"""The house: the package's rooms, floors and arrows, measured from the source.

    python -m rollout_audit.dev house [--root CHECKOUT] [--json] [--top N]

- rooms: the top-level folders of rollout_audit/ (and its top-level modules, one room each), with
  their modules and lines;
- floors: the layer order, bottom-up (`LAYERS`; a checkout that predates this module is read
  from its tests/test_layers.py), and which floor each room stands on: a room named like a
  floor (folder `session/` or module `session.py`) stands on it, every other room on the top;
- arrows: the imports between rooms (importer room -> imported room: how many module pairs);
- upward imports: module pairs whose imported module stands on a higher floor than its importer,
  counted under the checkout's own floors and under this module's `LAYERS` (so an older checkout
  is measured with today's floors too);
- the largest modules and functions (methods included, by their lines from `def` to the end);
- what the CLI imports for a plain `rollout-audit check fixtures/compliant`: a fresh interpreter
  with the checkout first on its path runs the `rollout-audit` entry point of its pyproject.toml
  and lists what it then holds (modules, the package's own modules, heavy ones).

Every module is read with `ast` (nothing imported) and every import in it, at module level, inside
a function or under `if TYPE_CHECKING`, is resolved to a module of the package; tests/test_layers.py
asserts on the same graph.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PKG = "rollout_audit"
CHECKOUT = Path(__file__).resolve().parents[2]
LAYERS = [
    "contract",
    "reading",
    "frames",
    "replay",
    "checks",
    "running",
    "writing",
    "reporting",
    "adapters",
    "session",
    "workflow",
]
# What a plain check must not import (tests/test_cold_start.py asserts it on this checkout).
HEAVY = (
    "pandas",
    "pandera",
    "rich",
    "torch",
    "ray",
    "transformers",
    "verl",
    "trl",
    "verifiers",
    "openai",
    "vllm",
    "asyncio",
)

Modules = dict[str, tuple[Path, bool]]


def modules(checkout: Path = CHECKOUT) -> Modules:
    """Every module of the package, dotted name -> (file, is a package's __init__)."""
    root = checkout / PKG
    out = {}
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(checkout).with_suffix("").parts
        is_pkg = rel[-1] == "__init__"
        out[".".join(rel[:-1] if is_pkg else rel)] = (f, is_pkg)
    return out


def _known(name: str, mods: Modules) -> str | None:
    """The longest prefix of `name` that is a module of the package."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in mods:
            return ".".join(parts)
        parts.pop()
    return None


def _imports(mod: str, tree: ast.AST, is_pkg: bool, mods: Modules) -> set[str]:
    package = mod if is_pkg else mod.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {k for a in node.names if (k := _known(a.name, mods))}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                sub = f"{base}.{a.name}"
                k = sub if sub in mods else _known(base, mods)
                if k:
                    found.add(k)
    found.discard(mod)
    return found


def _trees(mods: Modules) -> dict[str, ast.Module]:
    return {m: ast.parse(p.read_text(), str(p)) for m, (p, _) in mods.items()}


def graph(checkout: Path = CHECKOUT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    mods = modules(checkout)
    trees = _trees(mods)
    return {m: _imports(m, trees[m], mods[m][1], mods) for m in mods}


def room(mod: str, checkout: Path = CHECKOUT) -> str:
    """The top-level folder (`checks/`) or module (`api.py`) of rollout_audit a module lives in."""
    parts = mod.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return parts[1] + ("/" if (checkout / PKG / parts[1]).is_dir() else ".py")


def layer(mod: str, layers: list[str] = LAYERS) -> int:
    """The floor a module stands on: its room's name among `layers`, else the top (len(layers))."""
    parts = mod.split(".")
    return layers.index(parts[1]) if len(parts) > 1 and parts[1] in layers else len(layers)


def floor_name(index: int, layers: list[str] = LAYERS) -> str:
    return layers[index] if index < len(layers) else "top"


def upward(g: dict[str, set[str]], layers: list[str] = LAYERS) -> list[tuple[str, str]]:
    """(importer, imported) for every import that runs up a floor."""
    return sorted((a, b) for a, ds in g.items() for b in ds if layer(b, layers) > layer(a, layers))


def declared_layers(checkout: Path) -> list[str]:
    """The checkout's own floors: `LAYERS` of its rollout_audit/dev/house.py, else of its tests/test_layers.py."""
    for rel in (f"{PKG}/dev/house.py", "tests/test_layers.py"):
        path = checkout / rel
        if not path.is_file():
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "LAYERS" for t in node.targets):
                return list(ast.literal_eval(node.value))
    raise SystemExit(f"{checkout}: no LAYERS in {PKG}/dev/house.py or tests/test_layers.py")


def _functions(tree: ast.Module, mod: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((child.end_lineno - child.lineno + 1, name))  # type: ignore[operator]
                walk(child, name)
            else:
                walk(child, prefix)

    walk(tree, mod)
    return out


_PROBE = """
import contextlib, importlib, io, json, sys
target, args = sys.argv[1], sys.argv[2:]
name, attr = target.split(":")
code = 0
with contextlib.redirect_stdout(io.StringIO()):
    try:
        getattr(importlib.import_module(name), attr)(args)
    except SystemExit as e:
        code = e.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def cli_imports(checkout: Path, args: list[str]) -> dict:
    """What a fresh interpreter holds after the checkout's `rollout-audit ARGS` (run from the checkout)."""
    target = tomllib.loads((checkout / "pyproject.toml").read_text())["project"]["scripts"]["rollout-audit"]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, target, *args],
        capture_output=True,
        text=True,
        cwd=checkout,
        env=env,
        timeout=300,
    )
    if res.returncode != 0 and not res.stdout.strip():
        raise SystemExit(f"{checkout}: rollout-audit {' '.join(args)} did not run: {res.stderr.strip()[-500:]}")
    got = json.loads(res.stdout.splitlines()[-1])
    mods = got["modules"]
    tops = {m.split(".")[0] for m in mods}
    return {
        "entry": target,
        "args": args,
        "exit": got["code"],
        "modules": len(mods),
        "own": sum(1 for m in mods if m == PKG or m.startswith(PKG + ".")),
        "heavy": sorted(tops & set(HEAVY)),
    }


def measure(checkout: Path = CHECKOUT, top: int = 10, cli: bool = True) -> dict:
    """Every figure of the house of `checkout`, as plain data."""
    checkout = checkout.resolve()
    mods = modules(checkout)
    trees = _trees(mods)
    g = {m: _imports(m, trees[m], mods[m][1], mods) for m in mods}
    lines = {m: len(p.read_text().splitlines()) for m, (p, _) in mods.items()}

    def room_of(m: str) -> str:
        return room(m, checkout)

    rooms: dict[str, dict] = {}
    for m in mods:
        r = rooms.setdefault(room_of(m), {"modules": 0, "lines": 0})
        r["modules"] += 1
        r["lines"] += lines[m]
    own = declared_layers(checkout)
    arrows = Counter((room_of(a), room_of(b)) for a, ds in g.items() for b in ds if room_of(a) != room_of(b))
    functions = sorted((f for m, t in trees.items() for f in _functions(t, m)), reverse=True)
    return {
        "checkout": str(checkout),
        "rooms": {
            r: {**v, "floor": floor_name(layer(f"{PKG}.{r.rstrip('/').removesuffix('.py')}"))}
            for r, v in sorted(rooms.items())
        },
        "floors": {"own": own, "today": LAYERS},
        "arrows": {f"{a} -> {b}": n for (a, b), n in sorted(arrows.items())},
        "upward": {
            "own": [f"{a} -> {b}" for a, b in upward(g, own)],
            "today": [f"{a} -> {b}" for a, b in upward(g, LAYERS)],
        },
        "largest_modules": [
            [lines[m], str(mods[m][0].relative_to(checkout))] for m in sorted(mods, key=lambda m: -lines[m])[:top]
        ],
        "largest_functions": [[n, name] for n, name in functions[:top]],
        "cli": cli_imports(checkout, ["check", "fixtures/compliant"]) if cli else None,
    }


def render(h: dict) -> str:
    total = sum(r["modules"] for r in h["rooms"].values()), sum(r["lines"] for r in h["rooms"].values())
    out = [f"house of {h['checkout']}", "", f"rooms ({len(h['rooms'])}; {total[0]} modules, {total[1]} lines):"]
    out += [
        f"  {r:<20} {v['modules']:>4} modules {v['lines']:>7} lines  floor {v['floor']}" for r, v in h["rooms"].items()
    ]
    out += ["", "floors, bottom-up:", "  own:   " + " < ".join([*h["floors"]["own"], "top"])]
    out += ["  today: " + " < ".join([*h["floors"]["today"], "top"])]
    out += ["", f"arrows ({len(h['arrows'])} room pairs, {sum(h['arrows'].values())} module imports):"]
    out += [f"  {k}: {n}" for k, n in h["arrows"].items()]
    for which in ("own", "today"):
        ups = h["upward"][which]
        out += ["", f"upward imports under the {which} floors: {len(ups)}", *(f"  {u}" for u in ups)]
    out += ["", "largest modules (lines):", *(f"  {n:>5}  {p}" for n, p in h["largest_modules"])]
    out += ["", "largest functions (lines):", *(f"  {n:>5}  {f}" for n, f in h["largest_functions"])]
    if c := h["cli"]:
        out += [
            "",
            f"rollout-audit {' '.join(c['args'])} ({c['entry']}, exit {c['exit']}): {c['modules']} modules loaded, "
            f"{c['own']} of them rollout_audit's; heavy: {', '.join(c['heavy']) or 'none'}",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rollout_audit.dev house", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=CHECKOUT, help="the checkout to measure (default: this one)")
    ap.add_argument("--top", type=int, default=10, help="how many of the largest modules and functions")
    ap.add_argument("--json", action="store_true", help="the figures as JSON")
    ap.add_argument("--no-cli", action="store_true", help="skip the fresh process that runs check")
    a = ap.parse_args(argv)
    h = measure(a.root, a.top, cli=not a.no_cli)
    print(json.dumps(h, indent=1) if a.json else render(h))
    return 0
