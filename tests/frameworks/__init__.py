"""Generators of the framework fixtures (`fixtures/frameworks/<name>/<case>.jsonl`): one module per
adapter name, each with `cases() -> dict[str, list[dict]]`. See `tests/frameworks/build.py`."""
