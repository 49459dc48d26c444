"""Parity: how far an export's outputs are from the fp32 torch model's, on the same inputs.

An fp32 ONNX graph must reproduce torch within ``FP32_ATOL`` + ``FP32_RTOL``·|torch| on every
output element; an int8 model is not equal to the fp32 one, so its check is not a tolerance but a
report (largest and mean absolute difference, how often the predicted class stays the same).
Non-finite outputs or wrong shapes fail either.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from distillery.errors import DistilleryError

FP32_ATOL = 1e-4
FP32_RTOL = 1e-4
PARITY_EXAMPLES = 64
PARITY_BATCH = 16

# Short sentences of different lengths: parity inputs when no task is given (padding included).
SAMPLE_TEXTS = (
    "a good movie .",
    "the plot was boring and the actors were not very good , but the city looked great .",
    "what a film !",
    "paris is a city in france ; it was first named lutetia , and the river is the seine .",
    "not fun",
    "who was born in london in the first year of the film ?",
    "really bad",
    "the movie is great , the plot is great , the actor is great and it was fun .",
)
def sample_batches(tokenizer, inputs: Sequence[str], max_length: int = 64, batch: int = 4) -> list[dict[str, torch.Tensor]]:
    """Tokenized SAMPLE_TEXTS in padded batches, for a parity check without a task."""
    out = []
    for i in range(0, len(SAMPLE_TEXTS), batch):
        enc = tokenizer(list(SAMPLE_TEXTS[i : i + batch]), padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
        out.append(_select(enc, inputs))
    return out


def dev_batches(task_data, inputs: Sequence[str], n: int = PARITY_EXAMPLES, batch: int = PARITY_BATCH) -> list[dict[str, torch.Tensor]]:
    """The first ``n`` dev features of a task, padded in batches: parity on the inputs that matter."""
    dev = task_data.dev
    if dev is None or len(dev) == 0:
        raise DistilleryError(f"Task {task_data.task.name} has no dev examples to check the export on.")
    rows = [dev[i] for i in range(min(n, len(dev)))]
    return [_select(task_data.collate(rows[i : i + batch]), inputs) for i in range(0, len(rows), batch)]


def _select(batch: Mapping[str, Any], inputs: Sequence[str]) -> dict[str, torch.Tensor]:
    missing = [k for k in inputs if k not in batch]
    if missing:
        raise DistilleryError(f"The encoded inputs lack {', '.join(missing)}, which the model takes.")
    return {k: torch.as_tensor(batch[k]) for k in inputs}


def _outputs(model: nn.Module, batch: Mapping[str, torch.Tensor], names: Sequence[str]) -> list[np.ndarray]:
    with torch.inference_mode():
        out = model(**batch)
    return [_field(out, n).detach().float().cpu().numpy() for n in names]


def _field(out, name):
    value = getattr(out, name, None)
    if value is None and isinstance(out, Mapping):
        value = out.get(name)
    if value is None:
        raise DistilleryError(f"The model output has no {name!r}.")
    return value


def compare_outputs(reference: nn.Module, candidate: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]],
                    names: Sequence[str]) -> dict[str, Any]:
    """How far ``candidate``'s outputs are from ``reference``'s on the same batches.

    Returns the largest and mean absolute difference, the largest ``|d| − rtol·|ref|`` excess over
    the fp32 tolerance (``worst_excess`` ≤ FP32_ATOL means within tolerance), how often the arg-max
    (predicted class, or answer start/end) agrees, and whether every output was finite and of the
    right shape.
    """
    max_abs, total, count, agree, rows, worst = 0.0, 0.0, 0, 0, 0, -math.inf
    for batch in batches:
        ref, cand = _outputs(reference, batch, names), _outputs(candidate, batch, names)
        for r, c in zip(ref, cand):
            if r.shape != c.shape:
                return {"ok_shapes": False, "detail": f"output shape {c.shape} where torch gives {r.shape}"}
            if not np.isfinite(c).all():
                return {"ok_shapes": True, "finite": False, "detail": "the exported model gives non-finite outputs"}
            d = np.abs(r - c)
            max_abs = max(max_abs, float(d.max(initial=0.0)))
            worst = max(worst, float((d - FP32_RTOL * np.abs(r)).max(initial=-math.inf)))
            total += float(d.sum())
            count += d.size
            if r.ndim >= 2:
                agree += int((r.argmax(-1) == c.argmax(-1)).sum())
                rows += int(np.prod(r.shape[:-1]))
    return {
        "ok_shapes": True,
        "finite": True,
        "max_abs_diff": max_abs,
        "mean_abs_diff": total / max(count, 1),
        "worst_excess": worst,
        "argmax_agreement": agree / rows if rows else None,
        "elements": count,
    }


def check_fp32_parity(result: Mapping[str, Any], what: str) -> dict[str, Any]:
    if not result.get("ok_shapes", False) or not result.get("finite", False):
        raise DistilleryError(f"The {what} export is wrong: {result.get('detail')}.")
    if result["worst_excess"] > FP32_ATOL:
        raise DistilleryError(
            f"The {what} export differs from torch by up to {result['max_abs_diff']:.2e}, beyond the tolerance "
            f"atol {FP32_ATOL:g} + rtol {FP32_RTOL:g}·|torch|; it was not written."
        )
    return {**result, "atol": FP32_ATOL, "rtol": FP32_RTOL, "passed": True}


def check_int8(result: Mapping[str, Any], what: str) -> dict[str, Any]:
    if not result.get("ok_shapes", False) or not result.get("finite", False):
        raise DistilleryError(f"The {what} export is wrong: {result.get('detail')}.")
    out = {k: v for k, v in result.items() if k != "worst_excess"}
    out["note"] = "int8 against fp32 torch: reported, not bounded (see scores for the quality drop)"
    return out
