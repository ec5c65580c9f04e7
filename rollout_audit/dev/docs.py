"""The reference pages in `docs/`, rendered from their sources of truth: the contract from
`schemas/rollout_log_v1.json`, the check catalogue from the registered rules (docstrings and
declarations). `python -m rollout_audit.dev generate` writes them with every other derived file.
"""

from __future__ import annotations

from ..checks import all_rules
from ..contract import schema as S
from ..contract.config import LOG_CONTEXT
from ..contract.registry import FAMILIES, Rule
from ..faults import FAULTS
from ..reporting.settings import key_entry, keys
from .fixtures import USER_CONFIG


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def contract_markdown() -> str:
    """docs/contract.md: every table of the contract, with types, requirement levels and meanings."""
    doc = S.contract()
    out = [
        f"# The rollout log contract, v{doc['version']}",
        "",
        "Rendered from `schemas/rollout_log_v1.json` by `python -m rollout_audit.dev generate`; do not edit by hand.",
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
        out += [
            f"| `{c.name}` | `{c.type}` | {c.requirement} | {_cell(c.meaning + _domain(c.bounds))} |"
            for c in S.columns(table)
        ]
    out += ["", "## Token sources", ""]
    out += [f"- `{k}`: {v}" for k, v in doc["token_source"].items()]
    out += ["", "## Stop reasons and the flag each one sets", ""]
    out += [f"- **{flag}**: {', '.join(f'`{r}`' for r in rs)}" for flag, rs in doc["stop_reasons"].items()]
    for key in ("finish_reasons", "reductions", "advantage_estimators"):
        out += ["", f"## {key.replace('_', ' ').capitalize()}", ""]
        out += [f"- {_item(x)}" for x in doc[key]]
    for key, column in (
        ("reducer_modes", "reducer_mode"),
        ("ratio_anchors", "ratio_anchor"),
        ("ratio_corrections", "ratio_correction"),
    ):
        out += ["", f"## {key.replace('_', ' ').capitalize()} (update column `{column}`)", ""]
        out += [f"- `{k}`: {v}" for k, v in doc[key].items()]
    out += ["", "## Truncation policies (configuration `truncation`)", ""]
    out += [f"- `{k}`: {v}" for k, v in doc["truncation_policies"].items()]
    out += ["", "## File metadata", ""]
    out += [f"- `{k}`: {_item(v)}" for k, v in doc["metadata"].items()]
    out += ["", "## Versions", "", "A column's version is the one that added it; a file states the newest it uses.", ""]
    out += [f"- **{k}**: {v}" for k, v in doc["versions"].items()]
    return "\n".join(out) + "\n"


_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤"}


def _domain(bounds: dict) -> str:
    """` (domain: > 0, ≤ 1, finite)` for a column with a value domain."""
    parts = [f"{_BOUNDS[k]} {v}" for k, v in bounds.items() if k in _BOUNDS]
    parts += ["finite"] if bounds.get("finite") else []
    parts += ["not infinite"] if bounds.get("not_infinite") else []
    return f" (domain: {', '.join(parts)})" if parts else ""


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


def _trainer_note(r: Rule) -> str:
    """Known cases where a trainer's documented settings make a finding's situation compliant: the
    keys of the rule that a log (or its adapter) may state as how the run was produced."""
    stated = [k for k in r.config if k in LOG_CONTEXT]
    if not stated:
        return "None known: what this check reports is a defect under every trainer's settings the adapters read."
    keys = ", ".join(f"[`{k}`](configuration.md#{k})" for k in stated)
    return (
        f"The trainer's own settings, stated through {keys} (by its adapter from the trainer's configuration, "
        "in the log's own configuration, or by you), decide what is compliant: the check verifies the log "
        "against them, never against a project default."
    )


def _examples(r: Rule) -> str:
    named = [f for f in FAULTS.values() if r.code in f.codes]
    if not named:
        return "No named fault yet."
    flag = " --preview" if r.preview else ""  # a check in preview reports only when asked for

    def user(f) -> str:  # the user's own configuration, beside the fixture's log
        return f" --config fixtures/{USER_CONFIG.format(fault=f.name)}" if f.user_config else ""

    return " ".join(
        f"`rollout-audit check{flag} fixtures/broken/{f.name}{user(f)}`: {f.description}" for f in named[:2]
    )


def checks_markdown() -> str:
    """docs/checks.md: one entry per check, by family, under fixed headings (what it does, why it
    matters, the trainer policies that make it compliant, an example, the settings it reads, its
    inputs), all rendered from the rule's declaration and docstring."""
    rules = all_rules()
    out = [
        "# The checks",
        "",
        "Rendered from the registered rules by `python -m rollout_audit.dev generate`; do not edit by hand.",
        "`rollout-audit explain CODE` prints one entry. Each check runs only on the inputs it declares;",
        "where one is absent it is listed as not run with the reason, never counted as passed. A check in",
        "*preview* runs only with `--preview` (or `preview = true`) until it has audited every framework's",
        "compliant fixture clean.",
    ]
    for fam, title in FAMILIES.items():
        members = [r for r in rules.values() if r.family == fam]
        if not members:
            continue
        out += ["", f"## {fam}: {title}"]
        for r in members:
            body = r.explanation.split("\n\n", 1)
            settings = ", ".join(f"[`{k}`](configuration.md#{k})" for k in r.config) or "none"
            out += [
                "",
                f"### {r.code} ({r.severity}{', preview' if r.preview else ''}): {r.name}",
                "",
                f"**What it does.** {' '.join(body[0].split())}",
                "",
                f"**Why it matters.** {body[1].strip() if len(body) > 1 else r.name}",
                "",
                f"**When the trainer's settings make it compliant.** {_trainer_note(r)}",
                "",
                f"**Example.** {_examples(r)}",
                "",
                f"**Settings.** {settings}.",
                "",
                f"**Inputs.** {_inputs(r)}.",
            ]
    return "\n".join(out) + "\n"


def configuration_markdown() -> str:
    """docs/configuration.md: every configuration key, described once (`rollout-audit config KEY`)."""
    out = [
        "# Configuration",
        "",
        "Rendered from `Config` by `python -m rollout_audit.dev generate`; do not edit by hand.",
        "Keys go in `[tool.rollout-audit]` of a pyproject.toml (found at or above the audited log),",
        "or in a file named with `--config` (top-level keys or the same table). `rollout-audit config KEY`",
        "prints one entry. A configuration inside the audited log may set only the keys that state how",
        "the run was produced; with `--config`, your settings are layered over those.",
    ]
    for k in keys():
        out += ["", key_entry(k, markdown=True)]
    return "\n".join(out) + "\n"
