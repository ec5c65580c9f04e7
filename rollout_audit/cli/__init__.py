"""The command line: the click face (`main`) and one function per command (`commands`)."""

from .main import main

__all__ = ["main"]
