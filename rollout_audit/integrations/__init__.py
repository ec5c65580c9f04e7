"""Integrations with training frameworks: contract records built from a trainer's in-memory
batch, and guards that audit each batch inside the training loop.

Each module needs its framework installed (`pip install "rollout-audit[trl]"` for `trl`);
importing this package needs nothing beyond the core.
"""
