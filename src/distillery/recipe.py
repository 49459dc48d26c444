"""What the pipeline hands to a compression method, and the registry of methods.

A method is a module with ``run(ctx: MethodContext) -> PreTrainedModel``, which builds a student from
``ctx.teacher`` and trains it with the one trainer, and optionally ``check(config, teacher_config)``,
which rejects impossible options before minutes are spent fine-tuning the teacher,
``budget_overrides(budget, task)`` (nested settings the method changes in a budget's defaults) and
``preset_overrides(name, task)`` (dotted settings of a named preset, e.g. a paper's table). The pipeline does everything around it
(data, teacher, evaluation, benchmark, saving, report), so a method holds only what its paper adds.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from transformers import PreTrainedModel

from distillery.config import RunConfig
from distillery.data.encode import TaskData, content_digest
from distillery.errors import DistilleryError

# name -> module. Imported lazily so a method's extra dependencies load only when used.
METHODS: dict[str, str] = {
    "distill": "distillery.baseline",
    "moebert": "distillery.moebert.recipe",
    "cmow": "distillery.cmow.recipe",
    "autotinybert": "distillery.autotinybert.recipe",
}


@dataclass
class MethodContext:
    config: RunConfig
    teacher: PreTrainedModel  # fine-tuned on the task, eval mode
    tokenizer: Any
    task_data: TaskData  # encoded train/dev of the task, with the teacher's tokenizer
    out_dir: Path  # the run folder; the trainer keeps its checkpoints in out_dir/"checkpoints"
    resume: bool = False
    notes: list[str] = field(default_factory=list)  # lines a method wants in the report

    @property
    def options(self) -> dict[str, Any]:
        return self.config.method_options

    def train(self, student: PreTrainedModel, loss_fn, *, desc: str, train_dataset=None, collate_fn=None) -> PreTrainedModel:
        """Train ``student`` with the one trainer and return it: the task's train split (or
        ``train_dataset`` / ``collate_fn``), the student settings, checkpoints in the run folder,
        dev scored with the task's main metric at each evaluation; the teacher follows the student
        to the trainer's device."""
        # Imported here: the trainer and evaluation sit to the right of the methods in the data flow.
        from distillery.distill.trainer import Trainer
        from distillery.evaluation import score

        cfg = self.config.student
        trainer = Trainer(
            student,
            cfg,
            self.task_data.train if train_dataset is None else train_dataset,
            collate_fn or self.task_data.collate,
            loss_fn,
            out_dir=self.out_dir,
            eval_fn=lambda m: score(m, self.task_data, batch_size=cfg.eval_batch_size),
            main_metric=self.task_data.task.main_metric,
            resume=self.resume,
            desc=desc,
        )
        self.teacher.to(trainer.device)
        return trainer.train().model

    def train_with_teacher_logits(self, task_data: TaskData | None = None):
        """The train split plus a ``teacher_logits`` column (classification: logits; regression: the
        score), computed once per teacher and data: cached under ``$DISTILLERY_CACHE/logits`` by a
        hash of the teacher's weights and the encoded train split, so a second student of the same
        task (another method, an ablation, a resumed run) does not pay the teacher's passes again.
        ``task_data``: another encoding of the task to label (default the run's)."""
        import hashlib

        import numpy as np
        import torch

        from distillery.evaluation import predict
        from distillery.teacher import cache_root

        task_data = task_data or self.task_data
        train = task_data.train
        digest = hashlib.sha256()
        for name, tensor in sorted(self.teacher.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        digest.update(content_digest(train).encode())
        path = cache_root() / "logits" / f"{task_data.task.name}-{digest.hexdigest()[:16]}.npy"
        if path.is_file():
            logits = np.load(path)
        else:
            logits = predict(self.teacher, task_data, batch_size=self.config.student.eval_batch_size, split="train")
            logits = np.asarray(logits, dtype=np.float32).reshape(len(train), -1)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, logits)
            tmp.replace(path)  # atomic: a killed run leaves no half-written cache entry
        if logits.shape[0] != len(train):
            raise DistilleryError(f"Cached teacher logits {path} have {logits.shape[0]} rows for {len(train)} examples; delete the file.")
        return train.add_column("teacher_logits", logits.tolist())


def get_method(name: str) -> ModuleType:
    """The method's module (with ``run`` and maybe ``check``)."""
    if name not in METHODS:
        raise DistilleryError(f"Unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}.")
    return importlib.import_module(METHODS[name])
