"""Where distillery may write, and what it may delete: only files it wrote itself.

Every folder a command creates for its output (a run, an export, a saved teacher, a converted or
pre-trained model, a super-net run, a merged report) carries a signed record, ``.distillery``, of every
file distillery wrote into it (:mod:`distillery.ownership`). ``--overwrite`` replaces a folder only when
its record is valid and every file in it is one the record lists, unchanged; a file distillery did not
write (a user's notes, an edited report) stops the command with a sentence naming it. It never replaces
the current directory or one above it, the home folder, a symbolic link, or a folder that is or holds an
input of the same command (the teacher, the data, an init model). ``--resume`` writes only into a folder
with a valid record. Files a command writes (``eval --out``, ``bench --out``, importance scores) follow
the same rules (:func:`check_file_target`): an existing file is replaced only with ``--overwrite``, an
input or a file inside an input folder never. A user's files and folders therefore survive any
combination of ``--out``, ``--overwrite`` and ``--resume``.

Every write into such a folder is recorded (:func:`distillery.ownership.record`): :func:`atomic_folder`,
:func:`atomic_file` and :func:`write_file` record what they put in place; a writer that writes otherwise
(a library's ``save_pretrained``, TensorBoard) records its output once written.

Also here: writing a folder or file atomically; a write refused by the file system (full, read-only)
as one sentence (:func:`writing`); and a lock that keeps a second process out of a run folder or a
cache entry while the first one works in it (:func:`locked`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Mapping

from distillery.config import check_resumed_settings
from distillery.errors import DistilleryError, json_object
from distillery.ownership import (MARKER, SIGNATURE, check_all_recorded, is_ours, mark, marker_kind,  # noqa: F401
                                  record, unrecorded)

# An export folder's manifest (read by the runtime and export, not an ownership sign).
EXPORT_MANIFEST = "distillery_export.json"
# What a run folder holds before its first checkpoint: nothing that a rerun would lose
# (its settings and the identity of its teacher, which a resume checks: see pipeline.prepare_run_folder)
RUN_TEACHER = "teacher_identity.json"
STEP_SETTINGS = "settings.json"  # a step command's settings (autotinybert pretrain, ...): check_step_settings
UNSTARTED = {MARKER, "config.yaml", RUN_TEACHER, STEP_SETTINGS}


def _resolved(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve()


def _is_within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _local_inputs(inputs: Iterable[str | os.PathLike | None]) -> Iterator[tuple[str | os.PathLike, Path]]:
    """The inputs that are local paths, each with its resolved path; a Hub id, None or "" is skipped."""
    for given in inputs:
        if given is not None and str(given) != "" and os.path.exists(Path(given).expanduser()):
            yield given, _resolved(given)


def check_not_input(out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None], option: str = "--out") -> None:
    """Refuse an output folder that is, or holds, one of the command's inputs: replacing it would
    delete the input. (An output inside an input folder is allowed: ``--data-dir .`` with the
    default ``runs/...`` is common.) Inputs that are not local paths (a Hub id, None) are skipped."""
    target = _resolved(out)
    for given, source in _local_inputs(inputs):
        if _is_within(source, target):
            which = "is" if source == target else "holds"
            raise DistilleryError(f"{option} {out} {which} an input of this command ({given}); "
                                  f"choose an output folder outside it.")


def _refuse_home_or_cwd(folder: Path, option: str) -> None:
    target = _resolved(folder)
    if _is_within(Path.cwd().resolve(), target) or target == Path.home().resolve():
        raise DistilleryError(
            f"{option} {folder} is the current directory, one of its parents or the home folder; "
            f"distillery never deletes it. Choose another {option}.")


def _pathconf(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):  # unknown here, or no pathconf (Windows)
        return default


def _check_path(out: Path, option: str) -> None:
    """Refuse an output path the file system cannot hold (a name over NAME_MAX bytes, a path over
    PATH_MAX: checked here, not met as ENAMETOOLONG midway) or that is a symbolic link: distillery
    neither writes nor deletes through a link, whose target may be anything (an input, the run itself)."""
    absolute = Path(os.path.abspath(out))
    anchor = next((p for p in absolute.parents if os.path.isdir(p)), Path(absolute.anchor))
    name_max, path_max = _pathconf(anchor, "PC_NAME_MAX", 255), _pathconf(anchor, "PC_PATH_MAX", 4096)
    if (any(len(os.fsencode(part)) > name_max for part in absolute.parts)
            or len(os.fsencode(str(absolute))) >= path_max):
        raise DistilleryError(f"{option} {out} is too long for this file system (at most {name_max} bytes "
                              f"per name, {path_max} per path); choose a shorter name.")
    _refuse_link(out, option)


def _refuse_link(path: Path, option: str) -> None:
    if path.is_symlink():
        raise DistilleryError(f"{option} {path} is a symbolic link (to {os.readlink(path)}); distillery does not "
                              f"write or replace through a link. Give the path it points to, or another {option}.")


def _not_ours(out: Path, option: str) -> DistilleryError:
    return DistilleryError(
        f"{out} already exists and was not written by distillery (it holds no {MARKER} marker written by distillery); "
        f"distillery neither writes into nor deletes a folder it did not create, --overwrite and --resume "
        f"included. Choose another {option}.")


def remove_ours(folder: str | os.PathLike, option: str = "--out") -> None:
    """Delete ``folder`` if distillery wrote it; anything else is refused with a sentence."""
    folder = Path(folder)
    _refuse_home_or_cwd(folder, option)
    _refuse_link(folder, option)  # rmtree would refuse it with an OSError; a sentence instead
    if not is_ours(folder):
        raise DistilleryError(
            f"{folder} was not written by distillery (it holds no valid {MARKER} record), so it is not "
            f"deleted. Choose another {option}, or empty it yourself.")
    check_all_recorded(folder, option)
    shutil.rmtree(folder)


def check_target(
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    resume: bool = False,
    inputs: Iterable[str | os.PathLike | None] = (),
    option: str = "--out",
    kind: str = "run",
) -> None:
    """Refuse, before any work, an output folder a command must not write: a file, a symbolic link, a
    name too long, an input of the command, a non-empty folder distillery did not write (``resume``
    included), or one it did write without ``overwrite`` or ``resume`` (a run that stopped before
    its first checkpoint excepted: it holds nothing to lose)."""
    out = Path(out).expanduser()
    _check_path(out, option)
    if out.exists() and not out.is_dir():
        raise DistilleryError(f"{option} {out} is a file; give a folder (it is created when missing).")
    check_not_input(out, inputs, option)
    if not out.is_dir():
        return
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return
    if not is_ours(out):
        raise _not_ours(out, option)
    if resume:
        return
    if entries <= UNSTARTED:  # claim removes these files: only when distillery wrote them
        check_all_recorded(out, option)
        return
    if not overwrite:
        raise DistilleryError(f"{out} already exists; pass --overwrite to replace it"
                              + (" or --resume to continue it." if kind == "run" else "."))
    _refuse_home_or_cwd(out, option)
    check_all_recorded(out, option)


def claim(
    out: str | os.PathLike,
    kind: str,
    *,
    overwrite: bool = False,
    resume: bool = False,
    inputs: Iterable[str | os.PathLike | None] = (),
    option: str = "--out",
) -> Path:
    """The output folder, created and marked, ready for a command to write into (see
    :func:`check_target` for what is refused); with ``resume`` an existing folder is kept as it is."""
    check_target(out, overwrite=overwrite, resume=resume, inputs=inputs, option=option, kind=kind)
    out = Path(out).expanduser()
    if out.is_dir() and not resume:
        entries = {p.name for p in out.iterdir()}
        if entries <= UNSTARTED:  # empty, or a run that stopped before training: its files are rewritten
            for name in entries - {MARKER}:
                (out / name).unlink()
        else:
            remove_ours(out, option)
    out.mkdir(parents=True, exist_ok=True)
    if not is_ours(out):
        mark(out, kind)
    return out


def claim_for_rewrite(
    out: str | os.PathLike, kind: str, *, inputs: Iterable[str | os.PathLike | None] = (), option: str = "--out"
) -> Path:
    """The output folder of a command that rewrites its own files in place (a merged report): created
    and marked when missing or empty, reused when distillery made it as a ``kind`` folder. A folder of
    another kind (a run, whose report.md is its own) or one distillery did not write is refused."""
    check_target(out, resume=True, inputs=inputs, option=option, kind=kind)
    out = Path(out).expanduser()
    if out.is_dir() and any(out.iterdir()) and marker_kind(out) != kind:
        raise DistilleryError(f"{out} is a distillery {marker_kind(out) or 'export'} folder, not a {kind} folder; "
                              f"its files are not replaced. Choose another {option}.")
    return claim(out, kind, resume=True, inputs=inputs, option=option)


def check_file_target(
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike | None] = (),
    option: str = "--out",
) -> Path:
    """Refuse, before any work, an output file a command must not write: a folder, a symbolic link, a
    device or pipe, a name too long, a path under a file, an existing file without ``overwrite``, and always (with
    ``overwrite`` too) an input of the command or a file inside an input folder: a file written there
    changes what the input holds (a model's config.json, a data set's dev.tsv). Inputs that are not
    local paths (a Hub id, None) are skipped. Returns the path; write it with :func:`write_file`."""
    out = Path(out).expanduser()
    _check_path(out, option)
    if out.is_dir():
        raise DistilleryError(f"{option} {out} is a folder; give the name of a file to write.")
    target = _resolved(out)
    for given, source in _local_inputs(inputs):
        if _is_within(target, source):
            which = "is" if source == target else "is inside"
            raise DistilleryError(f"{option} {out} {which} an input of this command ({given}); "
                                  f"write it outside the command's inputs.")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise DistilleryError(f"{option} {out} lies under {parent}, which is a file, not a folder.")
    if out.exists() and not out.is_file():  # replacing /dev/null or a pipe with a file is never meant
        raise DistilleryError(f"{option} {out} is not a regular file (a device, a pipe or a socket); give a file name.")
    if out.exists() and not overwrite:
        raise DistilleryError(f"{out} already exists; pass --overwrite to replace it.")
    return out


def write_file(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` all at once (:func:`atomic_file`), creating its folder; the path is
    one :func:`check_file_target` accepted."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w" if isinstance(data, str) else "wb") as f:
        f.write(data)
    return path


def discard_unstarted(out: str | os.PathLike) -> None:
    """After a failure before training: remove what :func:`claim` wrote (marker, config.yaml), and
    the folder when that leaves it empty, so that nothing blocks the corrected rerun."""
    out = Path(out)
    if (not out.is_dir() or not is_ours(out) or not {p.name for p in out.iterdir()} <= UNSTARTED
            or unrecorded(out) is not None):
        return
    for name in UNSTARTED:
        (out / name).unlink(missing_ok=True)
    if _resolved(out) != Path.cwd().resolve():
        out.rmdir()


def check_step_settings(out: str | os.PathLike, settings: Mapping[str, Any], resume: bool,
                        paths: tuple[str, ...] = ("teacher", "corpus")) -> None:
    """A step command's run folder (``autotinybert pretrain``, ``cmow pretrain``) records the settings the run
    started with; its --resume given another value of one is refused (:func:`config.check_resumed_settings`,
    as ``compress --resume`` refuses it) rather than continued with a mix and recorded as the run's. The local
    files and folders under ``paths`` (a name or a list) are compared resolved: the same, given from elsewhere."""
    local = lambda v: str(Path(v).expanduser().resolve()) if Path(v).expanduser().exists() else v  # noqa: E731
    given = {k: ([local(str(x)) for x in v] if isinstance(v, (list, tuple)) else local(str(v))) if k in paths else v
             for k, v in settings.items()}
    given = json.loads(json.dumps(given))  # as the file holds them (lists, not tuples)
    path = Path(out) / STEP_SETTINGS
    if resume and path.is_file():
        saved = json_object(path, "The run's settings file")
        check_resumed_settings(out, saved, given,
                               "Give them as the run started, or start a new run (another --out) to change them.")
        return
    with writing(path, "the run's settings"), atomic_file(path, "w") as f:  # a fresh run (or one older than this file)
        f.write(json.dumps(given, indent=2))


# ------------------------------------------------------------------------------------------------
# Writing a folder or a file all at once: into a temporary sibling, then renamed into place, so that a
# reader (another process, a resumed run) never sees one half-written. Every such write goes through here.


def _stem(name: str) -> str:
    """The start of ``name`` in a temporary name beside it: a name as long as the file system allows
    must leave room for the temporary one's extra characters."""
    return name[:40]


