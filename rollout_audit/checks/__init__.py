"""The check catalogue. Each module holds one family; importing registers its rules."""

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
