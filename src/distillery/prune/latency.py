"""The latency model of pruned students on this machine: measured, then fitted as a line in the shape.

What is timed is what ships: pruned students of random per-layer shapes (each layer's heads and FFN neurons, 0
removing the sub-layer, and a hidden width where the run may prune it), built at their size and timed at 1 × 128
**all in one measurement with the teacher**, interleaved and rotated as the bench times its models
(:func:`distillery.bench.checked_latency_ms`). On shared cores the machine's speed drifts between runs (the teacher
read 1.4 ms in one and 91 ms in the next), so a shape's latency is kept as its **ratio to the teacher's** of the
same round, and the model predicts that ratio: a target of ``--speedup`` s is the ratio 1 / s whatever the machine's
speed today. When the bench's noise check says a round was unstable (a model's spread, the machine's load) the
shapes are timed again, at most ``noise.ROUNDS`` rounds, each shape's ratio the median over the rounds; latency.json
says how it went. The model is

    ratio ≈ c · features, c ≥ 0 (non-negative least squares of the relative error), on the features

    1, A, Σ_l h_l · d/D, Σ_l h_l, F, Σ_l f_l · d/D

(A, F: attention and FFN sub-layers kept; h_l heads and f_l neurons of layer l; d of the teacher's D hidden
dimensions): a kept sub-layer's fixed cost, its projections' cost (units × width) and the attention's
per-head cost (scores and mixing at a fixed sequence length). A line, so the expected latency of the masks'
expected architecture is the same line on the expected shape, and differentiable in the masks' log α. Its fit
error is the k-fold cross-validated MAPE of the ratio (each shape predicted by a fit that did not see it).
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
from distillery.bench import checked_latency_ms, hardware_fingerprint, noise
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


# The share of its units a random shape keeps is drawn log-uniformly down to 1/16: drawing each layer's units
# uniformly (an earlier version) put most shapes between 1.3x and 3x, so the line was fitted where it is least
# used (4x-12x targets) and overpriced small shapes there (a 4x target measured 8x).
SMALLEST_SHARE = 1 / 16


def random_shape(config: PrunedBertConfig, rng: random.Random, prune_hidden: bool = True) -> dict[str, Tensor]:
    """A random pruned shape around a share k of the teacher's units, log k uniform in [log 1/16, 0]: each
    sub-layer removed with probability 0.1 + 0.4 (1 − √k) (small students lose whole sub-layers: the 4x shape of a
    real run kept 3 of 6 attention sub-layers), else k · full · u units (u uniform in [0.5, 1.5], at least one, at
    most full: layers differ as pruned ones do); the hidden width √k · D · u' (u' in [0.75, 1.25]) within [D/4, D],
    or D where the run keeps it (``prune_hidden`` False: the cheap mode). A line fitted on small shapes of a small
    width prices a run's small shapes of the full width out of what was timed: a cheap 8x STS-B student (384 of
    384) measured 6.8x where such a line said 8.2x."""
    L, H, Fw, D = config.num_hidden_layers, config.num_attention_heads, config.intermediate_size, config.hidden_size
    share = float(np.exp(rng.uniform(np.log(SMALLEST_SHARE), 0.0)))
    removed = 0.1 + 0.4 * (1 - np.sqrt(share))

    def units(full: int) -> int:
        return 0 if rng.random() < removed else min(full, max(1, round(share * full * rng.uniform(0.5, 1.5))))

    heads = [units(H) for _ in range(L)]
    ffn = [units(Fw) for _ in range(L)]
    hidden = min(D, max(max(1, D // 4), round(np.sqrt(share) * D * rng.uniform(0.75, 1.25))))
    hidden = hidden if prune_hidden else D  # drawn either way: the same seed draws the same units
    return {"heads": torch.tensor(heads, dtype=torch.float), "neurons": torch.tensor(ffn, dtype=torch.float),
            "attention": torch.tensor([float(h > 0) for h in heads]), "ffn": torch.tensor([float(f > 0) for f in ffn]),
            "hidden": torch.tensor(float(hidden))}


def shape_config(config: PrunedBertConfig, shape: dict[str, Tensor]) -> PrunedBertConfig:
    """The config of a pruned student of ``shape`` (whole numbers) cut from the full-size ``config``."""
    c = config.to_dict()
    for key in ("model_type", "architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype"):
        c.pop(key, None)
    c.update(hidden_size=int(shape["hidden"]), layer_heads=[int(h) for h in shape["heads"]],
             layer_intermediate_sizes=[int(f) for f in shape["neurons"]])
    return PrunedBertConfig(**c)


class LatencyModel:
    """The latency of a shape as a ratio to the teacher's: coefficients · :func:`features`, fitted on measured shapes."""

    def __init__(self, coefficients, full_hidden: int):
        self.coefficients = torch.tensor(list(coefficients), dtype=torch.float)
        self.full_hidden = full_hidden

    def __call__(self, shape: dict[str, Tensor]) -> Tensor:
        x = features(shape, self.full_hidden)
        return x @ self.coefficients.to(x.device, x.dtype)

    @classmethod
    def fit(cls, shapes: list[dict[str, Tensor]], ratios: list[float], full_hidden: int) -> "LatencyModel":
        from scipy.optimize import nnls

        x = torch.stack([features(s, full_hidden) for s in shapes]).double().numpy()
        r = np.asarray(ratios, dtype=float)
        # relative errors (each row over its ratio): plain least squares lets the large shapes (ratios near 1)
        # outweigh the small ones a 4x-12x target keeps, whose error is as large a share of their latency
        w = 1.0 / np.maximum(r, 1e-9)
        coefficients, _ = nnls(x * w[:, None], r * w)
        return cls(coefficients, full_hidden)

    def state(self) -> dict[str, Any]:
        return {"features": list(FEATURES), "coefficients": self.coefficients.tolist(), "full_hidden": self.full_hidden,
                "predicts": "latency / the teacher's latency"}


