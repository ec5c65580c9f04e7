"""Outputs never touch inputs: every command that writes checks its output path against the
audited paths by resolved real path and by inode, so `./log/x`, an absolute path, a symlink
or a bind mount cannot make a report (or a broken copy) land on or inside the log it reads."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..contract.errors import UsageError
from ..reading import storage

_Ident = tuple[int, int]  # (st_dev, st_ino)


def _ident(p: Path) -> _Ident | None:
    """Device and inode of `p` (symlinks followed), or None when it does not exist."""
    try:
        st = p.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _real(p: str | os.PathLike) -> Path:
    """Absolute path with every symlink of its existing part resolved."""
    return Path(os.path.realpath(os.path.abspath(p)))


def _existing_ancestors(p: Path) -> list[Path]:
    """`p` and its parents that exist, nearest first."""
    return [a for a in (p, *p.parents) if a.exists()]


def check_output(output: str | os.PathLike, inputs: Iterable[str | os.PathLike], *, writes_log: bool = False) -> None:
    """Raise UsageError when `output` is an audited file or lies inside an audited directory.

    `writes_log`: the output is a directory of Parquet files (`faults apply`); it must then
    also stay out of the directory that holds an audited file, or the next audit of that
    directory would read the written files as part of the log, and must not contain an input.
    """
    if storage.is_remote(output) or any(storage.is_remote(i) for i in inputs):
        inputs = _check_remote(output, inputs)
    output = storage.local_path(output)
    out = _real(output)
    out_chain = {i for i in map(_ident, _existing_ancestors(out)) if i is not None}
    out_id = _ident(out)
    for raw in map(storage.local_path, inputs):
        src = _real(raw)
        src_id = _ident(src)
        roots = [src] if src.is_dir() else ([src.parent] if writes_log else [])
        if out == src or (out_id is not None and out_id == src_id):
            raise UsageError(f"{output}: is the audited input {raw} (the tool never writes to its input)")
        for root in roots:
            if root == out or root in out.parents or _ident(root) in out_chain:
                raise UsageError(f"{output}: lies inside the audited log {raw} (the tool never writes to its input)")
        if writes_log and out in src.parents:
            raise UsageError(f"{output}: contains the audited log {raw} (the tool never writes to its input)")


def _check_remote(output: str | os.PathLike, inputs: Iterable[str | os.PathLike]) -> list[str | os.PathLike]:
    """Refuse an object-store output inside an audited prefix (and any object-store output:
    reports are written locally); return the local inputs left to compare by path."""
    inputs = list(inputs)
    if storage.is_remote(output):
        for raw in inputs:
            if storage.is_remote(raw) and storage.contains(str(raw), str(output)):
                raise UsageError(f"{output}: lies inside the audited log {raw} (the tool never writes to its input)")
        raise UsageError(f"{output}: reports are written to a local path, not to object storage")
    return [i for i in inputs if not storage.is_remote(i)]


def check_new_directory(out: str | os.PathLike) -> None:
    """Raise UsageError unless `out` is absent or an empty directory (a log is written there)."""
    p = Path(out)
    if p.is_symlink() and not p.exists():
        raise UsageError(f"{out}: is a dangling symlink; choose a new directory")
    if p.exists() and not p.is_dir():
        raise UsageError(f"{out}: exists and is not a directory; choose a new directory")
    if p.is_dir() and any(p.iterdir()):
        raise UsageError(f"{out}: directory exists and is not empty; choose a new directory")
