"""Log locations that may be local paths or fsspec URIs (``s3://bucket/run``, ``gs://...``).

Inspect writes and reads logs through fsspec, so a log directory may live in object storage.
A URI must stay a string: ``pathlib.Path("s3://b/run")`` collapses the double slash into
``s3:/b/run``, which then names a local directory. Local paths keep being :class:`Path`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import posixpath
import re
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from twice.mocks import UsageError


class LogReadError(UsageError):
    """A log directory that is missing, empty, or holds a log that cannot be read."""


class StorageError(LogReadError, OSError):
    """Object storage that cannot be reached or used (no such bucket, no endpoint, denied):
    one line naming the location and the cause, where fsspec would give a deep traceback.
    An ``OSError`` too, so code that handles a local write failure handles this one."""


F = TypeVar("F", bound=Callable[..., Any])


def _remote_errors(fn: F) -> F:
    """Turn any error of a remote operation on ``location`` into a :class:`StorageError`."""

    @functools.wraps(fn)
    def wrapper(location: Location, *args: Any, **kwargs: Any) -> Any:
        if not is_remote(location):
            return fn(location, *args, **kwargs)
        try:
            return fn(location, *args, **kwargs)
        except LogReadError:
            raise
        except Exception as ex:  # fsspec, botocore and aiohttp raise many types
            why = " ".join(str(ex).split()) or type(ex).__name__
            raise StorageError(
                f"object storage at {str(location)!r} cannot be used: {type(ex).__name__}: "
                f"{why[:300]} (check the bucket, the credentials and AWS_ENDPOINT_URL)"
            ) from None

    return wrapper  # type: ignore[return-value]


Location = str | Path
"""A local path, or a URI of any filesystem fsspec serves."""


def is_remote(location: Location) -> bool:
    """True for a URI other than ``file://`` (``s3://b/x``, ``gs://b/x``, ``memory://x``)."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


_ONE_SLASH = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/(?!/)(.*)", re.DOTALL)


def misspelt_uri(text: str) -> str | None:
    """What ``text`` means when it is a URI of a filesystem fsspec knows written with one slash
    (``s3:/bucket/run``), else None.

    Such a string is a legal local path, so without this check ``--log-dir s3:/bucket/run``
    writes into ``./s3:/bucket/run`` and the bucket never gets the run.
    """
    match = _ONE_SLASH.fullmatch(text)
    if match is None:
        return None
    proto, rest = match.group(1).lower(), match.group(2)
    from fsspec.registry import known_implementations

    if proto not in known_implementations:
        return None
    return f"/{rest}" if proto in ("file", "local") else f"{proto}://{rest}"


def file_stamp(location: Location) -> tuple[int, int] | None:
    """A local file's size and modification time (None for a remote or missing one): what
    tells a log that was rewritten from one left as it was."""
    if is_remote(location):
        return None
    try:
        st = os.stat(_local(location))
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def as_location(location: Location) -> Location:
    """A URI as the string it is, anything else (a path, ``file://``) as a :class:`Path`."""
    if is_remote(location):
        proto, _, rest = str(location).partition("://")
        return f"{proto}://{rest.rstrip('/')}"  # "s3://" stays a URI, never the path "s3:"
    text = str(location)
    if text.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(text).path))
    return Path(text)


def _local(location: Location) -> Path:
    """A location that is not remote as a path (a ``file://`` URI as the path it names)."""
    local = as_location(location)
    assert isinstance(local, Path)
    return local


def join(base: Location, *names: str) -> Location:
    """``base/name/...``: a URI joined with ``/``, a path with pathlib."""
    if is_remote(base):
        return posixpath.join(str(base).rstrip("/"), *names)
    return _local(base).joinpath(*names)


def name_of(location: Location) -> str:
    """The last component (a file's name)."""
    return (
        posixpath.basename(str(location).rstrip("/"))
        if is_remote(location)
        else _local(location).name
    )


def parent_of(location: Location) -> str:
    """The directory holding ``location``, as a string."""
    if is_remote(location):
        return posixpath.dirname(str(location).rstrip("/"))
    return str(_local(location).parent)


