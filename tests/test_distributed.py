"""`accelerate launch --num_processes 2 -m distillery.cli compress`: one run folder, one teacher cache
entry, written once, and the same teacher and student as one process trains (CPU, gloo).

Both runs fine-tune their own teacher (separate caches), so the teacher's DDP training is compared
too; the teacher is dropout-free, so that training depends on the data alone."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers import NO_EXTRAS, make_tiny_bert, write_glue

HERE = Path(__file__).parent
TINY_FLAGS = ["--max-length", "32", "--epochs", "2", "--lr", "1e-3", "--batch-size", "16",
              "--teacher-epochs", "2", "--latency-runs", "3", "--train-limit", "96", *NO_EXTRAS]
METHOD_FLAGS = {
    "distill": [],
    # 4 experts of 9 of the tiny FFN's 37 neurons, 3 shared: importance and the refit both run sharded
    "moebert": ["--experts", "4", "--expert-size", "9", "--shared", "3", "--lr", "5e-3"],
    # the one-shot super-net trained as DDP (samples=2: the sandwich's largest and smallest, the same
    # on every process; random draws depend on the rank), then a given sub-network further trained
    "autotinybert": ["--option", "supernet_steps=4", "--option", "samples=2", "--option", "latency_runs=1",
                     "--option", "arch=2,32,32,4,32"],
    # CMOW's own dropout off, as the teacher's (processes draw other masks than one process)
    "cmow": ["--option", "matrix_dim=4", "--option", "vector_dim=16", "--option", "dropout=0", "--option", "head_dropout=0"],
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch")
    return make_tiny_bert(root / "teacher", num_layers=4, dropout=0.0), write_glue(root / "data")


def run_cli(args, cwd, cache, processes: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "DISTILLERY_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1"}
    launcher = [sys.executable]
    if processes > 1:  # accelerate runs CPU processes through torch.distributed.run when asked for "multi_gpu"
        launcher += ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
                     "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                     "--main_process_port", "0"]
    cmd = launcher + ["-m", "distillery.cli", "compress", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a: dict, b: dict, atol: float, mean_atol: float | None = None) -> None:
    """Every element within ``atol``, and their mean difference within ``mean_atol``.

    Why two bounds: DDP averages the two halves' gradients where one process sums the batch, so the
    gradients differ in their last bits, and Adam turns a near-zero gradient's last bits into a step
    of up to ±lr (the SST-2 student's unused token-type row, some LayerNorm gains: up to 6e-4 at lr
    1e-3, once in a run). A real fault (a process training on other examples, gradients not
    averaged) moves most weights by about lr per step, far above the mean bound."""
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, f"largest difference {worst:.2e}"
    if mean_atol is not None:
        mean = sum((a[k] - b[k]).abs().sum().item() for k in a) / sum(v.numel() for v in a.values())
        assert mean <= mean_atol, f"mean difference {mean:.2e}"


# Three processes a method (one, and two under the launcher): the default suite runs distill, the shared
# trainer's path; the methods' own sharded parts (moebert's importance, the super-net, CMOW) run in `make test-slow`.
@pytest.mark.parametrize("method", [m if m == "distill" else pytest.param(m, marks=pytest.mark.slow)
                                    for m in METHOD_FLAGS])
def test_compress_on_two_processes_equals_one(setup, tmp_path, method):
    teacher, data = setup
    args = ["--method", method, "--teacher", str(teacher), "--data-dir", str(data), *TINY_FLAGS, *METHOD_FLAGS[method]]
    one = run_cli(args + ["--out", "one"], tmp_path, tmp_path / "cache1", 1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_cli(args + ["--out", "two"], tmp_path, tmp_path / "cache2", 2)
    assert two.returncode == 0, two.stderr[-3000:]

    # one process wrote, once: one report printed, each stage logged once, one folder, one cache entry
    assert two.stdout.count("Run folder: two") == 1
    assert two.stderr.count("[4/5] Benchmarking") == 1 and two.stderr.count("Fine-tuning teacher") == 1
    assert "on 2 process(es)" in two.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache1", "cache2", "one", "two"]
    assert {p.name for p in (tmp_path / "two").iterdir()} == {p.name for p in (tmp_path / "one").iterdir()}
    assert len(list((tmp_path / "cache2" / "teachers").iterdir())) == 1

    # the same teacher and student as one process trains with the same global batch
    (t1,), (t2,) = ((tmp_path / c / "teachers").iterdir() for c in ("cache1", "cache2"))
    assert_same_weights(weights(t1 / "model"), weights(t2 / "model"), atol=1e-4)
    s1, s2 = weights(tmp_path / "one" / "student"), weights(tmp_path / "two" / "student")
    assert_same_weights(s1, s2, atol=1e-3, mean_atol=1e-5)  # 1e-3: the student's lr, one Adam step
    m1, m2 = (json.loads((tmp_path / r / "metrics.json").read_text()) for r in ("one", "two"))
    assert m1["student"] == pytest.approx(m2["student"], abs=1e-6)
    if method == "autotinybert":  # the one-shot super-net: gradients synced through DDP's forward
        assert_same_weights(weights(tmp_path / "one" / "supernet"), weights(tmp_path / "two" / "supernet"), atol=1e-4)
    if method == "moebert":  # the sharded importance pass adds up to the one-process scores
        i1, i2 = (load_file(str(tmp_path / r / "importance.safetensors"))["importance"] for r in ("one", "two"))
        assert_same_weights({"i": i1}, {"i": i2}, atol=1e-5 * float(i1.abs().max()))
    # and training moved a student that starts from the teacher's weights well beyond that tolerance
    # (the comparison means something); a CMOW student starts from a random init, with no shared names
    start = weights(t1 / "model")
    shared = [k for k in s1 if k in start and s1[k].shape == start[k].shape]
    if method != "cmow":
        assert max((s1[k] - start[k]).abs().max().item() for k in shared) > 1e-3
