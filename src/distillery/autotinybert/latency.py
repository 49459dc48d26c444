"""Latency of sub-architectures on this machine, and a predictor fitted to measurements (§3.3).

What is timed is what will ship: each sampled α is extracted to its standalone model and measured
(median of single forward passes at 1 × 128 by default, as in the paper) — not the sliced super-net,
whose indexing costs would be measured too. The predictor is a small MLP on the normalised
(l, d_m, d_f, h, d_qkv), fitted to log-latency (so its loss is a relative error), with a held-out
split for its MAPE; a FLOP-count predictor (latency ≈ a · FLOPs + b, least squares) is the baseline
it must beat. Both are saved as JSON beside the machine's fingerprint: a predictor is only valid on
the device it was measured on.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from distillery.autotinybert.space import Arch, SearchSpace
from distillery.bench import hardware_fingerprint, latency_ms, torch_threads
from distillery.errors import DistilleryError
from distillery.folders import atomic_file

logger = logging.getLogger("distillery")


def arch_flops(arch: Arch, seq: int = 128) -> float:
    """Multiply-accumulates per token of α's encoder at sequence length ``seq`` (the shape-dependent part
    of its cost): Q, K, V, output projections, attention scores and mixing, and the FFN."""
    per_layer = 4 * arch.hidden * arch.qkv + 2 * seq * arch.qkv + 2 * arch.hidden * arch.ffn
    return float(arch.layers * per_layer)


def measure(supernet, archs: list[Arch], shape: tuple[int, int] = (1, 128), runs: int = 15, warmup: int = 3,
            threads: int | None = None, progress: bool = True, reference: nn.Module | None = None,
            reference_ms: float | None = None) -> list[float]:
    """Median latency (ms) of each α's extracted model, measured one model at a time.

    With ``reference`` (the teacher) and ``reference_ms`` (its latency when the budget was set), each
    model is timed beside the reference, interleaved, and reported as its ratio to the reference times
    ``reference_ms``: on shared cores the machine's speed drifts by 20 % within minutes, and a budget,
    a predictor and a final check timed at different moments would otherwise disagree by that much."""
    from tqdm.auto import tqdm

    out = []
    for arch in tqdm(archs, desc="latency", disable=not progress):
        models = {"m": supernet.extract(arch)}
        if reference is not None:
            models["reference"] = reference
        ms = latency_ms(models, shape=shape, runs=runs, warmup=warmup, threads=threads)
        out.append(ms["m"] if reference is None else ms["m"] * float(reference_ms) / ms["reference"])
    return out


def mape(predicted, measured) -> float:
    """Mean absolute percentage error, in percent."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    return float(np.mean(np.abs(p - m) / m) * 100.0)


@dataclass
class FlopPredictor:
    """latency ≈ a · FLOPs(α) + b, fitted by least squares: the baseline."""

    a: float = 0.0
    b: float = 0.0
    seq: int = 128

    def fit(self, archs: list[Arch], ms: list[float]) -> "FlopPredictor":
        x = np.array([arch_flops(a, self.seq) for a in archs])
        self.a, self.b = (float(v) for v in np.polyfit(x, np.asarray(ms, dtype=float), 1))
        return self

    def predict(self, archs: list[Arch]) -> np.ndarray:
        return self.a * np.array([arch_flops(a, self.seq) for a in archs]) + self.b