def temporary_sibling(final: str | os.PathLike) -> Path:
    """A new, empty folder beside ``final`` to write into before :func:`replace_with` (a fresh
    name each time: a fixed one such as ``<name>.tmp`` could be a user's folder)."""
    final = Path(final).expanduser()
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{_stem(final.name)}.", suffix=".tmp", dir=final.parent))


def shared_sibling(final: str | os.PathLike) -> Path:
    """``<name>.tmp`` beside ``final``: a temporary folder every process of a launch can name, for a
    folder they write together (each its own files), and that the next write finds and clears after
    a killed one. Independent writers of the same ``final`` must use :func:`temporary_sibling`."""
    final = Path(final)
    return final.with_name(final.name + ".tmp")


def previous_version(final: str | os.PathLike) -> Path:
    """``<name>.old``: where ``atomic_folder(..., existing="old")`` keeps the folder it replaces."""
    final = Path(final)
    return final.with_name(final.name + ".old")


def replace_with(tmp: str | os.PathLike, final: str | os.PathLike, option: str = "--out") -> None:
    """Move the finished folder ``tmp`` to ``final``, replacing ``final`` only if distillery wrote it."""
    _put_in_place(Path(tmp), Path(final), "ours", durable=False, option=option)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # directories cannot be opened on some platforms (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


