"""Logs on object storage: `s3://bucket/run/`, `gs://bucket/run/` (and `file://` paths) read
through pyarrow's filesystems, so that credentials follow the usual conventions (for S3:
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE, AWS_DEFAULT_REGION,
AWS_ENDPOINT_URL, instance roles) and an endpoint can be set in the URI
(`s3://bucket/run?endpoint_override=host:9000&scheme=http`).

A remote log is named by its URI without the query (`s3://bucket/run/x.parquet`) in every
report. Listing applies the rules of a local directory: writer temp files and other names a
writer leaves are reported, not read; hidden and `_` files are skipped."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from ..contract.errors import UsageError

REMOTE = ("s3", "gs", "gcs")  # schemes read through pyarrow's object-store clients
_FILESYSTEMS: dict[tuple[str, str], pafs.FileSystem] = {}  # (scheme, bucket) -> client, one per process
_LOCK = threading.Lock()
# S3 client deadlines in seconds (connect; each request): a silent endpoint fails within them.
# The configuration's storage_connect_timeout / storage_request_timeout set them (`set_timeouts`).
TIMEOUTS = {"connect": 10.0, "request": 30.0}


def set_timeouts(connect: float, request: float) -> None:
    """Deadlines for the object-store clients made from now on (clients already made are dropped)."""
    with _LOCK:
        if (TIMEOUTS["connect"], TIMEOUTS["request"]) != (connect, request):
            TIMEOUTS.update(connect=connect, request=request)
            _FILESYSTEMS.clear()


def is_remote(path: str | os.PathLike) -> bool:
    """True for an object-store URI (`s3://...`, `gs://...`)."""
    return isinstance(path, str) and urlsplit(path).scheme.lower() in REMOTE and "://" in path


def local_path(path: str | os.PathLike) -> str | os.PathLike:
    """A `file://` URI as the local path it names; anything else unchanged."""
    if isinstance(path, str) and path.lower().startswith("file://"):
        parts = urlsplit(path)
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"{path}: a file:// URI names a host; only local files can be read")
        return unquote(parts.path)
    return path


def _name(uri: str) -> str:
    """The URI as reports show it: scheme, bucket and key, without query or trailing slash."""
    parts = urlsplit(uri)
    key = parts.path.rstrip("/")
    return f"{parts.scheme.lower()}://{parts.netloc}{key}"


def _client(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem for `uri` (made once per scheme and bucket) and the path inside it."""
    parts = urlsplit(uri)
    key = (parts.scheme.lower(), parts.netloc)
    with _LOCK:
        fs = _FILESYSTEMS.get(key)
        if fs is None or parts.query:  # a query (endpoint, region) makes a new client for the bucket
            try:  # the scheme in any case (`GS://`), as is_remote takes it
                fs, _ = pafs.FileSystem.from_uri(f"{key[0]}{uri[len(parts.scheme) :]}")
            except (pa.ArrowException, ValueError, OSError) as err:  # no bucket, an unknown query parameter
                raise UsageError(f"{_name(uri)}: not a usable object-store URI: {_first(err)[:300]}") from None
            if isinstance(fs, pafs.S3FileSystem):  # the same settings, with deadlines and one retry
                options = fs.__reduce__()[1][0]
                options.update(connect_timeout=TIMEOUTS["connect"], request_timeout=TIMEOUTS["request"])
                fs = pafs.S3FileSystem(**options, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2))
            elif isinstance(fs, pafs.GcsFileSystem):  # without credentials it would retry for many minutes
                options = fs.__reduce__()[1][0]
                options.update(retry_time_limit=timedelta(seconds=TIMEOUTS["request"]))
                fs = pafs.GcsFileSystem(**options)
            _FILESYSTEMS[key] = fs
    return fs, f"{parts.netloc}{parts.path}".rstrip("/")


def open_input(uri: str) -> Any:
    """A random-access pyarrow file for an object named by its URI (as listed)."""
    fs, path = _client(uri)
    return fs.open_input_file(path)


def is_writer_temp(name: str) -> bool:
    """A file a Parquet writer was still writing (`.NAME.parquet.XXXXXXXX.tmp` and the like)."""
    return ".parquet" in name and name.endswith((".tmp", ".temp", ".partial"))


def list_parquet(uri: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Parquet objects under `uri` (sorted as a local walk sorts them), and what was found but
    not read (URI, reason). Raises FileNotFoundError when nothing exists at `uri`."""
    fs, root = _client(uri)
    scheme = urlsplit(uri).scheme.lower()
    try:
        info = fs.get_file_info(root)
    except (OSError, pa.ArrowException) as err:  # no credentials, no route, a silent endpoint: one line naming the URI
        raise FileNotFoundError(f"{_name(uri)}: the object store cannot be reached: {_first(err)[:300]}") from None
    if info.type == pafs.FileType.File:
        return [_name(uri)], []
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{_name(uri)}: no such object or prefix")
    try:
        entries = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except (OSError, pa.ArrowException) as err:
        return [], [(_name(uri), f"prefix cannot be listed ({type(err).__name__}: {_first(err)}); not audited")]
    found: list[str] = []
    skipped: list[tuple[str, str]] = []
    for e in entries:
        name = f"{scheme}://{e.path}"
        if e.type == pafs.FileType.Directory:
            continue
        if is_writer_temp(e.base_name):
            skipped.append(
                (name, "temporary file of an unfinished write (the writer was killed or is still running); not audited")
            )
        elif e.base_name.endswith(".parquet") and not e.base_name.startswith((".", "_")):
            if e.type == pafs.FileType.File:
                found.append(name)
            else:
                skipped.append((name, "not a regular file; not read"))
    return sorted(found, key=lambda p: PurePosixPath(p).parts), skipped


def _first(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""


def contains(prefix: str, uri: str) -> bool:
    """True when the object `uri` is `prefix` or lies under it (same scheme and bucket)."""
    a, b = _name(prefix), _name(uri)
    return b == a or b.startswith(a + "/")
