"""Distillation building blocks shared by every method: the KD losses and the one training loop."""

from distillery.training.losses import (
    HiddenProjection,
    hidden_mse,
    kl_divergence,
    mse,
    prediction_distillation,
    soft_cross_entropy,
    symmetric_kl,
    task_loss,
)
from distillery.training.checkpoint import find_checkpoint
from distillery.training.trainer import TrainResult, Trainer

__all__ = [
    "HiddenProjection",
    "TrainResult",
    "Trainer",
    "find_checkpoint",
    "hidden_mse",
    "kl_divergence",
    "mse",
    "prediction_distillation",
    "soft_cross_entropy",
    "symmetric_kl",
    "task_loss",
]
