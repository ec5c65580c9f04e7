"""Outputs never touch inputs: every command that writes checks its output path against the
audited paths by resolved real path and by inode, so `./log/x`, an absolute path, a symlink
or a bind mount cannot make a report (or a broken copy) land on or inside the log it reads."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..contract.config import log_root
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
    """Raise UsageError when `output` is an audited file (by path, or by device and inode: a hard
    link or a symlink to one), lies inside an audited log (the root of the log an input belongs to,
    whatever path inside it was named: `LOG/trajectories/part-0000.parquet` brings `LOG`), is empty,
    or is a FIFO, a device or a socket (writing there would block or never end).

    `writes_log`: the output is a directory of Parquet files (`faults apply`, `filter`); it must then
    also stay out of the directory that holds an audited file, or the next audit of that directory
    would read the written files as part of the log, and must not contain an input.
    """
    if not os.fspath(output):
        raise UsageError("an empty output path names the working directory; name a file or directory")
    inputs = list(inputs)
    if storage.is_remote(output) or any(storage.is_remote(i) for i in inputs):
        inputs = _check_remote(output, inputs)
    output = storage.local_path(output)
    out = _real(output)
    _not_special(output, out)
    out_chain = {i for i in map(_ident, _existing_ancestors(out)) if i is not None}
    out_id = _ident(out)
    for raw in map(storage.local_path, inputs):
        src = _real(raw)
        src_id = _ident(src)
        root = log_root(src)
        roots = [src] if src.is_dir() else ([src.parent] if writes_log else [])
        roots += [root] if root is not None and root not in roots else []
        if out == src or (out_id is not None and out_id == src_id):
            raise UsageError(f"{output}: is the audited input {raw} (the tool never writes to its input)")
        for r in roots:
            if r == out or r in out.parents or _ident(r) in out_chain:
                raise UsageError(f"{output}: lies inside the audited log {raw} (the tool never writes to its input)")
        if writes_log and out in src.parents:
            raise UsageError(f"{output}: contains the audited log {raw} (the tool never writes to its input)")
        if out_id is not None and any(out_id in _file_idents(r) for r in roots if r.is_dir()):
            raise UsageError(
                f"{output}: is a hard link to a file of the audited log {raw} (the tool never writes to its input)"
            )


def _not_special(shown: str | os.PathLike, out: Path) -> None:
    """UsageError when `out` exists and is neither a regular file nor a directory."""
    try:
        mode = out.stat().st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise UsageError(f"{shown}: is not a regular file (a FIFO, device or socket); name a file to write")


def _file_idents(root: Path) -> set[_Ident]:
    """Device and inode of every file under `root` (a hard link to one has the same pair)."""
    out: set[_Ident] = set()
    for d, _, names in os.walk(root, onerror=lambda e: None):
        for n in names:
            i = _ident(Path(d) / n)
            if i is not None:
                out.add(i)
    return out


def write_atomic(output: str | os.PathLike, text: str | bytes) -> None:
    """Write `text` to a new file next to `output` and rename it over `output`: an existing file there
    (or a hard link to one elsewhere) is replaced, never written through, and a reader never sees half.
    A FIFO, device or socket at `output` is refused, never opened (it would block)."""
    out = Path(output)
    _not_special(output, out)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if str(out.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8") if isinstance(text, str) else text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
    """Raise UsageError unless `out` is absent or an empty directory (a log is written there). A
    symbolic link is refused, dangling or not: a log is never written through a link into a
    directory the link's author chose (nor can the rename that publishes it replace a link)."""
    p = Path(out)
    if p.is_symlink():
        state = "a dangling symlink" if not p.exists() else "a symlink"
        raise UsageError(f"{out}: is {state}; name a new directory (a log is never written through a link)")
    if p.exists() and not p.is_dir():
        raise UsageError(f"{out}: exists and is not a directory; choose a new directory")
    if p.is_dir() and any(p.iterdir()):
        raise UsageError(f"{out}: directory exists and is not empty; choose a new directory")


# the most of an existing file `append_atomic` copies before adding to it (a metrics file grows by one
# line per audited step)
MAX_APPEND_BYTES = 64 << 20


def append_atomic(output: str | os.PathLike, text: str) -> None:
    """`text` added at the end of `output` through a temporary copy and a rename (`write_atomic`): a
    hard link to another file is never appended through, a reader never sees half a line, and a
    FIFO, device or socket is refused. UsageError when the existing file is larger than
    MAX_APPEND_BYTES."""
    out = Path(output)
    _not_special(output, out)
    before = b""
    if out.exists():
        with open(out, "rb") as fh:
            before = fh.read(MAX_APPEND_BYTES + 1)
        if len(before) > MAX_APPEND_BYTES:
            raise UsageError(f"{output}: larger than {MAX_APPEND_BYTES} bytes; name a new file to append to")
    write_atomic(out, before + text.encode("utf-8"))


@contextlib.contextmanager
def atomic_directory(output: str | os.PathLike) -> Iterator[Path]:
    """A directory output that appears whole or not at all: yields a new hidden directory next to
    `output` to fill, renamed to `output` when the block ends without an error (an empty directory
    there is replaced), removed otherwise: a killed process leaves a hidden `.NAME.*.tmp` directory
    beside it, never a partial `output`."""
    out = Path(output)
    check_new_directory(out)
    parent = out.parent if str(out.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        if out.is_dir():
            out.rmdir()  # empty (check_new_directory): a rename cannot replace it otherwise
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
