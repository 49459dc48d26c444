"""distillery.bench: sizes, FLOPs, the bench.json contract, interleaving, loading. Tiny and fast:
tests check what is measured and how, never how fast anything is."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

from distillery.runtime import load_model
from distillery.bench import (
    benchmark,
    count_parameters,
    flops_per_token,
    format_bench_table,
    hardware_fingerprint,
    make_inputs,
    save_bench,
)
from distillery.errors import DistilleryError
from tests.helpers import tiny_bert_config

FAST = dict(latency_shape=(1, 16), throughput_shape=(4, 16), latency_runs=3, warmup=1, throughput_runs=2)


def tiny_config(layers: int, **kw) -> BertConfig:
    return tiny_bert_config(num_hidden_layers=layers, **kw)


@pytest.fixture(scope="module")
def teacher():
    torch.manual_seed(0)
    return BertForSequenceClassification(tiny_config(2, num_labels=2)).eval()


@pytest.fixture(scope="module")
def student():
    torch.manual_seed(1)
    return BertModel(tiny_config(1)).eval()


class LinearToy(nn.Module):
    """An embedding lookup (no FLOPs) then one Linear; forward takes no token_type_ids."""

    def __init__(self, vocab=50, d_in=8, d_out=5):
        super().__init__()
        self.config = type("Cfg", (), {"vocab_size": vocab})()
        self.embed = nn.Embedding(vocab, d_in)
        self.proj = nn.Linear(d_in, d_out)

    def forward(self, input_ids, attention_mask=None):
        return self.proj(self.embed(input_ids))


# ------------------------------------------------------------------------------------ sizes


def test_count_parameters_bert_effective_is_one_row_per_table(student):
    params, effective = count_parameters(student)
    assert params == sum(p.numel() for p in student.parameters())
    c = student.config
    tables = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * c.hidden_size
    assert effective == params - tables + 3 * c.hidden_size


def test_tied_embeddings_count_once():
    torch.manual_seed(0)
    tied = BertForMaskedLM(tiny_config(1, tie_word_embeddings=True))
    untied = BertForMaskedLM(tiny_config(1, tie_word_embeddings=False))
    assert tied.cls.predictions.decoder.weight is tied.bert.embeddings.word_embeddings.weight
    p_tied, eff_tied = count_parameters(tied)
    p_untied, _ = count_parameters(untied)
    naive = sum(p.numel() for _, p in tied.named_parameters(remove_duplicate=False))
    shared = {id(p) for _, p in tied.named_parameters()}
    assert naive > p_tied == sum(p.numel() for p in tied.parameters())
    assert p_untied - p_tied >= 99 * 32
    assert len(shared) < len(list(tied.named_parameters(remove_duplicate=False)))
    # The tied table is also the LM head's weight: every row is used for every token.
    # Only the position and token-type tables shrink to one row.
    assert eff_tied == p_tied - (512 - 1) * 32 - (2 - 1) * 32


def test_shared_linear_counts_once():
    a = nn.Linear(4, 4, bias=False)
    b = nn.Linear(4, 4, bias=False)
    b.weight = a.weight
    assert count_parameters(nn.Sequential(a, b)) == (16, 16)


def test_num_effective_parameters_is_used_when_defined():
    class Routed(LinearToy):
        def num_effective_parameters(self):
            return 7

    params, effective = count_parameters(Routed())
    assert params == 50 * 8 + 8 * 5 + 5
    assert effective == 7


# ------------------------------------------------------------------------------------ FLOPs


def test_flops_of_linear_toy_is_two_in_out():
    assert flops_per_token(LinearToy(d_in=8, d_out=5), seq=10) == 2 * 8 * 5


def test_fewer_layers_fewer_flops_and_attention_counted(teacher, student):
    two = flops_per_token(BertModel(tiny_config(2)), seq=16)
    one = flops_per_token(student, seq=16)
    assert 0 < one < two
    # Per-token linear work does not grow with length; attention does (also on CPU's fused kernel).
    grows = flops_per_token(student, seq=64) - one
    # QK^T and AV: 2 * 2 * seq * hidden per token; the pooler (one 32x32 matmul per sequence)
    # spreads over more tokens.
    pooler = 2 * 32 * 32
    assert grows == pytest.approx(2 * 2 * (64 - 16) * 32 - (pooler / 16 - pooler / 64))
    assert flops_per_token(teacher, seq=16) > two  # pooler + classifier on top


# ------------------------------------------------------------------------------------ inputs


def test_make_inputs_only_gives_token_type_ids_to_models_that_take_them(student):
    bert = make_inputs(student, 2, 8, seed=3)
    toy = make_inputs(LinearToy(), 2, 8, seed=3)
    assert set(bert) == {"input_ids", "attention_mask", "token_type_ids"}
    assert set(toy) == {"input_ids", "attention_mask"}
    assert bert["input_ids"].shape == (2, 8)
    assert int(bert["input_ids"].min()) >= 1 and int(bert["input_ids"].max()) < 99
    assert torch.equal(bert["input_ids"], make_inputs(student, 2, 8, seed=3)["input_ids"])
    assert bert["attention_mask"].eq(1).all() and bert["token_type_ids"].eq(0).all()


# ------------------------------------------------------------------------------------ benchmark


def test_benchmark_contract(teacher, student):
    bench = benchmark({"teacher": teacher, "student": student, "toy": LinearToy(vocab=99)}, threads=1, **FAST)
    json.dumps(bench)  # serializable as it is
    hw = bench["hardware"]
    for key in ("cpu", "cores", "threads", "torch", "gpu", "platform"):
        assert key in hw
    assert hw["threads"] == 1 and hw["torch"] == torch.__version__ and hw["gpu"] is None
    assert list(bench["models"]) == ["teacher", "student", "toy"]
    for name, m in bench["models"].items():
        assert set(m) == {"params", "effective_params", "flops_per_token", "flops_per_token_throughput",
                          "latency_ms", "throughput"}
        assert isinstance(m["params"], int) and 0 < m["effective_params"] <= m["params"]
        assert isinstance(m["flops_per_token"], float) and m["flops_per_token"] > 0
        assert m["latency_ms"] == {**m["latency_ms"], "batch": 1, "seq": 16, "runs": 3}
        assert set(m["latency_ms"]) == {"batch", "seq", "median", "p90", "runs"}
        assert 0 < m["latency_ms"]["median"] <= m["latency_ms"]["p90"]
        assert set(m["throughput"]) == {"batch", "seq", "sentences_per_s"}
        assert (m["throughput"]["batch"], m["throughput"]["seq"]) == (4, 16)
        assert m["throughput"]["sentences_per_s"] > 0
    t, s = bench["models"]["teacher"], bench["models"]["student"]
    assert s["params"] < t["params"] and s["flops_per_token"] < t["flops_per_token"]
    assert set(bench["speedup"]) == {"latency", "throughput", "flop_ideal_latency", "flop_ideal_throughput"}
    assert bench["speedup"]["flop_ideal_latency"] == pytest.approx(t["flops_per_token"] / s["flops_per_token"])
    assert bench["speedup"]["latency"] == pytest.approx(t["latency_ms"]["median"] / s["latency_ms"]["median"])
    assert bench["speedup"]["throughput"] == pytest.approx(
        s["throughput"]["sentences_per_s"] / t["throughput"]["sentences_per_s"]
    )
    assert set(bench["speedups"]) == {"student", "toy"}
    assert bench["speedups"]["student"] == bench["speedup"]
    assert torch.get_num_threads() == 1  # restored (conftest sets 1)
    assert not teacher.training

    table = format_bench_table(bench)
    assert table.count("\n") == 5 and "| student |" in table and "| toy |" in table and "1.00×" in table


def test_models_take_turns_in_rotated_order():
    log = []

    class Logged(LinearToy):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def forward(self, input_ids, attention_mask=None):
            log.append(self.name)
            return super().forward(input_ids)

    models = {n: Logged(n) for n in ("teacher", "a", "b")}
    benchmark(models, latency_shape=(1, 4), throughput_shape=(2, 4), latency_runs=3, warmup=0, throughput_runs=1)
    # (flops_per_token calls two forwards each first: one per shape)
    timed = log[6 : 6 + 9]
    assert timed == ["teacher", "a", "b", "a", "b", "teacher", "b", "teacher", "a"]


def test_no_reference_means_no_speedups(student):
    bench = benchmark({"x": student}, **FAST)
    assert bench["speedup"] == {} and bench["speedups"] == {}
    assert "—" in format_bench_table(bench)


def test_benchmark_loads_folders(tmp_path, tiny_bert, teacher):
    teacher.save_pretrained(tmp_path / "clf")
    bench = benchmark({"teacher": str(tmp_path / "clf"), "student": tiny_bert}, **FAST)
    assert bench["models"]["teacher"]["params"] == count_parameters(teacher)[0]
    assert "speedup" in bench
    save_bench(bench, tmp_path / "bench.json")
    assert json.loads((tmp_path / "bench.json").read_text())["models"].keys() == {"teacher", "student"}


def test_load_model_picks_the_task_head(tmp_path, tiny_bert, teacher):
    teacher.save_pretrained(tmp_path / "clf")
    assert type(load_model(tmp_path / "clf")).__name__ == "BertForSequenceClassification"
    assert type(load_model(tiny_bert)).__name__ == "BertModel"


def test_load_model_rejects_non_model_folders(tmp_path):
    with pytest.raises(DistilleryError, match="not a saved model"):
        load_model(tmp_path)
    with pytest.raises(DistilleryError, match="does not exist"):
        load_model(tmp_path / "nope")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(latency_shape=(0, 16)), "latency_shape"),
        (dict(throughput_shape=(4,)), "throughput_shape"),
        (dict(latency_runs=0), "latency_runs"),
        (dict(threads=0), "threads"),
        (dict(latency_shape=(1, 4096)), "positions"),
    ],
)
def test_benchmark_validates_inputs(student, kwargs, match):
    with pytest.raises(DistilleryError, match=match):
        benchmark({"student": student}, **{**FAST, **kwargs})


def test_benchmark_rejects_empty_and_non_models():
    with pytest.raises(DistilleryError):
        benchmark({})
    with pytest.raises(DistilleryError, match="not a torch model"):
        benchmark({"x": 3}, **FAST)


def test_hardware_fingerprint_plain():
    hw = hardware_fingerprint("cpu")
    assert hw["gpu"] is None and hw["cores"] >= 1 and hw["threads"] == torch.get_num_threads()
    assert isinstance(hw["cpu"], str) and hw["cpu"]
    assert not math.isnan(hw["usable_cpus"])


def test_models_on_a_gpu_and_the_cpu_are_timed_together_on_the_cpu(monkeypatch, teacher, student):
    # Measured on an H200: prune's teacher, trained there, was timed beside CPU-built shapes; CUDA events (the
    # timer when any model is on a GPU) do not see CPU work, so every shape looked free and kept no head.
    import distillery.bench as bench

    seen = []
    monkeypatch.setattr(bench, "model_device", lambda m: torch.device("cuda" if m is teacher else "cpu"))
    monkeypatch.setattr(bench, "_interleaved_times", lambda models, *a, **k: seen.append(models) or
                        {n: [0.001] for n in models})
    bench.latency_ms({"teacher": teacher, "student": student}, shape=(1, 16), runs=2)
    timed = seen[0]
    assert timed["student"] is student and timed["teacher"] is not teacher  # a CPU copy, the model left where it is
    assert all(p.device.type == "cpu" for p in timed["teacher"].parameters())
    torch.testing.assert_close(dict(timed["teacher"].state_dict()), dict(teacher.state_dict()))
    seen.clear()
    monkeypatch.setattr(bench, "model_device", lambda m: torch.device("cpu"))
    bench.latency_ms({"teacher": teacher, "student": student}, shape=(1, 16), runs=2)
    assert seen[0]["teacher"] is teacher  # one device: nothing copied
