"""The latency model of pruned students on this machine: measured, then fitted as a line in the shape.

What is timed is what ships: pruned students of random per-layer shapes (each layer's heads and FFN neurons,
0 removing the sub-layer, and a hidden width), built at their size and timed at 1 × 128 beside the teacher,
interleaved, as AutoTinyBERT's predictor is (:func:`distillery.autotinybert.latency.measure`: on shared cores a
machine's speed drifts; each time is its ratio to the teacher's times the teacher's). The model is
latency ≈ c · features, c ≥ 0 (non-negative least squares), on the features

    1, A, Σ_l h_l · d/D, Σ_l h_l, F, Σ_l f_l · d/D

(A, F: attention and FFN sub-layers kept; h_l heads and f_l neurons of layer l; d of the teacher's D hidden
dimensions): a kept sub-layer's fixed cost, its projections' cost (units × width) and the attention's
per-head cost (scores and mixing at a fixed sequence length). A line, so the expected latency of the masks'
expected architecture is the same line on the expected shape, and differentiable in the masks' log α.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from distillery.autotinybert.latency import mape
from distillery.bench import hardware_fingerprint, latency_ms
from distillery.errors import DistilleryError
from distillery.folders import atomic_file
from distillery.prune.modeling_prune import PrunedBertConfig

logger = logging.getLogger("distillery")
FEATURES = ("constant", "attention layers", "heads x width", "heads", "ffn layers", "neurons x width")


def features(shape: dict[str, Tensor], full_hidden: int) -> Tensor:
    """The model's features (6,) of a shape (:func:`distillery.prune.masks.shape_of`: heads, neurons and sub-layer
    presence a layer, the hidden width), differentiable in it."""
    ratio = shape["hidden"] / full_hidden
    h, f = shape["heads"].sum(), shape["neurons"].sum()
    one = torch.ones((), dtype=h.dtype, device=h.device)
    return torch.stack([one, shape["attention"].sum(), h * ratio, h, shape["ffn"].sum(), f * ratio])


def random_shape(config: PrunedBertConfig, rng: random.Random) -> dict[str, Tensor]:
    """A random pruned shape: each sub-layer removed with probability 0.2, else uniform in 1..full; d in [D/4, D]."""
    L, H, Fw, D = config.num_hidden_layers, config.num_attention_heads, config.intermediate_size, config.hidden_size
    heads = [0 if rng.random() < 0.2 else rng.randint(1, H) for _ in range(L)]
    ffn = [0 if rng.random() < 0.2 else rng.randint(1, Fw) for _ in range(L)]
    return {"heads": torch.tensor(heads, dtype=torch.float), "neurons": torch.tensor(ffn, dtype=torch.float),
            "attention": torch.tensor([float(h > 0) for h in heads]), "ffn": torch.tensor([float(f > 0) for f in ffn]),
            "hidden": torch.tensor(float(rng.randint(max(1, D // 4), D)))}


def shape_config(config: PrunedBertConfig, shape: dict[str, Tensor]) -> PrunedBertConfig:
    """The config of a pruned student of ``shape`` (whole numbers) cut from the full-size ``config``."""
    c = config.to_dict()
    for key in ("model_type", "architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype"):
        c.pop(key, None)
    c.update(hidden_size=int(shape["hidden"]), layer_heads=[int(h) for h in shape["heads"]],
             layer_intermediate_sizes=[int(f) for f in shape["neurons"]])
    return PrunedBertConfig(**c)


class LatencyModel:
    """latency (ms) ≈ coefficients · :func:`features`, fitted on measured shapes."""

    def __init__(self, coefficients, full_hidden: int):
        self.coefficients = torch.tensor(list(coefficients), dtype=torch.float)
        self.full_hidden = full_hidden

    def __call__(self, shape: dict[str, Tensor]) -> Tensor:
        x = features(shape, self.full_hidden)
        return x @ self.coefficients.to(x.device, x.dtype)

    @classmethod
    def fit(cls, shapes: list[dict[str, Tensor]], ms: list[float], full_hidden: int) -> "LatencyModel":
        from scipy.optimize import nnls

        x = torch.stack([features(s, full_hidden) for s in shapes]).double().numpy()
        coefficients, _ = nnls(x, np.asarray(ms, dtype=float))
        return cls(coefficients, full_hidden)

    def state(self) -> dict[str, Any]:
        return {"features": list(FEATURES), "coefficients": self.coefficients.tolist(), "full_hidden": self.full_hidden}


def measure_shapes(full: nn.Module, shapes: list[dict[str, Tensor]], teacher: nn.Module, teacher_ms: float,
                   runs: int, shape: tuple[int, int] = (1, 128), threads: int | None = None) -> list[float]:
    """Each shape's pruned student (random weights: time does not depend on them) timed beside the teacher,
    as its ratio to the teacher's time × ``teacher_ms``."""
    from tqdm.auto import tqdm

    out = []
    cls = type(full)
    for s in tqdm(shapes, desc="latency"):
        model = cls(shape_config(full.config, s))
        ms = latency_ms({"m": model, "reference": teacher}, shape=shape, runs=runs, warmup=2, threads=threads)
        out.append(ms["m"] * teacher_ms / ms["reference"])
    return out


def fit_latency_model(full: nn.Module, teacher: nn.Module, count: int, runs: int, seed: int, shape=(1, 128),
                      threads: int | None = None) -> tuple[LatencyModel, float, dict[str, Any]]:
    """Time the teacher, then ``count`` random shapes (and the full one), fit the model; returns it, the teacher's
    latency and a record (measurements, held-out MAPE of a fit on three quarters)."""
    if count < 8:
        raise DistilleryError(f"The latency model needs at least 8 measured shapes (latency_shapes), got {count}.")
    teacher_ms = latency_ms({"teacher": teacher}, shape=shape, runs=runs, warmup=2, threads=threads)["teacher"]
    c, rng = full.config, random.Random(seed)
    full_shape = {"heads": torch.full((c.num_hidden_layers,), float(c.num_attention_heads)),
                  "neurons": torch.full((c.num_hidden_layers,), float(c.intermediate_size)),
                  "attention": torch.ones(c.num_hidden_layers), "ffn": torch.ones(c.num_hidden_layers),
                  "hidden": torch.tensor(float(c.hidden_size))}
    shapes = [full_shape] + [random_shape(c, rng) for _ in range(count - 1)]
    ms = measure_shapes(full, shapes, teacher, teacher_ms, runs, shape, threads)
    held = list(range(len(shapes)))[1::4]
    fit_on = [i for i in range(len(shapes)) if i not in held]
    trial = LatencyModel.fit([shapes[i] for i in fit_on], [ms[i] for i in fit_on], c.hidden_size)
    error = mape([float(trial(shapes[i])) for i in held], [ms[i] for i in held])
    model = LatencyModel.fit(shapes, ms, c.hidden_size)
    record = {"hardware": hardware_fingerprint(), "shape": list(shape), "teacher_ms": teacher_ms, "held_out_mape": error,
              "model": model.state(), "measurements": [{**{k: v.tolist() for k, v in s.items()}, "ms": m}
                                                       for s, m in zip(shapes, ms)]}
    return model, teacher_ms, record


def save_record(path: str | Path, record: dict[str, Any]) -> Path:
    path = Path(path)
    with atomic_file(path, "w") as f:
        f.write(json.dumps(record, indent=2))
    return path


def load_record(path: str | Path) -> tuple[LatencyModel, float, dict[str, Any]]:
    record = json.loads(Path(path).read_text())
    m = record["model"]
    return LatencyModel(m["coefficients"], m["full_hidden"]), float(record["teacher_ms"]), record
