"""Reporting: the report's output formats (registered with running.report when this package is
imported), multi-log rendering, HTML, stats, transcripts and output paths; imports any layer below it."""

from . import report as _formats  # noqa: F401  (registers text, concise, json, github, junit)
from . import sarif as _sarif  # noqa: F401  (registers sarif)