EXISTING = ("ours", "any", "old")


def _put_in_place(tmp: Path, final: Path, existing: str, *, durable: bool, option: str) -> None:
    if durable:
        fsync_dir(tmp)
    # A folder cannot replace a non-empty one in a single rename: with "old", the previous version
    # waits as <name>.old, where a reader looks when a crash came between the two renames.
    old = previous_version(final) if existing == "old" else None
    if existing == "ours" and final.exists():
        if final.is_dir() and not any(final.iterdir()):
            final.rmdir()
        else:
            remove_ours(final, option)
    elif existing == "any":
        shutil.rmtree(final, ignore_errors=True)
    elif old is not None and final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    if durable:
        fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    record(final)


@contextlib.contextmanager
def atomic_folder(
    final: str | os.PathLike,
    *,
    existing: str = "ours",
    tmp: str | os.PathLike | None = None,
    durable: bool = False,
    option: str = "--out",
) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``final``; when the block succeeds, rename it to ``final``.

    ``existing`` says what becomes of a ``final`` already there: ``"ours"``, replaced only if
    distillery wrote it (:func:`remove_ours`; an empty folder too); ``"any"``, replaced whatever it
    holds (an entry of a cache distillery alone writes); ``"old"``, kept as ``<name>.old`` until the
    new one is in place, so that a reader falling back to ``<name>.old`` always finds a complete one.

    ``tmp`` is by default a fresh sibling (:func:`temporary_sibling`), removed when the block fails,
    so two writers never share one. A given ``tmp`` (:func:`shared_sibling`) is emptied first and
    left as it is after a failure: other processes may still be writing into it.

    ``durable`` fsyncs the folder before the rename and its parent after, so that the rename cannot
    reach the disk before the contents; the files written inside must be fsynced by their writer
    (:func:`fsync_file`).
    """
    if existing not in EXISTING:
        raise ValueError(f"existing must be one of {', '.join(EXISTING)}, got {existing!r}.")
    final = Path(final).expanduser()
    fresh = tmp is None
    if fresh:
        tmp = temporary_sibling(final)
    else:
        tmp = Path(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    try:
        yield tmp
        _put_in_place(tmp, final, existing, durable=durable, option=option)
    except BaseException:
        if fresh:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Yield a file open for writing (``mode`` "w" or "wb") that replaces ``path`` when the block
    succeeds and is removed when it fails. Its temporary name is this writer's own (process id and a
    random part): processes on several nodes may fill the same cache entry at once."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}.")
    path = Path(path)
    tmp = path.with_name(f".{_stem(path.name)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, mode.replace("w", "x")) as f:
            yield f
        os.replace(tmp, path)
        record(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------------------
# A full disk or a read-only folder while writing: the one place these become a sentence.

# What a write fails with when the disk or the folder refuses it (not a bug, not a bad input).
WRITE_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT)


def _refused_write(e: BaseException) -> str | None:
    """The reason (strerror) when ``e`` is a write refused by the file system, else None."""
    if isinstance(e, OSError):
        return (e.strerror or os.strerror(e.errno)) if e.errno in WRITE_ERRNOS else None
    text = str(e)
    for code in WRITE_ERRNOS:  # safetensors (Rust) reports "... (os error 28)"
        if f"os error {code}" in text or os.strerror(code) in text:
            return os.strerror(code)
    if isinstance(e, RuntimeError) and ("PytorchStreamWriter" in text or "inline_container" in text):
        return "the write failed"  # torch.save's zip writer, which names no errno
    return None


def _write_errors() -> tuple[type[BaseException], ...]:
    import safetensors  # imported when a write failed: not on distillery's import path

    return OSError, RuntimeError, safetensors.SafetensorError


class WriteRefused(DistilleryError):
    """A write refused by the file system (full, read-only, not permitted), as a sentence."""


@contextlib.contextmanager
def writing(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Turn a write that the file system refuses inside the block into one sentence naming ``path``,
    ``what`` was being written and how to go on. Anything else passes unchanged. The
    writers inside are atomic (:func:`atomic_folder`, :func:`atomic_file`): nothing half-written
    is left that a rerun or ``--resume`` would read."""
    try:
        yield
    except _write_errors() as e:
        reason = _refused_write(e)
        if reason is None:
            raise
        raise WriteRefused(f"Could not write {what} to {path} ({reason[:1].lower() + reason[1:]}): "
                           "free space (or fix permissions), then rerun the command (with --resume to "
                           "continue a run).") from None