def _fs(location: str) -> tuple[Any, str]:
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(location)
    # A listing cached by an earlier call of this process (or by inspect, which shares the
    # cached filesystem instance) would miss logs written since: ask the store.
    fs.invalidate_cache()
    return fs, path


def _protocol(location: str) -> str:
    return location.split("://", 1)[0]


@_remote_errors
def is_dir(location: Location) -> bool:
    """True when the directory (or, in object storage, the prefix) exists and is not a file."""
    if not is_remote(location):
        return _local(location).is_dir()
    fs, path = _fs(str(location))
    return bool(fs.isdir(path))


@_remote_errors
def is_file(location: Location) -> bool:
    """True when ``location`` is an existing file (object)."""
    if not is_remote(location):
        return _local(location).is_file()
    fs, path = _fs(str(location))
    return bool(fs.isfile(path))


@_remote_errors
def list_dir(location: Location) -> list[Location]:
    """The immediate children of a directory (empty when it does not exist)."""
    if not is_remote(location):
        root = _local(location)
        return sorted(root.iterdir()) if root.is_dir() else []
    fs, path = _fs(str(location))
    if not fs.isdir(path):
        return []
    proto = _protocol(str(location))
    return sorted(f"{proto}://{p.rstrip('/')}" for p in fs.ls(path, detail=False))


@_remote_errors
def list_files(location: Location) -> list[Location]:
    """The files directly in a directory (not in its subdirectories), sorted; empty when it
    does not exist."""
    if not is_remote(location):
        root = _local(location)
        return sorted(p for p in root.iterdir() if p.is_file()) if root.is_dir() else []
    fs, path = _fs(str(location))
    if not fs.isdir(path):
        return []
    proto = _protocol(str(location))
    entries = fs.ls(path, detail=True)
    return sorted(f"{proto}://{e['name'].rstrip('/')}" for e in entries if e.get("type") == "file")


@_remote_errors
def find_files(location: Location) -> list[Location]:
    """Every file under a directory, recursively, sorted (empty when it does not exist)."""
    if not is_remote(location):
        root = _local(location)
        return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    fs, path = _fs(str(location))
    proto = _protocol(str(location))
    return sorted(f"{proto}://{p}" for p in fs.find(path))


@_remote_errors
def find_relative(location: Location) -> list[tuple[str, ...]]:
    """Every file under a directory, recursively, as its path's parts below the directory
    (sorted; empty when it does not exist).

    Relative to the directory as the filesystem itself names it: ``./logs``, ``logs/.``,
    ``file:///x`` or ``memory://logs`` come back listed under a spelling of their own, so
    cutting the given string's length off each listed path cut the wrong characters.
    """
    found = find_files(location)
    if not is_remote(location):
        root = _local(location)
        return [Path(p).relative_to(root).parts for p in found]
    _, base = _fs(str(location))
    cut = len(_protocol(str(location))) + len("://")  # find_files' own prefix
    return sorted(tuple(posixpath.relpath(str(p)[cut:], base).split("/")) for p in found)


@_remote_errors
def open_binary(location: Location) -> IO[bytes]:
    """Open a file for reading bytes (seekable: a zip archive can be read in place)."""
    if not is_remote(location):
        return open(_local(location), "rb")
    fs, path = _fs(str(location))
    return fs.open(path, "rb")  # type: ignore[no-any-return]


@_remote_errors
def read_text(location: Location) -> str:
    """A whole UTF-8 text file."""
    if not is_remote(location):
        return _local(location).read_text(encoding="utf-8")
    with open_binary(location) as f:
        return f.read().decode("utf-8")


_FD_NAME = re.compile(r"/dev/(?:stdout|stderr|fd/\d+)|/proc/[^/]+/fd/\d+")
"""Names of a descriptor the process already has open: whatever the shell gave it."""


