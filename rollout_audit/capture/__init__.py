"""`rollout-audit capture`: a passive recorder in front of an OpenAI-compatible server, writing the
record format of `rollout_audit.contract.capture` that `check --from openai` audits. It imports
nothing of the audit but that format (and needs aiohttp: the `capture` extra)."""