def fit_error(shapes: list[dict[str, Tensor]], ratios: list[float], full_hidden: int, folds: int = 4) -> float:
    """k-fold cross-validated MAPE (%) of the line: each shape predicted by a fit on the other folds."""
    predicted = [0.0] * len(shapes)
    for k in range(folds):
        held = list(range(k, len(shapes), folds))
        rest = [i for i in range(len(shapes)) if i % folds != k]
        model = LatencyModel.fit([shapes[i] for i in rest], [ratios[i] for i in rest], full_hidden)
        for i in held:
            predicted[i] = float(model(shapes[i]))
    return mape(predicted, ratios)


def measure_ratios(full: nn.Module, shapes: list[dict[str, Tensor]], teacher: nn.Module, runs: int,
                   shape: tuple[int, int] = (1, 128), threads: int | None = None,
                   rounds: int = noise.ROUNDS) -> tuple[list[float], float, list[dict[str, Any]]]:
    """Each shape's latency as a ratio to the teacher's, all the shapes' pruned students (random weights: time does
    not depend on them) and the teacher timed together; timed again while the noise check says unstable, at most
    ``rounds`` rounds. Returns the ratios (each shape's median over the rounds), the teacher's median latency (ms)
    and each round's noise record."""
    cls = type(full)
    # the shapes are built on the CPU: a teacher trained on a GPU is timed as a CPU copy beside them (bench)
    models = {"teacher": teacher, **{f"shape {i}": cls(shape_config(full.config, s)) for i, s in enumerate(shapes)}}
    per_round, teacher_ms, checks = [], [], []
    for _ in range(max(1, int(rounds))):
        ms, checked = checked_latency_ms(models, shape=shape, runs=runs, warmup=2, threads=threads)
        per_round.append([ms[f"shape {i}"] / ms["teacher"] for i in range(len(shapes))])
        teacher_ms.append(ms["teacher"])
        checks.append(checked)
        if checked["stable"]:
            break
        logger.info("Latency model: round %d unstable (%s); timing again.", len(checks), "; ".join(checked["reasons"]))
    ratios = np.median(np.asarray(per_round, dtype=float), axis=0)
    return [float(r) for r in ratios], float(np.median(teacher_ms)), checks


