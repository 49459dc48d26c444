"""A hostile machine (issue 31): caches changed or damaged under distillery's feet, two processes on
one cache or one run folder, a full disk or a read-only folder, SIGTERM.

The two-process tests start real processes (tests/_hostile_driver.py slows the teacher's
fine-tuning so that the second process arrives while the first one holds its locks); the others
run in this process with a patched writer."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from distillery.data.tasks import get_task
from tests.helpers import NO_EXTRAS, assert_one_line_error, make_tiny_bert, run_cli, write_glue

HERE = Path(__file__).parent
TINY = ["--max-length", "16", "--train-limit", "16"]
COMPRESS_TINY = [*TINY, "--epochs", "1", "--teacher-epochs", "1", "--batch-size", "8", "--latency-runs", "1",
                 *NO_EXTRAS]


@pytest.fixture
def teacher(tmp_path):
    """A teacher folder of this test's own (tests change it in place)."""
    return Path(make_tiny_bert(tmp_path / "teacher"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("data"), n_train=16, n_dev=8)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("DISTILLERY_CACHE", str(folder))
    return folder


def finetuned(teacher, data, **train):
    """get_finetuned_teacher on SST-2 with a one-step budget: (model, info)."""
    from distillery.config import DataConfig, TeacherConfig, TrainConfig
    from distillery.teacher import get_finetuned_teacher

    config = TeacherConfig(name=str(teacher), train=TrainConfig(epochs=1, batch_size=8, lr=1e-3, **train))
    model, _, info = get_finetuned_teacher(config, get_task("sst2"), DataConfig(task="sst2", data_dir=str(data),
                                                                              max_length=16))
    return model, info


def run_ok(monkeypatch, capsys, *args) -> tuple[str, str]:
    """``distillery ARGS`` in this process, which must succeed: (stdout, stderr)."""
    from distillery import cli

    monkeypatch.setattr(sys, "argv", ["distillery", *args])
    try:
        cli.main()
    except SystemExit as e:
        assert e.code in (0, None), capsys.readouterr().err[-3000:]
    captured = capsys.readouterr()
    return captured.out, captured.err


def entries(cache: Path) -> list[Path]:
    return sorted((cache / "teachers").iterdir())


# -- the teacher cache follows the teacher's content ---------------------------------------------


def test_teacher_changed_in_place_is_fine_tuned_again(teacher, data, cache):
    first, info = finetuned(teacher, data)
    assert not info["cached"]
    assert finetuned(teacher, data)[1]["cached"]
    make_tiny_bert(teacher, seed=1)  # new weights, same size, same path
    second, info = finetuned(teacher, data)
    assert not info["cached"], "a teacher updated in place must not be answered from the cache"
    assert not torch.equal(first.bert.embeddings.word_embeddings.weight, second.bert.embeddings.word_embeddings.weight)
    assert len(entries(cache)) == 2


def test_teacher_key_changes_with_its_weights_and_tokenizer_not_its_path(teacher, tmp_path):
    import shutil

    from distillery.teacher import teacher_identity

    copy = tmp_path / "copy"
    shutil.copytree(teacher, copy)
    assert teacher_identity(str(teacher)) == teacher_identity(str(copy))
    weights = copy / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF  # one byte of tensor data: same size, and the memo sees a new mtime
    weights.write_bytes(bytes(raw))
    assert teacher_identity(str(teacher)) != teacher_identity(str(copy))
    shutil.copy(teacher / "model.safetensors", weights)
    assert teacher_identity(str(teacher)) == teacher_identity(str(copy))
    (copy / "vocab.txt").write_text((teacher / "vocab.txt").read_text() + "extra\n")
    assert teacher_identity(str(teacher)) != teacher_identity(str(copy))
    weights.unlink()  # destroyed weights: another teacher, never the cached one
    assert "model.safetensors" not in teacher_identity(str(copy))["files"]


def test_hub_teacher_is_keyed_on_its_snapshot(monkeypatch, tmp_path):
    import transformers.utils

    from distillery.teacher import teacher_identity

    snapshot = tmp_path / "models--org--name" / "snapshots" / "0123abcd"
    monkeypatch.setattr(transformers.utils, "cached_file", lambda repo, name: str(snapshot / name))
    assert teacher_identity("org/name") == {"hub": "org/name", "revision": "0123abcd"}


# -- damaged cache entries are named, deleted and rebuilt ---------------------------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = {
    "truncated-weights": lambda e: _truncate(e / "model" / "model.safetensors"),
    "missing-weights": lambda e: (e / "model" / "model.safetensors").unlink(),
    "garbled-config": lambda e: (e / "model" / "config.json").write_text("{not json"),
    "garbled-teacher-json": lambda e: (e / "teacher.json").write_text("[1, 2"),
    "teacher-json-without-metrics": lambda e: (e / "teacher.json").write_text("{}"),
    "missing-tokenizer": lambda e: [p.unlink() for p in (e / "model").glob("*") if p.name.startswith(("vocab", "tokenizer"))],
    "missing-teacher-json": lambda e: (e / "teacher.json").unlink(),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_teacher_cache_entry_is_rebuilt(damage, tiny_bert, data, cache, caplog):
    original, _ = finetuned(tiny_bert, data)
    (entry,) = entries(cache)
    DAMAGES[damage](entry)
    with caplog.at_level(logging.WARNING, logger="distillery"):
        rebuilt, info = finetuned(tiny_bert, data)
    assert not info["cached"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(entry) in w and "damaged" in w for w in warnings), warnings
    for name, tensor in original.state_dict().items():  # fine-tuned again, the same under its seed
        torch.testing.assert_close(tensor, rebuilt.state_dict()[name], rtol=0, atol=0)
    assert finetuned(tiny_bert, data)[1]["cached"]


class _Exploit:
    """Unpickling this would create a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


LOGITS = {
    "truncated": lambda p: _truncate(p),
    "object-array": lambda p: np.save(p, np.array([_Exploit(p.with_suffix(".pwned"))], dtype=object), allow_pickle=True),
    "other-rows": lambda p: np.save(p, np.zeros((3, 2), dtype=np.float32)),
    "not-npy": lambda p: p.write_bytes(b"garbage" * 20),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("damage", list(LOGITS))
def test_damaged_logits_cache_entry_is_rebuilt_never_unpickled(damage, tmp_path, caplog):
    from distillery.method_context import read_logits_cache

    path = tmp_path / "sst2-0123.npy"
    np.save(path, np.ones((4, 2), dtype=np.float32))
    assert read_logits_cache(path, 4).shape == (4, 2)
    LOGITS[damage](path)
    with caplog.at_level(logging.WARNING, logger="distillery"):
        assert read_logits_cache(path, 4) is None
    assert any(str(path) in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert not path.exists(), "a damaged entry is deleted, to be computed again"
    assert not path.with_suffix(".pwned").exists(), "a cache entry is never unpickled"


# -- a full disk, a read-only folder -------------------------------------------------------------


def _refusing(real, when, code=errno.ENOSPC):
    """``real`` that, once ``when(path)`` holds, writes half of nothing and raises OSError(code)."""

    def write(obj, path, *args, **kwargs):
        if when(Path(path)):
            Path(path).write_bytes(b"half")  # what a full disk leaves: the start of a file
            raise OSError(code, os.strerror(code), str(path))
        return real(obj, path, *args, **kwargs)

    return write


def compress_args(teacher, data, out, *more):
    return ["compress", "--teacher", str(teacher), "--data-dir", str(data), "--out", str(out), *COMPRESS_TINY, *more]


def test_full_disk_under_out_is_a_sentence_and_resume_finishes(monkeypatch, capsys, tiny_bert, data, cache, tmp_path):
    import distillery.training.checkpoint as checkpoint

    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        # the student's checkpoints fail (the teacher's, in the cache, are written)
        patched.setattr(checkpoint, "_torch_save", _refusing(checkpoint._torch_save, lambda p: out in p.parents))
        code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, data, out))
    assert_one_line_error(code, err, f"Could not write a checkpoint to {out / 'checkpoints' / 'last'} (no space left")
    assert "free space (or fix permissions), then rerun" in err and "--resume" in err
    assert (out / "config.yaml").is_file(), "the run folder stays, for --resume"
    run_ok(monkeypatch, capsys, "compress", "--out", str(out), "--resume")
    assert (out / "report.md").is_file() and not (out / "checkpoints").exists()


def test_full_disk_in_the_teacher_cache_is_a_sentence_and_a_rerun_finishes(monkeypatch, capsys, tiny_bert, data, cache):
    import transformers

    real = transformers.PreTrainedModel.save_pretrained

    def save_pretrained(self, folder, *args, **kwargs):
        if cache in Path(folder).parents:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "model.safetensors").write_bytes(b"half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, folder, *args, **kwargs)

    args = ["teacher", "--teacher", str(tiny_bert), "--data-dir", str(data), "--epochs", "1", *TINY]
    with monkeypatch.context() as patched:
        patched.setattr(transformers.PreTrainedModel, "save_pretrained", save_pretrained)
        code, _, err = run_cli(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, "Could not write the fine-tuned teacher to")
    assert str(cache / "teachers") in err and "free space" in err
    assert not [e for e in entries(cache) if not e.name.startswith(".") and "." not in e.name], "no half entry"
    out, _ = run_ok(monkeypatch, capsys, *args)
    assert json.loads(out)["cached"] is False  # fine-tuned (resumed from its checkpoint), then cached
    out, _ = run_ok(monkeypatch, capsys, *args)
    assert json.loads(out)["cached"] is True


def test_full_logits_cache_is_a_sentence_and_leaves_no_entry(monkeypatch, capsys, tiny_bert, data, cache, tmp_path):
    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(np, "save", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))))
        code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, data, out))
    assert_one_line_error(code, err, "Could not write the teacher's logits (a cache entry) to")
    assert list((cache / "logits").iterdir()) == [], "the atomic writer removed its temporary file"
    run_ok(monkeypatch, capsys, "compress", "--out", str(out), "--resume")
    assert len(list((cache / "logits").glob("*.npy"))) == 1


def test_read_only_out_is_a_sentence(monkeypatch, capsys, tiny_bert, data, cache, tmp_path):
    import distillery.folders as folders

    out = tmp_path / "run"

    def read_only(folder, kind):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(Path(folder) / folders.MARKER))

    monkeypatch.setattr(folders, "mark", read_only)
    code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, data, out))
    assert_one_line_error(code, err, f"Could not write the run folder to {out} (read-only file system)")
    assert "fix permissions" in err


def test_other_os_errors_keep_their_traceback(tmp_path):
    from distillery.folders import WriteRefused, writing

    with pytest.raises(FileNotFoundError):
        with writing(tmp_path, "a test file"):
            open(tmp_path / "missing" / "file", "rb")
    with pytest.raises(WriteRefused, match="no space left"):
        with writing(tmp_path, "a test file"):
            import safetensors

            raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    with pytest.raises(WriteRefused):
        with writing(tmp_path, "a test file"):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    with pytest.raises(RuntimeError, match="a bug"):
        with writing(tmp_path, "a test file"):
            raise RuntimeError("a bug")


# -- two processes ---------------------------------------------------------------------------------


def start(args, tmp_path, name, cache, go="-", step_delay=0.0) -> tuple[subprocess.Popen, Path]:
    """``distillery ARGS`` through the driver, in the background, its fine-tuning waiting for the
    file ``go`` (see _hostile_driver.py); its stderr goes to a file."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "DISTILLERY_CACHE": str(cache),
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
               filter(None, [str(HERE.parent / "src"), str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    log = tmp_path / f"{name}.err"
    with open(log, "w") as err, open(tmp_path / f"{name}.out", "w") as out:
        proc = subprocess.Popen([sys.executable, str(HERE / "_hostile_driver.py"), str(go), str(step_delay), *args],
                                cwd=tmp_path, env=env, stdout=out, stderr=err)
    return proc, log


def wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"ended ({proc.returncode}) before {text!r}: {log.read_text()[-3000:]}"
        assert time.time() < deadline, f"no {text!r} within {timeout} s"
        time.sleep(0.1)


def finish(proc: subprocess.Popen, log: Path, timeout: float = 180) -> str:
    proc.wait(timeout=timeout)
    return log.read_text()


def test_two_processes_on_one_cache_fine_tune_the_teacher_once(tmp_path, tiny_bert, data):
    cache = tmp_path / "cache"
    args = ["teacher", "--teacher", str(tiny_bert), "--data-dir", str(data), "--epochs", "1", *TINY]
    go = tmp_path / "go"
    first, first_log = start(args, tmp_path, "first", cache, go=go)
    try:
        wait_for(first_log, "FINE-TUNING", first)  # it holds the entry's lock
        second, second_log = start(args, tmp_path, "second", cache)
        wait_for(second_log, "Waiting for another distillery process", second)
        go.touch()  # the first one fine-tunes now, while the second waits
        second_err = finish(second, second_log)
        first_err = finish(first, first_log)
    finally:
        first.kill()
    assert first.returncode == 0, first_err[-3000:]
    assert second.returncode == 0, second_err[-3000:]
    assert "Fine-tuning teacher" in first_err
    assert f"Waiting for another distillery process (pid {first.pid})" in second_err, second_err[-3000:]
    assert "Reusing the fine-tuned teacher" in second_err and "Fine-tuning teacher" not in second_err
    assert json.loads((tmp_path / "second.out").read_text())["cached"] is True
    assert [e.name for e in entries(cache)] == [json.loads((tmp_path / "first.out").read_text())["path"].split("/")[-2]]


def test_two_runs_on_one_out_the_second_is_refused_and_kill_9_frees_it(tmp_path, tiny_bert, data, monkeypatch, capsys):
    cache = tmp_path / "cache"
    out = tmp_path / "run"
    first, first_log = start(compress_args(tiny_bert, data, out), tmp_path, "first", cache, go=tmp_path / "never")
    try:
        wait_for(first_log, "FINE-TUNING", first)  # the run folder is claimed and locked
        # another run with --overwrite, and a --resume of the live run, at once
        second, second_log = start(compress_args(tiny_bert, data, out, "--overwrite"), tmp_path, "second", cache)
        resumed, resumed_log = start(["compress", "--out", str(out), "--resume"], tmp_path, "resumed", cache)
        second_err = finish(second, second_log)
        assert_one_line_error(second.returncode, second_err, f"{out} is in use by another distillery process (pid {first.pid})")
        assert_one_line_error(resumed.wait(timeout=120), resumed_log.read_text(), "is in use")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert (out / "config.yaml").is_file(), "the refused runs left the first one's folder alone"
    monkeypatch.setenv("DISTILLERY_CACHE", str(cache))
    run_ok(monkeypatch, capsys, "compress", "--out", str(out), "--resume")  # the lock died with its process
    assert (out / "report.md").is_file()


def test_sigterm_says_where_to_resume_and_resume_is_exact(tmp_path, tiny_bert, data, monkeypatch, capsys):
    """SIGTERM mid-way through the teacher's fine-tuning (after its first checkpoint): a sentence,
    exit 143, and the resumed teacher equals one trained without a stop."""
    cache = tmp_path / "cache"
    args = ["teacher", "--teacher", str(tiny_bert), "--data-dir", str(data), "--epochs", "3", "--lr", "1e-3", *TINY]
    proc, log = start(args, tmp_path, "killed", cache, step_delay=0.5)
    try:
        wait_for(log, "CHECKPOINTED", proc)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        err = finish(proc, log, timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert "Traceback" not in err
    # `teacher` has no --resume (issue 52): run again, its fine-tuning continues from the cache entry's checkpoint
    assert err.strip().splitlines()[-1] == ("distillery: terminated (SIGTERM). Run the command again (a teacher's "
                                            "fine-tuning continues from its last checkpoint).")
    monkeypatch.setenv("DISTILLERY_CACHE", str(cache))
    out, err = run_ok(monkeypatch, capsys, *args)
    assert "teacher: resumed from" in err
    resumed = load_file(str(Path(json.loads(out)["path"]) / "model.safetensors"))
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "other-cache"))
    out, _ = run_ok(monkeypatch, capsys, *args)
    whole = load_file(str(Path(json.loads(out)["path"]) / "model.safetensors"))
    assert whole.keys() == resumed.keys()
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name


def test_lock_refuses_a_second_holder_and_leaves_no_file(tmp_path):
    from distillery.folders import InUse, lock_file, locked

    folder = tmp_path / "run"
    with locked(folder):
        assert lock_file(folder).read_text().strip() == str(os.getpid())
        with pytest.raises(InUse, match=rf"{folder} is in use by another distillery process \(pid {os.getpid()}\)"):
            with locked(folder, wait=False):
                pass
    assert not lock_file(folder).exists()
    lock_file(folder).write_text("12345\n")  # left by a process killed with kill -9: its lock died with it
    with locked(folder, wait=False):
        pass