# ------------------------------------------------------------------------------------------------
# One process at a time: a run folder, a cache entry being filled. An advisory lock (flock) on a
# file beside the locked path; the kernel releases it when its process ends, however it ends, so
# a run killed with kill -9 never blocks its own --resume.


class InUse(DistilleryError):
    """Another process holds the lock (raised by :func:`locked` when told not to wait)."""


def lock_file(path: str | os.PathLike) -> Path:
    """``.<name>.lock`` beside ``path``: not inside it, since the folder may not exist yet or may be
    replaced (``--overwrite``) while locked."""
    path = _resolved(path)
    name = path.name or "root"
    if len(os.fsencode(name)) > 200:  # a name as long as the file system allows leaves no room for ".lock"
        name = f"{_stem(name)}-{hashlib.sha256(os.fsencode(name)).hexdigest()[:16]}"
    return path.with_name(f".{name}.lock")


def _holder(fd: int) -> str:
    """The process id the lock's holder wrote into the lock file, as "pid N", or ""."""
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f"pid {pid}" if pid.isdigit() else ""


def _open_locked(target: Path, wait: bool, on_wait: Callable[[str], None] | None, path) -> int:
    """An open descriptor of ``target`` (the lock file of ``path``) holding its exclusive lock, once
    no other process holds it."""
    import fcntl

    while True:
        fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    holder = _holder(fd)
                    raise InUse(f"{path} is in use by another distillery process"
                                f"{f' ({holder})' if holder else ''}; wait for it to end, or choose another "
                                f"folder.") from None
                if on_wait is not None:
                    on_wait(_holder(fd))
                    on_wait = None  # said once
                fcntl.flock(fd, fcntl.LOCK_EX)
            # The holder before us may have removed the file on release (see locked): a lock on a
            # file no longer at ``target`` excludes no one, so take the current one instead.
            if os.path.exists(target) and os.path.samestat(os.fstat(fd), os.stat(target)):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


@contextlib.contextmanager
def locked(path: str | os.PathLike, *, wait: bool = True,
           on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the exclusive lock of ``path`` (a folder or file, existing or not) for the block.

    Another process holding it makes this wait (``on_wait(holder)`` is called once first, holder
    being "pid N" or ""), or with ``wait=False`` raise :class:`InUse`, a sentence naming the holder.
    Without ``fcntl`` (Windows) the block runs unlocked."""
    try:
        import fcntl  # noqa: F401
    except ImportError:
        yield
        return
    target = lock_file(path)
    try:
        with writing(target, "a lock file"):
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = _open_locked(target, wait, on_wait, path)
    except WriteRefused:
        if os.access(target.parent, os.W_OK) or not target.parent.is_dir():
            raise
        fd = None  # a folder this process cannot write: a lock would guard nothing it can do there
    if fd is None:
        # what it reads there was renamed into place whole; what it tries to write fails with a sentence
        yield
        return
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        # removed while still locked, so that a waiter finds it gone and retries (_open_locked)
        with contextlib.suppress(OSError):
            os.unlink(target)
        os.close(fd)
