"""The check catalogue. Each module holds one family; importing registers its rules."""

from ..contract.registry import RULES, Rule, registered
from . import (  # noqa: F401
    environment,
    groups,
    logprobs,
    masks,
    replay,
    rewards,
    structure,
    termination,
    updates,
    versions,
)

__all__ = ["RULES", "all_rules"]


def all_rules() -> dict[str, Rule]:
    """Every rule of the catalogue (and any registered since), by code."""
    return registered()
