"""Score any model on any task: logits over a split (``predict``) and task metrics (``score``).

Models are Hugging Face-style: called with the collated batch, they return outputs with
``.logits`` (classification/regression) or ``.start_logits``/``.end_logits`` (SQuAD).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from distillery.config import DEFAULT_TASK, DataConfig, setting
from distillery.safe_yaml import load_yaml
from distillery.data.encode import TaskData, example_lengths, length_batches, model_inputs, prepare_task_data
from distillery.data.loading import task_for
from distillery.data.tasks import TaskSpec
from distillery.errors import DistilleryError, listed
from distillery.modeling import FINETUNING_TASK, head_of, load_tokenizer, model_folder
from distillery.run_record import CONFIG
from distillery.runtime import load_model



def _output(outputs, name: str, position: int) -> torch.Tensor:
    if hasattr(outputs, name) and getattr(outputs, name) is not None:
        return getattr(outputs, name)
    if isinstance(outputs, dict):
        if name not in outputs:  # a bare encoder (BertModel) returns hidden states, not task outputs
            raise DistilleryError(f"The model has no task head (its outputs have no {name}): it is an "
                                  f"encoder, not a model fine-tuned for the task.")
        return outputs[name]
    return outputs[position]


def check_finite_outputs(chunks: list, task_data: TaskData, split: str) -> None:
    """Refuse NaN or infinite outputs: argmax over them is a guess (a model of NaN weights scores like a coin)."""
    def rows(a: np.ndarray) -> np.ndarray:
        return (~np.isfinite(a)).reshape(len(a), -1).any(axis=1)

    bad = sum(int(np.logical_or.reduce([rows(a) for a in chunk]).sum()) for chunk in chunks)
    if bad:
        raise DistilleryError(f"The model's outputs are not finite (NaN or inf) for {bad} {task_data.task.name} {split} "
                              f"inputs: its weights are damaged or its training diverged, so it is not scored.")


def predict(model, task_data: TaskData, batch_size: int = 128, split: str = "dev", desc: str | None = None):
    """Raw model outputs over ``split`` ("dev" or "train") of ``task_data``, in dataset order.

    Classification: logits (N, num_labels); regression: scores (N,); QA: a tuple
    (start_logits, end_logits), each (n_features, longest window), padded with -1e4.
    The model runs in eval mode under ``torch.inference_mode`` on its own device; its train/eval
    mode is restored afterwards, so the training loop can call this mid-training. ``desc``: show a
    progress bar with this label (a teacher labelling a whole train split takes minutes).
    """
    dataset = {"dev": task_data.dev, "train": task_data.train}.get(split)
    if split not in ("dev", "train"):
        raise DistilleryError(f"predict takes split 'dev' or 'train', got {split!r}.")
    if dataset is None:
        raise DistilleryError(f"The {split} split of task {task_data.task.name} was not prepared.")
    kind = task_data.task.kind_object
    batches = _length_batches(dataset, batch_size)
    loader = DataLoader(dataset, batch_sampler=batches, collate_fn=task_data.collate)
    was_training = model.training
    model.eval()
    chunks: list = []
    try:
        with torch.inference_mode():
            for batch in tqdm(loader, desc=desc, unit="batch", disable=desc is None):
                outputs = model(**model_inputs(batch, model))
                # (batch, labels) logits, or (batch, seq) start and end logits
                fields = kind.output_fields(outputs)
                got = kind.batch_outputs(tuple(_output(outputs, name, i) for i, name in enumerate(fields)), batch)
                chunks.append(tuple(field.float().cpu().numpy() for field in got))
    finally:
        model.train(was_training)
    check_finite_outputs(chunks, task_data, split)
    return _in_dataset_order(chunks, batches, task_data)


def _length_batches(dataset, batch_size: int) -> list[list[int]]:
    """Dataset indices in batches of similar lengths, longest first (a batch that does not fit in
    memory fails at once), so each pads little (on SST-2 sorting alone more than halves the work of
    a pass in file order); in file order when the examples' lengths are unknown."""
    lengths = example_lengths(dataset)
    if lengths is not None:
        return length_batches(lengths.numpy(), batch_size)[::-1]
    n = len(dataset)
    return [list(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]


def _in_dataset_order(chunks: list, batches: list[list[int]], task_data: TaskData):
    """The outputs of each batch of ``batches`` put back into dataset order, as the task's kind assembles them
    (its ``predictions``: logits checked against the task's number of outputs, QA's start and end logits padded
    to the longest window)."""
    order = np.array([i for b in batches for i in b], dtype=np.int64)  # dataset index of each output row
    restore = lambda a: a[np.argsort(order, kind="stable")]  # noqa: E731
    return task_data.task.kind_object.predictions(chunks, restore, task_data.task)


def score(model, task_data: TaskData, batch_size: int = 128) -> dict[str, float]:
    """The task's metrics for ``model`` on the prepared dev split; always holds ``task.main_metric``."""
    task = task_data.task
    if task_data.dev is None:
        raise DistilleryError(f"No dev split of task {task.name} was prepared, so there is nothing to score.")
    metrics = task.kind_object.scores(task_data, predict(model, task_data, batch_size=batch_size))
    if task.main_metric not in metrics:  # a bug: TaskSpec refuses a main metric its kind does not always give
        raise RuntimeError(f"metrics for {task.name} lack the main metric {task.main_metric}: {sorted(metrics)}")
    return metrics


def chance_score(task_data: TaskData) -> dict[str, Any] | None:
    """The main metric of a model that learned nothing, on the prepared dev split, and how far above it a
    real score must be to count: always the train split's most frequent class (classification; on MRPC's
    F1 that is far from zero), a constant (regression: correlation 0). ``margin``: two standard errors of
    the metric at this dev size (1/√n for a rate, 2/√n for a correlation). None for SQuAD, whose spans have
    no constant answer, and without labels."""
    task = task_data.task
    chance = None if task_data.dev is None or task_data.train is None else task.kind_object.chance(task_data)
    if chance is None:
        return None
    kind = task.kind_object
    n = kind.dev_size(task_data)
    if n == 0:
        return None
    predictions, what = chance
    value = kind.chance_scores(task_data, predictions)[task.main_metric]
    width = 2.0 if task.main_metric in ("pearson", "spearman", "mcc") else 1.0
    return {"main": value, "margin": width / float(np.sqrt(n)), "predictor": what}


def _model_label_order(spec, model, source):
    """A custom task's classes in the order of the model's head: the labels a model trained here
    carries (its ``id2label``), which the file's own labels may be fewer of. A model with generic
    names (LABEL_0, ...) keeps the file's sorted order, the order training uses."""
    import dataclasses

    id2label = getattr(getattr(model, "config", None), "id2label", None) or {}
    labels = tuple(str(id2label[i]) for i in sorted(id2label))
    if not labels or all(label == f"LABEL_{i}" for i, label in enumerate(labels)):
        return spec
    unknown = [label for label in spec.labels if label not in labels]
    if unknown:
        raise DistilleryError(f"{source} has label(s) {listed(map(repr, unknown))} that the model was not trained "
                              f"on (its labels: {listed(labels)}).")
    return dataclasses.replace(spec, labels=labels)


def trained_task(folder: Path) -> tuple[str, str] | None:
    """The task the model saved in ``folder`` was trained for, and what says so: its config.json's
    ``finetuning_task`` (every model distillery trains for a task records it), else the run folder it is the
    student of (``RUN/student`` beside ``RUN/config.yaml``: a run older than that key). None for any other model."""
    recorded = json.loads((folder / "config.json").read_text()).get(FINETUNING_TASK)
    if isinstance(recorded, str) and recorded:
        return recorded, f"{folder / 'config.json'} records it"
    run_config = folder.parent / CONFIG
    if folder.name == "student" and run_config.is_file():
        with contextlib.suppress(OSError, ValueError, yaml.YAMLError):  # an unreadable run records nothing
            task = setting(load_yaml(run_config.read_text()) or {}, "data.task")
            if isinstance(task, str) and task:
                return task, f"its run's {run_config} says so"
    return None


def check_trained_task(folder: Path, config, spec: TaskSpec, other_task: bool = False) -> None:
    """Refuse to score the model saved in ``folder`` (its loaded ``config``) on ``spec`` when it was trained for
    another task (an SST-2 student on MRPC scores an F1 that means nothing); ``other_task`` allows it where the
    heads have the same shape (as many outputs). Task custom is left to the label check: its classes are named."""
    trained = trained_task(folder)
    if trained is None or trained[0] == spec.name or spec.name == "custom":
        return
    head, outputs = head_of(config), int(getattr(config, "num_labels", 0) or 0)
    qa = head.name == "question-answering"
    regression = outputs == 1 or getattr(config, "problem_type", None) == "regression"
    labels = ", ".join(str(config.id2label[i]) for i in sorted(getattr(config, "id2label", None) or {}))
    what = "tags" if head.name == "token-classification" else "labels"
    mine = "answer spans" if qa else "a regression head" if regression else f"{what} {labels}"
    theirs = spec.kind_object.head_words(spec)
    # the same head (a tagger is no sentence classifier, whatever its width) with as many outputs
    same_shape = head is spec.kind_object.head and (qa or outputs == spec.num_labels)
    if other_task and same_shape:
        return
    task, source = trained
    other = ", another head" if head is not spec.kind_object.head else ", another number of outputs"
    asked = f"--task {spec.name} has {theirs}" + ("" if same_shape else other)
    allow = f", or add --other-task to score it on {spec.name} all the same" if same_shape else ""
    raise DistilleryError(f"{folder} was trained for {task} ({source}) with {mine}, and {asked}: its scores there "
                          f"would mean nothing. Give --task {task}{allow}.")


def evaluate(
    model,
    task=None,
    *,
    tokenizer=None,
    data_dir: str | None = None,
    split: str = "dev",
    max_length: int = 128,
    batch_size: int = 128,
    other_task: bool = False,
    **data_options,
) -> dict:
    """Score ``model`` (a model object, a saved model folder or a run folder) on ``task``'s dev split.

    ``task`` is a task name or a TaskSpec; None: the task a saved model was trained for
    (:func:`trained_task`), else sst2. A saved model is scored on another task than its own only with
    ``other_task`` (:func:`check_trained_task`). ``data_options`` are further DataConfig fields
    (``squad_holdout``, ``dev_limit``, custom-data columns and files, ...). A model object needs its
    ``tokenizer``; a folder brings its own. Returns ``{"task", "split", "main_metric", "examples",
    "metrics"}``.
    """
    folder = None
    if isinstance(model, (str, Path)):
        folder = model_folder(model)
        model = load_model(folder)  # first: a bad config.json is named as such, not as a tokenizer problem
        if tokenizer is None:
            tokenizer = load_tokenizer(str(folder))
    elif tokenizer is None:
        raise DistilleryError("evaluate() needs the tokenizer when it is given a model object.")
    if task is None:  # the model's own task, where it records one
        trained = trained_task(folder) if folder is not None else None
        task = trained[0] if trained else DEFAULT_TASK
    options = {k: v for k, v in data_options.items() if v is not None}
    name = task.name if isinstance(task, TaskSpec) else task
    data_config = DataConfig(task=name, data_dir=data_dir, max_length=max_length, **options)
    spec = task if isinstance(task, TaskSpec) else task_for(data_config)
    if folder is not None:
        check_trained_task(folder, model.config, spec, other_task)
    spec.kind_object.settle_data(f"The model {folder or type(model).__name__}", folder, data_config,
                                 getattr(model, "config", None))  # read as it computes (an embedder's pooling)
    if split not in ("dev", *spec.dev_splits):
        raise DistilleryError(f"--split {split}: eval scores one of the dev splits of task {spec.name} "
                              f"({', '.join(dict.fromkeys(('dev', *spec.dev_splits)))}), not the train split or "
                              f"another one.")
    if spec.name == "custom" and spec.labels and not isinstance(task, TaskSpec):  # a custom task with classes
        spec = _model_label_order(spec, model, data_config.dev_file or data_config.train_file)
    task_data = prepare_task_data(spec, tokenizer, data_config, splits=(split,))
    return {
        "task": spec.name,
        # custom data: the file scored, which may be a test set, not a split named "dev"
        "split": str(data_config.dev_file) if spec.name == "custom" and data_config.dev_file else task_data.dev_split,
        "main_metric": spec.main_metric,
        "examples": len(task_data.dev_examples),
        "metrics": score(model, task_data, batch_size=batch_size),
    }
