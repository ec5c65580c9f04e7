"""The package's folders are its layers: imports go only downward, and no modules import each other in a cycle.

Every module of rollout_audit is read with `ast` (nothing is imported), and every import in it,
at module level, inside a function or under `if TYPE_CHECKING`, is resolved to a module of the
package (the graph and the floors are `rollout_audit.dev.house`'s, which `python -m rollout_audit.dev
house` prints). Layers, bottom-up:

    contract < reading < frames < replay < checks < running < writing < reporting < adapters
        < session < workflow < top

`replay` (the replayer interface, the replayers and the sampling of the tokens they score) sits
below the checks because L205-L207 call it; `writing` validates what it writes with the runner.
`session` is the one audit every entry point goes through, `workflow` the long-run workflows on
top of it (watch, diff, filter). `top` is what faces the user: cli, api, testing, validation,
pytest_plugin, integrations, and the tools beside the audit (synth, faults, dev) and the
package's own __init__. A module may import its own layer and any layer below. Within a layer, modules must not import each other in a cycle (a cycle that spans
layers always holds an upward import, which is reported as such). A package's __init__ counts as
a module of its own; importing a submodule is not counted as importing its package.
"""

from __future__ import annotations

import functools

from rollout_audit.dev import house
from rollout_audit.dev.house import LAYERS, PKG

ROOT = house.CHECKOUT / PKG
TOP = len(LAYERS)

# Imports that break the layering today, as (importer, imported), names relative to rollout_audit.
# This list only shrinks: a pair that no longer occurs fails test_known_violations_are_current
# until it is deleted here, and a pair not listed fails test_imports_go_down_without_cycles.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


def _layer(mod: str) -> int:
    return house.layer(mod)


def _short(mod: str) -> str:
    return mod[len(PKG) + 1 :] if mod.startswith(PKG + ".") else mod


@functools.cache
def graph() -> dict[str, set[str]]:
    return house.graph()


def _same_layer_cycles(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Edges that lie on a cycle of imports within one layer (Tarjan's strongly connected components)."""
    edges = {m: {d for d in ds if _layer(d) == _layer(m)} for m, ds in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comp: dict[str, int] = {}
    counter = [0]

    def visit(v: str) -> None:  # iterative, so a long chain cannot reach the recursion limit
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp[w] = index[node]
                        if w == node:
                            break

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return {(a, b) for a, ds in edges.items() for b in ds if comp[a] == comp[b]}


def violations() -> dict[tuple[str, str], str]:
    """(importer, imported) -> why, for every upward import and every import on a same-layer cycle."""
    g = graph()
    out = {}
    for a, ds in g.items():
        for b in ds:
            if _layer(b) > _layer(a):
                out[(_short(a), _short(b))] = f"upward ({_name(_layer(a))} imports {_name(_layer(b))})"
    for a, b in _same_layer_cycles(g):
        out[(_short(a), _short(b))] = f"cycle within {_name(_layer(a))}"
    return out


def _name(layer: int) -> str:
    return LAYERS[layer] if layer < TOP else "top"


def _lines(pairs, why) -> str:
    return "\n".join(f"  {a} -> {b}: {why.get((a, b), 'no longer occurs')}" for a, b in sorted(pairs))


def test_every_layer_is_a_subpackage():
    missing = [layer for layer in LAYERS if not (ROOT / layer / "__init__.py").is_file()]
    assert not missing, f"layer subpackages missing: {missing}"


def test_imports_go_down_without_cycles():
    found = violations()
    print("layer violations:\n" + _lines(found, found))
    new = set(found) - KNOWN_VIOLATIONS
    assert not new, "imports against the layers (importer -> imported):\n" + _lines(new, found)


def test_known_violations_are_current():
    found = violations()
    gone = KNOWN_VIOLATIONS - set(found)
    assert not gone, "fixed; delete from KNOWN_VIOLATIONS in tests/test_layers.py:\n" + _lines(gone, found)


def test_house_counts_an_upward_import_in_another_checkout(tmp_path):
    """`python -m rollout_audit.dev house --root` measures a checkout from its files alone."""
    pkg = tmp_path / PKG
    for rel, text in {
        "__init__.py": "",
        "contract/__init__.py": "",
        "contract/version.py": "from ..session import audit\n",
        "session.py": "from .contract import version\ndef audit():\n    return 1\n",
        "cli.py": "import rollout_audit.session\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_layers.py").write_text('LAYERS = ["contract"]\n')
    h = house.measure(tmp_path, cli=False)
    assert h["floors"]["own"] == ["contract"]
    assert h["rooms"]["session.py"] == {"modules": 1, "lines": 3, "floor": "session"}
    assert h["upward"]["own"] == h["upward"]["today"] == ["rollout_audit.contract.version -> rollout_audit.session"]
    assert h["arrows"] == {"cli.py -> session.py": 1, "contract/ -> session.py": 1, "session.py -> contract/": 1}
    assert h["largest_functions"] == [[2, "rollout_audit.session.audit"]]


def test_house_of_this_checkout_has_no_upward_import():
    h = house.measure(cli=False)
    assert h["upward"] == {"own": [], "today": []}
    assert sum(r["modules"] for r in h["rooms"].values()) == len(graph())


def test_the_recorder_imports_nothing_of_the_audit_but_its_record_format():
    """`rollout-audit capture` has a room of its own: what it imports of rollout_audit is the record
    format it writes (`contract.capture`) and the version it prints, never the readers or checks."""
    allowed = {"rollout_audit.contract.capture", "rollout_audit.contract.version"}
    g = graph()
    used = {dst for src, dsts in g.items() if src.startswith("rollout_audit.capture") for dst in dsts}
    assert used, "no import of the recorder was read"
    outside = {d for d in used if d.startswith("rollout_audit") and not d.startswith("rollout_audit.capture")}
    assert outside <= allowed, sorted(outside - allowed)