class MLPPredictor:
    """A small MLP from normalised (l, d_m, d_f, h, d_qkv) to log-latency."""

    def __init__(self, space: SearchSpace, hidden: int = 64, seed: int = 0):
        full = space.full()
        self.scale = np.array([full.layers, full.hidden, full.ffn, full.heads, full.qkv], dtype=np.float32)
        self.hidden, self.seed = hidden, seed
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(5, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def _features(self, archs: list[Arch]) -> torch.Tensor:
        x = np.array([[a.layers, a.hidden, a.ffn, a.heads, a.qkv] for a in archs], dtype=np.float32) / self.scale
        return torch.from_numpy(x)

    def fit(self, archs: list[Arch], ms: list[float], steps: int = 1500, lr: float = 3e-3) -> "MLPPredictor":
        # 1,500 full-batch steps: on 150 architectures timed here (benchmarks/results/autotinybert-latency.json),
        # held-out MAPE over four splits 4.72 % against 4.89 % at 3,000 steps (7.21 against 7.13 on 40), in half the time
        x, y = self._features(archs), torch.log(torch.tensor(ms, dtype=torch.float32)).unsqueeze(1)
        torch.manual_seed(self.seed)
        # fused: one kernel updates the six tensors; on so small a net the per-tensor ops were half of a step's time
        opt = torch.optim.Adam(self.net.parameters(), lr=lr, fused=True)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
        # One thread: each op is tiny, so a second thread only adds a hand-off per op (20x slower on 2
        # cores, far worse when they are busy) for the same result.
        with torch_threads(1):
            for _ in range(steps):  # a few hundred points: full-batch steps
                opt.zero_grad()
                loss = nn.functional.mse_loss(self.net(x), y)
                loss.backward()
                opt.step()
                sched.step()
        return self

    @torch.no_grad()
    def predict(self, archs: list[Arch]) -> np.ndarray:
        return torch.exp(self.net(self._features(archs))).squeeze(1).numpy().astype(float)

    def state(self) -> dict[str, Any]:
        return {"scale": self.scale.tolist(), "hidden": self.hidden, "seed": self.seed,
                "weights": {k: v.tolist() for k, v in self.net.state_dict().items()}}

    @classmethod
    def from_state(cls, space: SearchSpace, state: dict[str, Any]) -> "MLPPredictor":
        p = cls(space, hidden=state["hidden"], seed=state["seed"])
        p.scale = np.array(state["scale"], dtype=np.float32)
        p.net.load_state_dict({k: torch.tensor(v) for k, v in state["weights"].items()})
        return p


def fit_predictor(space: SearchSpace, archs: list[Arch], ms: list[float], test_fraction: float = 0.25,
                  seed: int = 0) -> tuple[MLPPredictor, dict[str, Any]]:
    """Split the measurements (seeded), fit the MLP and the FLOP baseline on the training part,
    report both MAPEs on the held-out architectures; refit the MLP on everything for use."""
    if len(archs) < 8:
        raise DistilleryError(f"A latency predictor needs at least 8 measured architectures, got {len(archs)}.")
    order = list(range(len(archs)))
    random.Random(seed).shuffle(order)
    n_test = max(2, int(round(test_fraction * len(archs))))
    test, train = order[:n_test], order[n_test:]
    pick = lambda idx, xs: [xs[i] for i in idx]
    mlp = MLPPredictor(space, seed=seed).fit(pick(train, archs), pick(train, ms))
    flops = FlopPredictor().fit(pick(train, archs), pick(train, ms))
    report = {
        "measured": len(archs), "train": len(train), "test": len(test),
        "mape_mlp": mape(mlp.predict(pick(test, archs)), pick(test, ms)),
        "mape_flops": mape(flops.predict(pick(test, archs)), pick(test, ms)),
        "flop_fit": {"a": flops.a, "b": flops.b},
    }
    final = MLPPredictor(space, seed=seed).fit(archs, ms)
    return final, report


def save_predictor(path: str | Path, predictor: MLPPredictor, report: dict[str, Any], archs: list[Arch],
                   ms: list[float], shape: tuple[int, int], threads: int | None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"hardware": hardware_fingerprint(), "shape": list(shape), "threads": threads or torch.get_num_threads(),
              "report": report, "predictor": predictor.state(),
              "measurements": [{**a.as_dict(), "ms": m} for a, m in zip(archs, ms)]}
    with atomic_file(path, "w") as f:
        f.write(json.dumps(record, indent=2))
    return path


def load_predictor(path: str | Path, space: SearchSpace) -> tuple[MLPPredictor, dict[str, Any]]:
    record = json.loads(Path(path).read_text())
    return MLPPredictor.from_state(space, record["predictor"]), record
