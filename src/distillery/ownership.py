"""What distillery wrote, and may therefore delete: the signed record of a folder it made.

Every folder a command creates for its output carries ``.distillery``: its kind and every file distillery
wrote into it, each with its size and SHA-256, signed (HMAC-SHA256) with a key kept in the cache folder
($DISTILLERY_CACHE/ownership.key, made on first use) over the folder's device and inode. A record written
by hand, edited, or copied into another folder does not count: that folder is not distillery's.
:func:`record` adds what a write put in place; :func:`unrecorded` names the first file a record does not
account for, which stops ``--overwrite`` (see :mod:`distillery.folders`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from distillery.config import cache_root
from distillery.errors import DistilleryError

MARKER = ".distillery"
# The record's signature line: what a reader of the file sees it is.
SIGNATURE = "distillery output folder; distillery may replace it with --overwrite"
# Larger records are not read: a record lists a few hundred files at most.
MARKER_MAX_BYTES = 16 * 2**20
# The key that signs records, in the cache folder: a process without it cannot make a record count.
KEY_FILE = "ownership.key"
# A lock file a killed process left (see folders.lock_file): a name ".<name>.lock" holding a process id at most.
LEFTOVER_LOCK = re.compile(r"\..+\.lock")
LOCK_CONTENT = re.compile(rb"\d*\n?")


def _key_path() -> Path:
    return cache_root() / KEY_FILE


def _key(create: bool) -> bytes | None:
    """The signing key; made (32 random bytes, readable by its owner only) when missing and ``create``."""
    path = _key_path()
    try:
        key = path.read_bytes()
        return key if len(key) >= 32 else None
    except FileNotFoundError:
        if not create:
            return None
    except OSError:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:
            os.link(tmp, path)  # fails when another process made it first: theirs is kept
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        return path.read_bytes()
    except OSError as e:
        raise DistilleryError(f"Could not make the key that signs distillery's folder records at {path} "
                              f"({e.strerror or e}); set DISTILLERY_CACHE to a folder you can write.") from None


def _signature(key: bytes, folder: Path, record: dict) -> str | None:
    """The record's HMAC, bound to the folder's device and inode (a copy elsewhere has others)."""
    try:
        st = os.stat(folder, follow_symlinks=False)
    except OSError:
        return None
    body = json.dumps({k: v for k, v in record.items() if k != "mac"}, sort_keys=True)
    return hmac.new(key, f"{body}\n{st.st_dev}:{st.st_ino}".encode(), hashlib.sha256).hexdigest()


def _read_record(folder: str | os.PathLike) -> dict | None:
    """The valid record of ``folder``, or None: missing, a symbolic link (it could lend a user's folder
    another folder's record), too large, not JSON, or not signed by this cache's key for this folder."""
    folder = Path(folder)
    path = folder / MARKER
    if path.is_symlink() or not path.is_file() or folder.is_symlink():
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(MARKER_MAX_BYTES + 1)
        record = json.loads(raw) if len(raw) <= MARKER_MAX_BYTES else None
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return None
    if (not isinstance(record, dict) or record.get("marker") != SIGNATURE or not isinstance(record.get("kind"), str)
            or not isinstance(record.get("files"), dict) or not isinstance(record.get("mac"), str)):
        return None
    key = _key(create=False)
    expected = _signature(key, folder, record) if key else None
    return record if expected is not None and hmac.compare_digest(expected, record["mac"]) else None


def _write_record(folder: Path, record: dict) -> None:
    record = {k: v for k, v in record.items() if k != "mac"}
    record["mac"] = _signature(_key(create=True), folder, record)
    tmp = folder / f"{MARKER}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, folder / MARKER)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def marker_kind(folder: str | os.PathLike) -> str | None:
    """The kind of folder (run, export, model, report...) distillery's record in ``folder`` holds, or
    None when it has no valid record (see :func:`_read_record`)."""
    record = _read_record(folder)
    return record["kind"] if record is not None else None


def is_ours(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` was made by distillery: it holds a valid record."""
    return _read_record(folder) is not None


def mark(folder: str | os.PathLike, kind: str) -> None:
    """Mark ``folder`` (which must exist) as a distillery ``kind`` folder (run, export, model...) with a
    record of what distillery wrote there: the files already in it (a fresh temporary folder's, or
    nothing) and, from then on, each one :func:`record` is told of."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        made_by = version("distillery")
    except PackageNotFoundError:  # run from a source tree that was not installed
        made_by = None
    folder = Path(folder)
    record = {"marker": SIGNATURE, "kind": kind, "created": time.strftime("%Y-%m-%d %H:%M:%S"), "distillery": made_by,
              "files": dict(_digests(folder, folder))}
    _write_record(folder, record)


def _digest(path: Path) -> list:
    """[size, SHA-256] of a file, or of a symbolic link's target text."""
    if path.is_symlink():
        target = os.fsencode(os.readlink(path))
        return [len(target), "link:" + hashlib.sha256(target).hexdigest()]
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(2**20):
            h.update(chunk)
            size += len(chunk)
    return [size, h.hexdigest()]


def _files(path: Path) -> Iterator[Path]:
    """``path`` if it is a file, else every file and link under it (links not followed)."""
    if path.is_symlink() or not path.is_dir():
        yield path
        return
    for root, dirs, names in os.walk(path):
        for name in sorted(names) + sorted(d for d in dirs if os.path.islink(os.path.join(root, d))):
            yield Path(root) / name


def _digests(path: Path, folder: Path) -> Iterator[tuple[str, list]]:
    """(path relative to ``folder``, [size, SHA-256]) of every file at or below ``path``, records aside:
    each folder's own record changes with every write it records."""
    for file in _files(path):
        if file.name == MARKER or _is_record_temporary(file):
            continue
        yield file.relative_to(folder).as_posix(), _digest(file)


@contextlib.contextmanager
def _record_lock(folder: Path) -> Iterator[None]:
    """The folder's record read, changed and written by one process at a time (a lock on the folder itself)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record(path: str | os.PathLike) -> None:
    """Add the file or folder ``path``, just written by distillery, to the record of each folder above
    it (or itself) that distillery made, replacing what was recorded at that path before."""
    path = Path(path).absolute()
    if not os.path.lexists(path):
        return
    for folder in ([path] if path.is_dir() and not path.is_symlink() else []) + list(path.parents):
        if not (folder / MARKER).is_file():
            continue
        with _record_lock(folder):
            entry = _read_record(folder)
            if entry is None:
                continue
            files = entry["files"]
            if folder != path:
                prefix = path.relative_to(folder).as_posix()
                for name in [n for n in files if n == prefix or n.startswith(prefix + "/")]:
                    del files[name]
            files.update(_digests(path, folder))
            _write_record(folder, entry)


def _is_leftover_lock(path: Path) -> bool:
    if not LEFTOVER_LOCK.fullmatch(path.name) or path.is_symlink() or not path.is_file():
        return False
    with contextlib.suppress(OSError):
        return path.stat().st_size <= 32 and LOCK_CONTENT.fullmatch(path.read_bytes()) is not None
    return False


def _is_record_temporary(path: Path) -> bool:
    """A record half-written by a process killed in :func:`_write_record` (which :func:`_digests` skips too)."""
    return path.name.startswith(MARKER + ".") and path.name.endswith(".tmp")


def unrecorded(folder: str | os.PathLike) -> Path | None:
    """The first file in ``folder`` (a distillery folder) that its record does not list as it is now:
    a file distillery did not write, or one changed since; None when distillery wrote every file there."""
    folder = Path(folder)
    files = (_read_record(folder) or {}).get("files", {})
    for file in _files(folder):
        relative = file.relative_to(folder).as_posix()
        if file.name == MARKER and (relative == MARKER or is_ours(file.parent)):
            continue
        if relative in files and files[relative] == _digest(file):
            continue
        if _is_leftover_lock(file) or _is_record_temporary(file):  # left by a killed process
            continue
        return file
    return None


def check_all_recorded(folder: Path, option: str) -> None:
    stray = unrecorded(folder)
    if stray is not None:
        raise DistilleryError(
            f"{stray} was not written by distillery (or was changed since), so {folder} is not replaced: "
            f"distillery deletes only files it wrote. Move that file out (or delete it yourself), or choose "
            f"another {option}.")
