"""Noisy timings are detected (issue 41): a spiking timer and a loaded machine are flagged in bench.json,
the report and the model card; a steady one is not, and an unstable latency is timed again, up to a bound."""

import itertools

import pytest
from torch import nn

from distillery import bench
from distillery.bench import noise
from distillery.run_record import noise_warning


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = type("C", (), {"vocab_size": 2000, "max_position_embeddings": 64})()
        self.emb = nn.Embedding(2000, 4)

    def forward(self, input_ids=None, attention_mask=None, **_):
        return self.emb(input_ids).sum()


def _patched_timer(monkeypatch, seconds):
    """Every timed pass returns the next of ``seconds`` (cycled) instead of the wall clock."""
    values = itertools.cycle(seconds)

    def fake(self, call):
        call()
        return next(values)

    monkeypatch.setattr(bench._WallClock, "time", fake)


SETTINGS = dict(latency_shape=(1, 8), throughput_shape=(2, 8), latency_runs=10, warmup=0, throughput_runs=1)


def test_a_steady_timer_on_a_quiet_machine_is_stable_in_one_round(monkeypatch):
    _patched_timer(monkeypatch, [0.010, 0.0101, 0.0102, 0.0099])
    monkeypatch.setattr(noise, "machine_load", lambda: 0.5)
    record = bench.benchmark({"teacher": Tiny(), "student": Tiny()}, **SETTINGS)
    assert record["noise"]["stable"] and record["noise"]["rounds"] == 1 and not record["noise"]["reasons"]
    assert noise_warning(record) is None


def test_a_spiking_timer_is_timed_again_then_flagged(monkeypatch):
    calls = []
    real = bench._times_at
    monkeypatch.setattr(bench, "_times_at", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    _patched_timer(monkeypatch, [0.010] * 7 + [0.060] * 3)  # 30 % of passes six times slower
    monkeypatch.setattr(noise, "machine_load", lambda: 0.5)
    record = bench.benchmark({"teacher": Tiny(), "student": Tiny()}, **SETTINGS)
    assert record["noise"]["rounds"] == noise.ROUNDS and not record["noise"]["stable"]
    assert calls.count((1, 8)) == noise.ROUNDS and calls.count((2, 8)) == 1  # latency again, throughput once
    assert record["noise"]["spread"]["teacher"] > noise.MAX_SPREAD
    assert "teacher's latency varied by" in noise_warning(record)


def test_a_loaded_machine_is_flagged_even_with_steady_passes(monkeypatch):
    _patched_timer(monkeypatch, [0.010])
    monkeypatch.setattr(noise, "machine_load", lambda: 64.0)
    record = bench.benchmark({"teacher": Tiny(), "student": Tiny()}, **SETTINGS)
    assert not record["noise"]["stable"] and record["noise"]["rounds"] == 1
    assert "load average was above" in noise_warning(record)


@pytest.mark.parametrize("record", [{}, {"noise": "odd"}, {"noise": {"stable": True}}])
def test_records_without_a_flag_give_no_warning(record):
    assert noise_warning(record) is None


def test_the_report_and_the_card_carry_the_flag(tiny_bert4, glue_dir, tmp_path, monkeypatch):
    from distillery.pipeline import compress
    from tests.helpers import tiny_config

    monkeypatch.setattr(noise, "machine_load", lambda: 64.0)
    out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run"))
    verdict = (out / "report.md").read_text().split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert "Unstable timings" in verdict and "load average was above" in verdict
    assert "Unstable timings" in (out / "student" / "README.md").read_text()



def test_the_spread_of_a_pass_shorter_than_the_timers_jitter_is_not_judged():
    fast = [0.0004] * 7 + [0.0006] * 3  # 0.4 ms with 0.2 ms of jitter: 50 % spread, nothing about the machine
    slow = [0.020] * 10
    assert noise.spreads({"static": fast, "teacher": slow}) == {"teacher": 0.0}
    assert noise.noise_record(noise.spreads({"static": fast, "teacher": slow}), 1, 0.5, 0.5, 2)["stable"]
