"""The reference pages in `docs/`, rendered from their sources of truth: the contract from
`schemas/rollout_log_v1.json`, the check catalogue from the registered rules (docstrings and
declarations). A test keeps the committed pages current.

    python -m rollout_audit.dev.docs            # rewrite docs/contract.md and docs/checks.md
    python -m rollout_audit.dev.docs --check    # exit 1 if they differ from what the code says
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..contract import schema as S
from ..contract.registry import FAMILIES, Rule, all_rules


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def contract_markdown() -> str:
    """docs/contract.md: every table of the contract, with types, requirement levels and meanings."""
    doc = S.contract()
    out = [
        f"# The rollout log contract, v{doc['version']}",
        "",
        "Rendered from `schemas/rollout_log_v1.json` by `python -m rollout_audit.dev.docs`; do not edit by hand.",
        "`rollout-audit schema` prints the same tables. Requirement levels:",
        "",
    ]
    out += [f"- **{k}**: {v}" for k, v in doc["requirement_levels"].items()]
    titles = {
        "trajectories": "Trajectory records: one row per episode",
        "turn": "The turn struct: one element of `turns` per agent turn",
        "updates": "Update records: one row per optimizer update",
    }
    for table, title in titles.items():
        out += ["", f"## {title}", "", "| column | type | level | meaning |", "|---|---|---|---|"]
        out += [f"| `{c.name}` | `{c.type}` | {c.requirement} | {_cell(c.meaning)} |" for c in S.columns(table)]
    out += ["", "## Token sources", ""]
    out += [f"- `{k}`: {v}" for k, v in doc["token_source"].items()]
    out += ["", "## Stop reasons and the flag each one sets", ""]
    out += [f"- **{flag}**: {', '.join(f'`{r}`' for r in rs)}" for flag, rs in doc["stop_reasons"].items()]
    for key in ("finish_reasons", "reductions", "advantage_estimators"):
        out += ["", f"## {key.replace('_', ' ').capitalize()}", ""]
        out += [f"- {_item(x)}" for x in doc[key]]
    out += ["", "## Truncation policies (configuration `truncation`)", ""]
    out += [f"- `{k}`: {v}" for k, v in doc["truncation_policies"].items()]
    out += ["", "## File metadata", ""]
    out += [f"- `{k}`: {_item(v)}" for k, v in doc["metadata"].items()]
    return "\n".join(out) + "\n"


def _item(x: object) -> str:
    if isinstance(x, dict):
        return "; ".join(f"{k}: {v}" for k, v in x.items())
    return f"`{x}`" if isinstance(x, str) and " " not in x else str(x)


def _inputs(r: Rule) -> str:
    parts = []
    if r.requires:
        parts.append("requires " + ", ".join(f"`{q}`" for q in r.requires))
    if r.optional:
        parts.append("reads when present " + ", ".join(f"`{q}`" for q in r.optional))
    if r.config:
        parts.append("configuration " + ", ".join(f"`{q}`" for q in r.config))
    return "; ".join(parts) or "nothing beyond the file list"


def checks_markdown() -> str:
    """docs/checks.md: one entry per check, by family: the rule, the lesson it restates, its inputs."""
    rules = all_rules()
    out = [
        "# The checks",
        "",
        "Rendered from the registered rules by `python -m rollout_audit.dev.docs`; do not edit by hand.",
        "`rollout-audit explain CODE` prints one entry. Each check runs only on the inputs it declares;",
        "where one is absent it is listed as not run with the reason, never counted as passed.",
    ]
    for fam, title in FAMILIES.items():
        members = [r for r in rules.values() if r.family == fam]
        if not members:
            continue
        out += ["", f"## {fam}: {title}"]
        for r in members:
            out += ["", f"### {r.code} ({r.severity}): {r.name}", "", r.explanation, "", f"*Inputs:* {_inputs(r)}."]
    return "\n".join(out) + "\n"


PAGES = {"contract.md": contract_markdown, "checks.md": checks_markdown}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="exit 1 if a page differs from the code")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent.parent / "docs"))
    args = ap.parse_args(argv)
    stale = []
    for name, render in PAGES.items():
        path = Path(args.out) / name
        text = render()
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run `python -m rollout_audit.dev.docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
