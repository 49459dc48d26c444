"""Quantization recovery: when int8 loses more than ``RECOVER_THRESHOLD`` points on dev, a short
distillation pass with fake-quantized Linear layers (``torch.ao`` FakeQuantize modules reproducing
quantize_dynamic's rounding, straight-through gradients), the fp32 teacher's logits as targets,
through the one Trainer and the losses of ``training/losses.py``.
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from distillery.config import TrainConfig
from distillery.errors import DistilleryError
from distillery.evaluation import score
from distillery.export.formats import resolve_format
from distillery.export.onnx import per_channel_int8
from distillery.runtime import quantize_torch, quiet
from distillery.training.losses import distillation_loss
from distillery.training.trainer import Trainer

RECOVER_THRESHOLD = 1.0  # points of the main metric (accuracy 0.01 = 1 point; SQuAD F1 is in points)


class FakeQuantLinear(nn.Linear):
    """``nn.Linear`` computing what quantize_dynamic's int8 Linear computes, in fp32, trainably.

    The weight goes through a symmetric qint8 FakeQuantize (per tensor as torch's quantize_dynamic, per output
    channel as our ONNX Runtime export with ``per_channel``) and the input through a per-tensor affine quint8
    one, both with the range of the current tensor (a memoryless observer: averaging constant 1), as dynamic
    quantization sees them; ``reduce_range`` gives the input 7 bits, as torch's x86/fbgemm engine does (ONNX
    Runtime uses 8). Gradients pass straight through
    the rounding. It shares the wrapped Linear's weight and bias, so ``strip_fake_quant`` gives back
    a plain Linear with the trained values.
    """

    def __init__(self, linear: nn.Linear, reduce_range: bool, per_channel: bool = False):
        nn.Module.__init__(self)
        from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver

        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        with quiet():
            weight_scheme = ({"observer": MovingAveragePerChannelMinMaxObserver, "ch_axis": 0,
                              "qscheme": torch.per_channel_symmetric} if per_channel else
                             {"observer": MovingAverageMinMaxObserver, "qscheme": torch.per_tensor_symmetric})
            self.weight_fake_quant = FakeQuantize(averaging_constant=1.0, quant_min=-128, quant_max=127,
                                                  dtype=torch.qint8, **weight_scheme)
            self.input_fake_quant = FakeQuantize(observer=MovingAverageMinMaxObserver, averaging_constant=1.0,
                                                 quant_min=0, quant_max=127 if reduce_range else 255,
                                                 dtype=torch.quint8, qscheme=torch.per_tensor_affine)
        self.to(linear.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.input_fake_quant(x), self.weight_fake_quant(self.weight), self.bias)


def prepare_fake_quant(model: nn.Module, reduce_range: bool | None = None, per_channel: bool = False) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a :class:`FakeQuantLinear`.

    ``reduce_range``: 7-bit activations; None means torch's choice on its current engine. ``per_channel``:
    one weight scale per output channel (the ONNX export), else one per tensor (torch).
    """
    if reduce_range is None:
        reduce_range = torch.backends.quantized.engine in ("fbgemm", "x86")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, FakeQuantLinear(child, reduce_range, per_channel))
    return model


def strip_fake_quant(model: nn.Module) -> nn.Module:
    """Put plain ``nn.Linear`` layers (the same trained weights) back in place of FakeQuantLinear."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FakeQuantLinear):
                plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                  device=child.weight.device)
                plain.weight, plain.bias = child.weight, child.bias
                setattr(parent, name, plain)
    return model


def fake_quant_per_channel(model: nn.Module, backend: str) -> bool:
    """Whether ``backend``'s int8 export of ``model`` has one weight scale per output channel: ONNX Runtime's
    does unless the model has stacked weights (:func:`~distillery.export.onnx.per_channel_int8`); torch's never."""
    return backend == "onnx-int8" and per_channel_int8(p.shape for p in model.parameters())


