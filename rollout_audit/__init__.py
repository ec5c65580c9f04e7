"""rollout-audit: recompute what an agent RL rollout log claims, before training on it.

    import rollout_audit as ra
    log = ra.scan("logs/")                      # polars LazyFrames: .trajectories .turns .tokens
    report = ra.audit("logs/")                  # or ra.audit(traj_table, update_table)
    report.ok, report.findings                  # findings: a polars DataFrame

Names are imported lazily so that `rollout-audit --help` starts fast.
"""

from __future__ import annotations

import importlib

from .contract.version import __version__ as __version__

_EXPORTS = {
    "Config": "contract.config",
    "load_config": "contract.config",
    "audit": "api",
    "audit_tables": "api",
    "Options": "running.options",
    "RolloutWriter": "writing",
    "UsageError": "contract.errors",
    "Log": "reading.log",
    "scan": "reading.log",
    "RULES": "checks",
    "all_rules": "checks",
    "ConfigError": "contract.errors",
    "RolloutAuditError": "contract.errors",
    "InputError": "contract.errors",
    "AdapterError": "contract.errors",
    "ReplayError": "contract.errors",
    "AuditFailed": "contract.errors",
    "records_to_table": "reading.records",
    "Report": "running.report",
    "models": "contract.models",
}
__all__ = sorted(_EXPORTS)


def __dir__() -> list[str]:
    """The lazily imported names too, so that `dir(rollout_audit)` and completion list them."""
    return sorted({*globals(), *_EXPORTS})


def __getattr__(name: str):
    if name in _EXPORTS:
        if _EXPORTS[name].startswith(("running", "api")):
            importlib.import_module(".reporting", __name__)  # registers the report's output formats
        mod = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        return mod if name == _EXPORTS[name].rpartition(".")[2] else getattr(mod, name)
    raise AttributeError(f"module 'rollout_audit' has no attribute {name!r}")
