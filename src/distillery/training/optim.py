"""The optimizer of the training loop: AdamW over the model and the extra parameters a loss trains,
with a linear warm-up and decay."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from transformers import get_linear_schedule_with_warmup

from distillery.config import TrainConfig


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or "norm" in type(module).__name__.lower()


def flatten_extra(extra: Iterable[nn.Module | nn.Parameter]) -> tuple[list[nn.Module], list[nn.Parameter]]:
    modules: list[nn.Module] = []
    params: list[nn.Parameter] = []
    for item in extra:
        if isinstance(item, nn.Module):
            modules.append(item)
            params.extend(item.parameters())
        elif isinstance(item, Tensor):
            params.append(item)
        else:
            raise TypeError(f"extra_parameters takes modules and parameters, got {type(item).__name__}.")
    return modules, params


def trained_parameters(model: nn.Module, extra_params: list[nn.Parameter]) -> list[nn.Parameter]:
    """The parameters the optimizer updates, each once (tied weights are one parameter)."""
    seen: set[int] = set()
    params = []
    for p in [*model.parameters(), *extra_params]:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    return params


def param_groups(
    model: nn.Module, extra_modules: list[nn.Module], extra_params: list[nn.Parameter], weight_decay: float
) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on weights, none on biases and normalisation weights."""
    no_decay: set[int] = set()
    for root in (model, *extra_modules):
        for module in root.modules():
            norm = _is_norm(module)
            for name, p in module.named_parameters(recurse=False):
                if norm or name == "bias":
                    no_decay.add(id(p))
    decay_params: list[nn.Parameter] = []
    plain_params: list[nn.Parameter] = []
    for p in trained_parameters(model, extra_params):
        # a bare extra parameter with one dimension is a bias or a scale
        if id(p) in no_decay or p.ndim < 2:
            plain_params.append(p)
        else:
            decay_params.append(p)
    groups = [
        {"params": decay_params, "weight_decay": weight_decay},
        {"params": plain_params, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def schedule_lengths(num_batches: int, config: TrainConfig) -> tuple[int, int, int]:
    """(optimizer steps per epoch, total optimizer steps, number of epochs to iterate)."""
    steps_per_epoch = math.ceil(num_batches / config.grad_accum)
    if config.max_steps:
        total = int(config.max_steps)
    else:
        total = max(1, math.ceil(config.epochs * steps_per_epoch))
    return steps_per_epoch, total, math.ceil(total / steps_per_epoch)


def optimizer_and_schedule(model: nn.Module, extra_modules: list[nn.Module], extra_params: list[nn.Parameter],
                           config: TrainConfig, device: torch.device, total_steps: int) -> tuple[Any, Any]:
    groups = param_groups(model, extra_modules, extra_params, config.weight_decay)
    # The fused kernel: one pass per parameter instead of a dozen (on a 2-core CPU, a 37M-parameter
    # CMOW step spends 13 ms in the optimizer against 161 unfused); same update, fp32/16 CPU and CUDA only.
    fused = device.type in ("cpu", "cuda") and all(
        p.is_floating_point() for g in groups for p in g["params"])
    optimizer = torch.optim.AdamW(groups, lr=config.lr, fused=fused or None)
    scheduler = get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=math.ceil(config.warmup_ratio * total_steps), num_training_steps=total_steps
    )
    return optimizer, scheduler