def recover_int8(
    model: nn.Module,
    teacher: nn.Module,
    task_data,
    *,
    backend: str = "torch-int8",
    steps: int = 300,
    lr: float = 1e-5,
    batch_size: int = 32,
    kd_weight: float = 0.5,
    temperature: float = 2.0,
    eval_every: int | None = None,
    work_dir: str | os.PathLike,
    seed: int = 42,
) -> tuple[nn.Module, dict[str, Any]]:
    """A short distillation pass with fake-quantized Linears, to win back what int8 loses.

    Loss ``(1 − kd_weight)·task loss + kd_weight·KD(T)`` against the fp32 ``teacher``
    (:func:`distillery.training.losses.distillation_loss`), trained by the one Trainer. The fake quantization follows
    ``backend``: torch's 7-bit activations on its x86/fbgemm engine, ONNX Runtime's 8-bit ones.
    Weights are selected by dev score: of the real torch int8 model (quantize_dynamic of the
    stripped weights) for torch-int8, of the fake-quantized model (ORT's rounding, simulated) for
    onnx-int8, where exporting at every evaluation would cost more than the pass. Returns the fp32
    model (plain Linears) to quantize, and the settings and selection metrics of the pass.
    """
    backend = _checked_backend(backend, model, teacher, task_data)
    kind, main = task_data.task.kind_object, task_data.task.main_metric

    reduce_range = backend == "torch-int8" and torch.backends.quantized.engine in ("fbgemm", "x86")
    per_channel = fake_quant_per_channel(model, backend)
    student = prepare_fake_quant(copy.deepcopy(model).cpu(), reduce_range=reduce_range, per_channel=per_channel).train()
    config = TrainConfig(epochs=1.0, max_steps=int(steps), lr=lr, batch_size=batch_size, warmup_ratio=0.0,
                         eval_every=eval_every or max(1, int(steps) // 3), select_best=True, seed=seed,
                         log_every=max(1, int(steps) // 3))
    work_dir = Path(work_dir)
    shutil.rmtree(work_dir, ignore_errors=True)
    started = time.time()
    try:
        with quiet():
            # the baseline's loss: (1 − α)·task loss + α·KD(T), the teacher run on each batch
            loss_fn = distillation_loss(kind, teacher, kd_weight, temperature)
            trainer = Trainer(student, config, task_data.train, task_data.collate, loss_fn, out_dir=work_dir,
                              eval_fn=partial(_int8_score, backend=backend, task_data=task_data), main_metric=main, desc="int8 recovery")
            teacher.to(trainer.device).eval()
            result = trainer.train()
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    recovered = strip_fake_quant(result.model).cpu().eval()
    info = {
        "backend": backend, "steps": int(steps), "lr": lr, "batch_size": batch_size, "kd_weight": kd_weight,
        "temperature": temperature, "reduce_range": reduce_range, "per_channel": per_channel,
        "teacher": getattr(teacher.config, "_name_or_path", None) or type(teacher).__name__,
        "seconds": round(time.time() - started, 1),
        "selected_step": result.best_step, "selection_metrics": result.best_metrics,
    }
    return recovered, info


def _int8_score(model: nn.Module, *, backend: str, task_data) -> dict[str, float]:
    """Dev scores of the int8 model that ``model`` (with fake-quantized Linears) stands for."""
    if backend == "onnx-int8":
        return score(model, task_data)  # FakeQuantize still rounds in eval mode
    return score(quantize_torch(strip_fake_quant(copy.deepcopy(model).cpu())), task_data)


def _checked_backend(backend: str, model: nn.Module, teacher: nn.Module, task_data) -> str:
    """The int8 backend a recovery pass simulates; refuses what the pass cannot run on."""
    backend = resolve_format(backend)
    if backend not in ("torch-int8", "onnx-int8"):
        raise DistilleryError(f"Recovery is for an int8 backend (torch-int8 or onnx-int8), not {backend!r}.")
    if task_data.train is None:
        raise DistilleryError("Recovery needs the task's training split.")
    if getattr(teacher.config, "vocab_size", None) != getattr(model.config, "vocab_size", None):
        raise DistilleryError("The recovery teacher and the model have different vocabularies; give a teacher with the model's tokenizer.")
    return backend
