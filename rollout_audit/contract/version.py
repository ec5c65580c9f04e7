"""The tool's version, which baselines and reports carry (the package's `__version__`)."""

__version__ = "0.1.0"