def full_shape_of(config: PrunedBertConfig) -> dict[str, Tensor]:
    L = config.num_hidden_layers
    return {"heads": torch.full((L,), float(config.num_attention_heads)),
            "neurons": torch.full((L,), float(config.intermediate_size)),
            "attention": torch.ones(L), "ffn": torch.ones(L), "hidden": torch.tensor(float(config.hidden_size))}


def fit_latency_model(full: nn.Module, teacher: nn.Module, count: int, runs: int, seed: int, shape=(1, 128),
                      threads: int | None = None, prune_hidden: bool = True
                      ) -> tuple[LatencyModel, float, dict[str, Any]]:
    """``count`` shapes (the full one and random ones, of a smaller hidden width only where ``prune_hidden``)
    timed with the teacher, the line fitted on their ratios; returns it, the teacher's latency (ms) and
    latency.json's record (measurements, fit error, noise)."""
    if count < 8:
        raise DistilleryError(f"The latency model needs at least 8 measured shapes (latency_shapes), got {count}.")
    c, rng = full.config, random.Random(seed)
    shapes = [full_shape_of(c)] + [random_shape(c, rng, prune_hidden) for _ in range(count - 1)]
    ratios, teacher_ms, checks = measure_ratios(full, shapes, teacher, runs, shape, threads)
    model = LatencyModel.fit(shapes, ratios, c.hidden_size)
    last = checks[-1]
    record = {"hardware": hardware_fingerprint(), "shape": list(shape), "teacher_ms": teacher_ms,
              "prune_hidden": prune_hidden,
              "fit_error_mape": fit_error(shapes, ratios, c.hidden_size),
              "noise": {"stable": last["stable"], "rounds": len(checks), "reasons": last["reasons"], "checks": checks},
              "model": model.state(), "measurements": [{**{k: v.tolist() for k, v in s.items()}, "ratio": r}
                                                       for s, r in zip(shapes, ratios)]}
    return model, teacher_ms, record


def save_record(path: str | Path, record: dict[str, Any]) -> Path:
    """latency.json, written once: a resumed run reads it back rather than timing again."""
    path = Path(path)
    with atomic_file(path, "w") as f:
        f.write(json.dumps(record, indent=2))
    return path


def load_record(path: str | Path) -> tuple[LatencyModel, float, dict[str, Any]]:
    record = json.loads(Path(path).read_text())
    m = record["model"]
    return LatencyModel(m["coefficients"], m["full_hidden"]), float(record["teacher_ms"]), record


def reused_record(path: str | Path, full: nn.Module, prune_hidden: bool = True) -> dict[str, Any]:
    """An earlier run's latency.json (option latency_from), refused in a sentence when it is missing, unreadable,
    of another teacher's shape, timed on another CPU (its ratios hold for that teacher on that machine only) or
    fitted on shapes of another kind than this run chooses from (``prune_hidden``, :func:`random_shape`)."""
    try:
        record = json.loads(Path(path).read_text())
        model = record["model"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DistilleryError(f"Option latency_from: {path} is not a readable latency.json of a prune run ({e}).") from None
    if model.get("full_hidden") != full.config.hidden_size or len(record.get("measurements", [{}])[0].get("heads", [])) \
            != full.config.num_hidden_layers:
        raise DistilleryError(f"Option latency_from: {path} was measured for another teacher's shape.")
    here = hardware_fingerprint()["cpu"]
    if record.get("hardware", {}).get("cpu") != here:
        raise DistilleryError(f"Option latency_from: {path} was timed on {record.get('hardware', {}).get('cpu')!r}, "
                              f"not on this machine's {here!r}.")
    fitted = record.get("prune_hidden", True)  # a record written before the field: its shapes pruned the width
    if fitted != prune_hidden:
        what = lambda prunes: "prune the hidden dimension" if prunes else "keep the hidden dimension"  # noqa: E731
        raise DistilleryError(f"Option latency_from: {path} was fitted on shapes that {what(fitted)}, and this run's "
                              f"shapes {what(prune_hidden)} (the cheap mode always keeps it): time this run's own.")
    return {**record, "reused_from": str(path)}
