"""distillery.bench across settings: CPU thread counts, CUDA precisions, the refusals, the CUDA event
timing (with fake events where no GPU is lent), the report's speed-by-setting table, and the `bench` and
`compress` flags. Tests check what is measured and recorded, never how fast anything is."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from torch import nn
from transformers import BertForSequenceClassification, BertModel

import distillery.bench as bench_module
from distillery.bench import bench_flags, benchmark, format_sweep, measured_settings, setting_label, sweep_of
from distillery.errors import DistilleryError
from distillery.live_baselines import StaticEmbeddingConfig, StaticEmbeddingModel
from distillery.report import speed_by_setting, write_report
from distillery.run_record import read_bench
from distillery.runtime import quantize_torch
from tests.helpers import assert_one_line_error, make_run, run_cli, run_ok, tiny_bert_config

FAST = dict(latency_shape=(1, 8), throughput_shape=(2, 8), latency_runs=2, warmup=1, throughput_runs=1)


@pytest.fixture(scope="module")
def teacher():
    torch.manual_seed(0)
    return BertForSequenceClassification(tiny_bert_config(num_hidden_layers=2, num_labels=2)).eval()


@pytest.fixture(scope="module")
def student():
    torch.manual_seed(1)
    return BertModel(tiny_bert_config(num_hidden_layers=1)).eval()


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


class FakeEvent:
    """A stand-in for torch.cuda.Event: stamps the wall clock when recorded, so that the event logic runs
    on a machine without a GPU; ``log`` keeps the calls in order."""

    log: list[str] = []

    def __init__(self, enable_timing=False):
        assert enable_timing  # an event made without timing cannot be read
        self.stamp = None
        self.synced = False

    def record(self):
        self.stamp = bench_module.time.perf_counter()
        FakeEvent.log.append("record")

    def synchronize(self):
        self.synced = True
        FakeEvent.log.append("synchronize")

    def elapsed_time(self, end):
        assert end.synced, "an end event is read only after it completed"
        return (end.stamp - self.stamp) * 1000.0


@pytest.fixture
def fake_gpu(monkeypatch):
    """CUDA as far as bench sees it: a GPU named, fake events, and 'moving' a model only casts it (it stays
    on the CPU). Returns the list of (device, dtype) each model was placed at."""
    placed = []

    def place(model, device, dtype):
        placed.append((device.type, dtype))
        return model if device.type == "cpu" and dtype == torch.float32 else copy.deepcopy(model).to(dtype=dtype)

    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU 80GB")
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: FakeEvent.log.append("device sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench_module, "_placed", place)
    return placed


# ------------------------------------------------------------------------------------ settings


def test_default_settings_follow_the_machine(monkeypatch):
    import distillery.bench.settings

    monkeypatch.setattr(distillery.bench.settings, "usable_cpus", lambda: 8)  # 4 threads are refused on fewer CPUs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert measured_settings() == [{"device": "cpu", "dtype": "fp32", "threads": None}]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert measured_settings() == [{"device": "cpu", "dtype": "fp32", "threads": None},
                                   {"device": "cuda", "dtype": "fp32", "threads": None}]
    # the CPU is timed in fp32 whatever --dtype says; one CUDA record per precision, in the order given
    assert measured_settings("cuda,cpu", "fp16,bf16", [1, 4, 1]) == [
        {"device": "cuda", "dtype": "fp16", "threads": None}, {"device": "cuda", "dtype": "bf16", "threads": None},
        {"device": "cpu", "dtype": "fp32", "threads": 1}, {"device": "cpu", "dtype": "fp32", "threads": 4}]


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(device="cpu", dtype="fp16"), "--dtype fp16 applies on CUDA only"),
    (dict(dtype="bf16"), "torch sees no GPU"),
    (dict(device="cuda"), "--bench-device cuda needs a CUDA GPU"),
    (dict(device="cpu,cuda"), "torch.cuda.is_available() is False"),
    (dict(device="tpu"), "Unknown bench device 'tpu'"),
    (dict(dtype="int4"), "Unknown bench dtype 'int4'"),
    (dict(threads=[2, 0]), "bench threads must be whole numbers"),
    (dict(threads="1,two"), "bench threads must be whole numbers"),
])
def test_settings_refused_with_a_sentence(no_gpu, student, kwargs, fragment):
    with pytest.raises(DistilleryError) as e:
        benchmark({"student": student}, **{**FAST, **kwargs})
    assert fragment in str(e.value)


def test_threads_need_a_cpu_to_time(fake_gpu, student):
    with pytest.raises(DistilleryError, match="--threads sets CPU thread counts"):
        benchmark({"student": student}, device="cuda", threads=2, **FAST)


def test_bench_flags_parse_comma_lists():
    assert bench_flags() == {}
    assert bench_flags("cpu", None, "4") == {"device": "cpu", "threads": 4}
    assert bench_flags("cpu,cuda", "fp16", "1, 4") == {"device": ["cpu", "cuda"], "dtype": "fp16", "threads": [1, 4]}
    with pytest.raises(DistilleryError, match="--threads takes whole numbers"):
        bench_flags(threads="1,4.5")


# ------------------------------------------------------------------------------------ the CPU thread sweep


def test_thread_sweep_one_record_per_count(no_gpu, teacher, student):
    torch.set_num_threads(3)  # not one of the counts measured: it must come back
    try:
        bench = benchmark({"teacher": teacher, "student": student}, threads="1,2", **FAST)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(1)  # conftest's
    json.dumps(bench)
    sweep = bench["sweep"]
    assert [(r["settings"]["device"], r["settings"]["dtype"], r["settings"]["threads"]) for r in sweep] == [
        ("cpu", "fp32", 1), ("cpu", "fp32", 2)]
    for record, threads in zip(sweep, (1, 2)):
        assert record["hardware"]["threads"] == threads and record["hardware"]["gpu"] is None
        assert record["settings"]["timer"] == "wall clock"
        assert record["settings"]["latency_shape"] == [1, 8] and record["settings"]["throughput_shape"] == [2, 8]
        assert record["models"]["student"]["latency_ms"]["runs"] == 2
        assert set(record["speedups"]) == {"student"} and record["speedup"] == record["speedups"]["student"]
        assert "skipped" not in record
    # the default record, where every reader of one bench record finds it
    assert {k: bench[k] for k in ("hardware", "models", "speedup", "speedups", "settings")} == {
        k: sweep[0][k] for k in ("hardware", "models", "speedup", "speedups", "settings")}
    assert sweep_of(bench) == sweep and sweep_of({"models": {}}) == [{"models": {}}]
    text = format_sweep(bench)
    assert "CPU, 1 thread:" in text and "CPU, 2 threads:" in text and text.count("| student |") == 2
    assert not teacher.training


# ------------------------------------------------------------------------------------ the CUDA path


def test_cuda_events_time_the_call_after_the_end_event_completed(monkeypatch):
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    seconds = bench_module._CudaEvents().time(lambda: FakeEvent.log.append("forward"))
    assert FakeEvent.log == ["record", "forward", "record", "synchronize"]
    assert 0 <= seconds < 60  # read in milliseconds, returned in seconds


class Fragile(nn.Module):
    """Runs only in fp32, like a model with an op that has no half-precision kernel."""

    def __init__(self):
        super().__init__()
        self.config = type("Cfg", (), {"vocab_size": 99})()
        self.embed = nn.Embedding(99, 4)

    def forward(self, input_ids, attention_mask=None):
        if self.embed.weight.dtype != torch.float32:
            raise RuntimeError("no half kernel here\nmore detail")
        return self.embed(input_ids)


def test_cuda_setting_times_copies_with_events_and_skips_cpu_only_models(fake_gpu, teacher, student, monkeypatch):
    from distillery.bench import noise

    monkeypatch.setattr(noise, "ROUNDS", 1)  # the passes counted below are one round's (a busy machine would add rounds)
    static = StaticEmbeddingModel(torch.randn(99, 4), torch.ones(99), torch.randn(2, 4), torch.zeros(2),
                                  StaticEmbeddingConfig(vocab_size=99, dim=4, num_outputs=2))
    models = {"teacher": teacher, "student": student, "teacher-int8": quantize_torch(teacher), "fragile": Fragile(),
              "static-embeddings": static}
    bench = benchmark(models, device="cpu,cuda", dtype="bf16", threads=1, **FAST)
    cpu, cuda = bench["sweep"]
    assert cpu["settings"]["device"] == "cpu" and set(cpu["models"]) == set(models) and "skipped" not in cpu
    assert cuda["settings"] == {**cuda["settings"], "device": "cuda", "dtype": "bf16", "timer": "CUDA events"}
    assert cuda["hardware"]["gpu"] == "Fake GPU 80GB" and cuda["hardware"]["device"] == "cuda"
    assert set(cuda["models"]) == {"teacher", "student", "static-embeddings"}  # the live baseline runs in bf16 too
    assert "CPU only" in cuda["skipped"]["teacher-int8"]
    assert cuda["skipped"]["fragile"] == "Does not run on cuda at bf16: no half kernel here"
    assert set(cuda["speedups"]) == {"student", "static-embeddings"} and cuda["speedup"]["latency"] > 0
    # FLOPs and sizes are the architecture's, the same in every setting
    assert cuda["models"]["student"]["flops_per_token"] == cpu["models"]["student"]["flops_per_token"]
    # every timed pass was read through events, each end event synchronised before it was read
    timed = 3 * (FAST["latency_runs"] + FAST["throughput_runs"])
    assert FakeEvent.log.count("synchronize") == timed and FakeEvent.log.count("device sync") == 2
    assert ("cuda", torch.bfloat16) in fake_gpu and ("cuda", torch.float32) not in fake_gpu
    # the caller's models stay as they were
    assert next(teacher.parameters()).dtype == torch.float32 and not teacher.training
    assert "CUDA bf16 (Fake GPU 80GB):" in format_sweep(bench) and "- teacher-int8: Runs on the CPU only" in format_sweep(bench)


def test_cuda_first_makes_it_the_default_record(fake_gpu, teacher, student):
    bench = benchmark({"teacher": teacher, "student": student}, device="cuda,cpu", **FAST)
    assert bench["settings"]["device"] == "cuda" and bench["hardware"]["gpu"] == "Fake GPU 80GB"
    assert [r["settings"]["device"] for r in bench["sweep"]] == ["cuda", "cpu"]
    assert setting_label(bench) == "CUDA fp32 (Fake GPU 80GB)"


def test_no_model_that_runs_on_the_device_is_refused(fake_gpu, teacher):
    with pytest.raises(DistilleryError, match="No model given runs on CUDA fp32"):
        benchmark({"teacher": quantize_torch(teacher)}, device="cuda", **FAST)


# ------------------------------------------------------------------------------------ the report


def _sweep_run(path):
    """A synthetic run folder whose bench.json holds two settings: the CPU, and CUDA without the int8 teacher."""
    run = make_run(path, extra=False)
    bench = json.loads((run / "bench.json").read_text())
    bench["models"]["teacher-int8"] = dict(bench["models"]["teacher"], latency_ms={
        **bench["models"]["teacher"]["latency_ms"], "median": 9.5})
    bench["settings"] = {"device": "cpu", "dtype": "fp32", "threads": 2}
    gpu_models = {n: dict(m, latency_ms={**m["latency_ms"], "median": m["latency_ms"]["median"] / 10})
                  for n, m in bench["models"].items() if n != "teacher-int8"}
    gpu = {"hardware": {**bench["hardware"], "gpu": "Fake GPU 80GB", "device": "cuda"}, "models": gpu_models,
           "settings": {"device": "cuda", "dtype": "fp16", "threads": 2},
           "skipped": {"teacher-int8": "Runs on the CPU only (torch int8): not timed on a GPU."}}
    bench["sweep"] = [dict(bench), gpu]
    (run / "bench.json").write_text(json.dumps(bench))
    return run


def test_report_states_speedups_per_setting(tmp_path):
    run = _sweep_run(tmp_path / "run")
    text = write_report(run).read_text()
    assert "## Speed by setting" in text and "The table above is the first setting, CPU, 2 threads." in text
    assert "| setting | teacher latency (ms) | student | teacher-int8 |" in text
    assert "| CPU, 2 threads | 19.00 | 1.90× / 2.08× | 2.00× / 1.00× |" in text
    assert "| CUDA fp16 (Fake GPU 80GB) | 1.90 | 1.90× / 2.08× | not timed |" in text
    assert "- Not timed: teacher-int8: Runs on the CPU only" in text


def test_report_of_one_setting_has_no_sweep_table(tmp_path):
    run = make_run(tmp_path / "run")
    assert speed_by_setting(read_bench(run)) == []
    assert "Speed by setting" not in write_report(run).read_text()


# ------------------------------------------------------------------------------------ the CLI


def test_cli_bench_thread_sweep(no_gpu, monkeypatch, capsys, tmp_path, tiny_bert):
    run = make_run(tmp_path / "run")
    shutil.copytree(tiny_bert, run / "student")
    out = run_ok(monkeypatch, capsys, "bench", str(run), str(tiny_bert), "--threads", "1,2", "--latency-runs", "2",
                 "--throughput-runs", "1", "--out", str(tmp_path / "bench.json"))
    assert "CPU, 1 thread:" in out and "CPU, 2 threads:" in out
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert [r["settings"]["threads"] for r in bench["sweep"]] == [1, 2]
    assert set(bench["models"]) == {"teacher", "student"} and bench["settings"]["threads"] == 1


@pytest.mark.parametrize("args, fragment", [
    (["--dtype", "fp16", "--bench-device", "cpu"], "--dtype fp16 applies on CUDA only"),
    (["--bench-device", "cuda"], "--bench-device cuda needs a CUDA GPU"),
    (["--threads", "1,x"], "--threads takes whole numbers"),
])
def test_cli_bench_refusals(no_gpu, monkeypatch, capsys, tmp_path, args, fragment):
    # refused before any model is loaded: the folder named need not even exist
    code, _, err = run_cli(monkeypatch, capsys, "bench", str(tmp_path / "nowhere"), *args)
    assert_one_line_error(code, err, fragment)


def test_cli_compress_passes_the_bench_settings(no_gpu, monkeypatch, capsys, tmp_path):
    from distillery import cli

    seen = {}
    monkeypatch.setattr(cli, "compress_and_show", lambda config, *a, **k: seen.update(config=config))
    run_ok(monkeypatch, capsys, "compress", "--out", str(tmp_path / "r"), "--threads", "1,2", "--bench-device", "cpu")
    assert seen["config"].bench == {**seen["config"].bench, "threads": [1, 2], "device": "cpu"}


def test_cli_compress_refuses_half_precision_without_a_gpu(no_gpu, monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--out", str(tmp_path / "r2"), "--dtype", "bf16")
    assert_one_line_error(code, err, "--dtype bf16 applies on CUDA only")
    assert not (tmp_path / "r2").exists()