def is_stream(path: Path | str) -> bool:
    """Whether ``path`` is written into, never renamed over: a device, FIFO or socket, or a
    descriptor's name (``/dev/stdout`` is whatever the shell gave the process: a pipe, a
    terminal, or a file it opened, which a rename would swap for a new one). A regular file
    anywhere, /dev/shm included, is not."""
    if _FD_NAME.fullmatch(os.path.abspath(path)):
        return True
    try:
        mode = os.stat(path).st_mode  # through symlinks
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def replace_local(path: Path | str, write: Callable[[Path], object]) -> Path:
    """Have ``write(tmp)`` write a regular file, then put it at ``path`` whole.

    The file is written beside the target and renamed over it, so a crash or a failed write
    leaves the previous file whole (and no temporary file). A symlink is followed: its
    target is replaced and the link kept, as a shell's ``>`` would. A stream
    (:func:`is_stream`: ``/dev/stdout``, a FIFO, a device) is appended to, never renamed
    over: renaming would replace the device with a file. Returns the path written.
    """
    path = Path(path)
    if is_stream(path):
        import shutil
        import sys
        import tempfile

        with tempfile.TemporaryDirectory(prefix="twice-") as scratch:
            tmp = Path(scratch) / path.name
            write(tmp)
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()  # what was printed before comes first on a shared stream
            with tmp.open("rb") as src, path.open("ab") as dst:
                shutil.copyfileobj(src, dst)
        return path
    real = local_target(path)
    if not path.is_symlink():
        real.parent.mkdir(parents=True, exist_ok=True)
    tmp = real.with_name(f".{real.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, real)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def local_target(path: Path | str) -> Path:
    """The file a write to local ``path`` replaces: ``path``, or what its symlink names.

    A link is written through, never replaced, so it fails as a shell's ``>`` would.

    Raises:
        OSError: ``ELOOP`` for a link in a loop, at ``path`` or above it (``realpath``
            gives up and returns one of its links); ``ENOENT`` for a link whose target's
            directory does not exist, or a dangling link above ``path``: the directories a
            plain path needs are made, but never behind someone's link.
    """
    path = Path(path)
    real = Path(os.path.realpath(path))
    for above in path.parents:  # a broken link on the way: `>` would not make its target
        if not above.is_symlink():
            continue
        try:
            os.stat(above)
        except OSError as ex:
            if ex.errno == errno.ELOOP:
                raise OSError(
                    errno.ELOOP, f"the link {str(above)!r} on its path is in a loop"
                ) from None
            raise FileNotFoundError(
                errno.ENOENT, f"the link {str(above)!r} on its path points nowhere"
            ) from None
    if path.is_symlink():
        if real.is_symlink():
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
        if not real.parent.is_dir():
            raise FileNotFoundError(
                errno.ENOENT, f"the directory {str(real.parent)!r} it links into does not exist"
            )
    return real


@_remote_errors
def write_text(location: Location, text: str) -> None:
    """Write a UTF-8 text file whole, replacing it only once written.

    Locally through :func:`replace_local`; an object store replaces an object only when its
    upload completes.
    """
    if is_remote(location):
        fs, path = _fs(str(location))
        fs.pipe_file(path, text.encode("utf-8"))
        return
    replace_local(_local(location), lambda tmp: tmp.write_text(text, encoding="utf-8"))


@_remote_errors
def make_dirs(location: Location) -> None:
    """Create a local directory and its parents. Object stores have no directories to make,
    but their bucket must exist: found now, not in inspect's first log write.

    Raises:
        StorageError: for a bucket that does not exist or cannot be reached.
    """
    if not is_remote(location):
        _local(location).mkdir(parents=True, exist_ok=True)
        return
    if _protocol(str(location)) in _BUCKETED:
        fs, path = _fs(str(location))
        bucket = path.strip("/").split("/", 1)[0]
        if not bucket:
            raise FileNotFoundError(f"{str(location)!r} names no bucket (s3://BUCKET/PATH)")
        if not fs.exists(bucket):
            raise FileNotFoundError(f"bucket {bucket!r} does not exist")


_BUCKETED = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}
"""Protocols whose first path component is a bucket (container) that must exist."""
