"""Contract logs written: `RolloutWriter` validates each batch as the checks would and publishes
files atomically; `write_table` adds a trainer's columns the contract does not define."""

from .writer import RolloutWriter, write_table

__all__ = ["RolloutWriter", "write_table"]
