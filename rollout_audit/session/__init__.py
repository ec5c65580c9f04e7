"""The one audit session: every entry point states a `Request` and gets an `Audited` (`audit`); the
verdict the session settles (tolerated shares, baselines: `verdict`); and what a trainer's dump needs
around the checks (`dumps`)."""

from .audit import Audited, Request, configure, run
from .dumps import in_memory, relabel

__all__ = ["Audited", "Request", "configure", "in_memory", "relabel", "run"]
