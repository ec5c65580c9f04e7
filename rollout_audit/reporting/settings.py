"""Each configuration key described once: its type, default, description (the `Config` field's),
where it may be set, and the checks that read it. `rollout-audit config KEY` prints one entry and
docs/configuration.md is rendered from the same function."""

from __future__ import annotations

import json
from typing import Any

from ..contract.config import LOG_CONTEXT, TRUSTED_ONLY, Config
from ..contract.errors import UsageError
from ..running.catalogue import entries

__all__ = ["key_entry", "keys", "readers"]


def keys() -> list[str]:
    """Every configuration key, in the order `Config` declares them."""
    return list(Config.model_fields)


def readers(key: str) -> list[str]:
    """The codes of the checks that declare they read `key`."""
    return sorted(c for c, r in entries().items() if key in r.config)


def _default(key: str) -> Any:
    f = Config.model_fields[key]
    return f.get_default(call_default_factory=True)


def _where(key: str) -> str:
    if key in TRUSTED_ONLY:
        return "only by the user (command line, --config FILE, the project's own pyproject.toml): it runs code or sends the log over the network"
    if key in LOG_CONTEXT:
        return "anywhere, a configuration inside the audited log included (it states how the run was produced)"
    return "by the user's configuration, never by one inside the audited log"


def key_entry(key: str, *, markdown: bool = False) -> str:
    """The entry of one key; UsageError naming the closest key when there is none."""
    name = key.replace("-", "_")
    if name not in Config.model_fields:
        import difflib

        near = difflib.get_close_matches(name, keys(), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise UsageError(f"unknown configuration key {key!r}{hint} (`rollout-audit config --list`)")
    f = Config.model_fields[name]
    ann = f.annotation
    kind = ann.__name__ if isinstance(ann, type) else str(ann).replace("typing.", "")
    read = ", ".join(readers(name)) or "none (it applies to the audit as a whole)"
    rows = [
        ("Type", kind),
        ("Default", json.dumps(_default(name), default=str)),
        ("Set", _where(name)),
        ("Read by", read),
    ]
    if markdown:
        body = [f"### `{name}`", "", f.description or "", ""]
        body += [f"- *{k}:* {v if k != 'Default' else f'`{v}`'}" for k, v in rows]
        return "\n".join(body)
    return "\n".join([name, "", f.description or "", "", *(f"{k + ':':<9}{v}" for k, v in rows)])
