"""Checkpoints of the training loop: what is saved, how it is written atomically, how it is read back.

A checkpoint holds weights, optimizer, scheduler, RNG states and the data position, so a run
stopped and resumed ends with the same weights as one that never stopped. The Trainer decides when
to save; this module decides what a checkpoint is.

Layout (under ``out_dir/checkpoints/``)::

    last/                           written atomically at each evaluation, each epoch end, the end
      model.safetensors             the unwrapped model's state dict (tied tensors stored once)
      extra_parameters.safetensors  the Trainer's ``extra_parameters`` ("0", "1", ... in order)
      optimizer.pt, scheduler.pt    state dicts (``torch.load(..., weights_only=True)``)
      rng_state_<rank>.pt           python, numpy, torch (and CUDA) RNG states of each process
      trainer_state.json            step, epoch, batch within the epoch, best metric, history (TrainerState)
    best/                           the weights with the best main metric so far
      model.safetensors
      best.json                     step and metrics

Each folder is written into a temporary sibling that every process can name, every file fsynced,
then renamed into place with the previous version kept as ``<name>.old`` until then
(:func:`distillery.folders.atomic_folder`); a crash at any moment leaves a complete ``<name>`` or
``<name>.old``, and the readers take the first. A full disk or a read-only folder is the same: the
write stops with a sentence (:func:`distillery.folders.writing`), and ``--resume`` continues from
the complete one once there is space.

Distribution is data parallel (DDP) only: optimizer state is replicated, and the main process
writes it. Checkpoints of sharded optimizers (FSDP, DeepSpeed) are not supported.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import math
import os
import pickle
import random
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from torch import nn

from distillery.config import TrainConfig
from distillery.errors import DistilleryError
from distillery.folders import atomic_folder, fsync_file, previous_version, shared_sibling, writing

logger = logging.getLogger("distillery")

CHECKPOINTS_DIR = "checkpoints"
LAST, BEST = "last", "best"
MODEL_FILE = "model.safetensors"
EXTRA_FILE = "extra_parameters.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
STATE_FILE = "trainer_state.json"
BEST_FILE = "best.json"
STATE_FORMAT = 1


# ----------------------------------------------------------------------------------------------
# RNG state


def _rng_state() -> dict[str, Any]:
    """The global RNG states as tensors and plain values (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npst = state["numpy"]
    np.random.set_state(
        (npst["kind"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def preserved_rng(cuda: bool = True) -> Iterator[None]:
    """Whatever runs inside leaves the python, numpy and torch generators where they were."""
    py, npst, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if cuda and torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npst)
        torch.set_rng_state(cpu)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


# ----------------------------------------------------------------------------------------------
# Files


def complete_checkpoints(out_dir: str | os.PathLike, name: str = LAST) -> list[Path]:
    """The complete folders among ``out_dir/checkpoints/<name>`` and its previous version, newest first."""
    root = Path(out_dir) / CHECKPOINTS_DIR
    marker = STATE_FILE if name == LAST else BEST_FILE
    return [c for c in (root / name, previous_version(root / name)) if (c / marker).is_file()]


def find_checkpoint(out_dir: str | os.PathLike, name: str = LAST) -> Path | None:
    """The complete checkpoint folder ``out_dir/checkpoints/<name>``, or its previous version, or None."""
    return next(iter(complete_checkpoints(out_dir, name)), None)


class CorruptCheckpoint(DistilleryError):
    """A checkpoint file that cannot be read (truncated by a full disk, a copy cut short, ...)."""


# What the readers raise on a truncated or garbled file: safetensors' own error, torch.load's zip and
# unpickling errors, json's ValueError.
_UNREADABLE = (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError, safetensors.SafetensorError)


def _read(path: Path, reader: Callable[[Path], Any]) -> Any:
    try:
        return reader(path)
    except _UNREADABLE as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CorruptCheckpoint(f"The checkpoint file {path} is corrupt ({detail}).") from None


def _torch_load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def _save_weights(model: nn.Module, path: Path) -> None:
    # save_model stores tensors shared between names (tied embeddings) once
    safetensors.torch.save_model(model, str(path), metadata={"format": "pt"})
    fsync_file(path)


def _load_weights(model: nn.Module, path: Path) -> None:
    try:
        safetensors.torch.load_model(model, str(path), strict=True)
    except (safetensors.SafetensorError, OSError) as e:
        raise CorruptCheckpoint(f"The checkpoint file {path} is corrupt ({e}).") from None
    except RuntimeError as e:
        raise DistilleryError(f"The weights in {path} do not fit this model: {e}") from None


def _torch_save(obj: Any, path: Path) -> None:
    torch.save(obj, path)
    fsync_file(path)


def _write_json(obj: Any, path: Path) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def json_float(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


# ----------------------------------------------------------------------------------------------
# last: everything a resume needs

# What a checkpoint must have been written with to be resumed: the same data order and schedule.
MUST_MATCH = ("num_examples", "batch_size", "grad_accum", "seed")


@dataclass(kw_only=True)
class TrainerState:
    """What the Trainer keeps between steps and writes to ``trainer_state.json``: where the run is,
    what it has seen, its best metric and history, and the settings a resume must share. The fields
    are in the file's order."""

    format: int = STATE_FORMAT
    desc: str
    global_step: int = 0
    total_steps: int
    epoch: int = 0
    batch_in_epoch: int = 0
    examples_seen: int = 0
    seconds: float = 0.0  # training time over all sessions of the run
    best_metric: float | None = None
    best_step: int | None = None
    best_metrics: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per evaluation point
    # the loss running means since the last log line and the last evaluation (``_Window.to_dict``)
    log_window: dict[str, Any] | None = None
    eval_window: dict[str, Any] | None = None
    main_metric: str | None
    greater_is_better: bool
    num_examples: int
    batch_size: int
    grad_accum: int
    seed: int
    num_processes: int
    stopped_early: bool = False  # in the file only once true

    @classmethod
    def fresh(cls, *, desc: str, total_steps: int, main_metric: str | None, greater_is_better: bool,
              num_examples: int, config: TrainConfig, num_processes: int) -> TrainerState:
        """The state at step 0 of a run with these settings."""
        return cls(desc=desc, total_steps=total_steps, main_metric=main_metric, greater_is_better=greater_is_better,
                   num_examples=num_examples, batch_size=config.batch_size, grad_accum=config.grad_accum,
                   seed=config.seed, num_processes=num_processes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``trainer_state.json`` (a non-finite best metric written as null)."""
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        out["best_metric"] = json_float(self.best_metric)
        if not self.stopped_early:
            del out["stopped_early"]
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str | os.PathLike) -> TrainerState:
        """The state a ``trainer_state.json`` holds; a missing field or one of the wrong type is a
        :class:`CorruptCheckpoint` naming ``source``."""
        def corrupt(why: str) -> CorruptCheckpoint:
            return CorruptCheckpoint(f"The checkpoint file {source} is corrupt: {why}.")

        if not isinstance(data, Mapping):
            raise corrupt("it holds no trainer state")
        values = {}
        for f in fields(cls):
            if f.name not in data:
                if f.name != "stopped_early":  # every other field is written from step 0 on
                    raise corrupt(f"it has no {f.name}")
                continue
            value, kinds = data[f.name], _field_kinds()[f.name]
            if not any(_is_kind(value, kind) for kind in kinds):
                raise corrupt(f"its {f.name} is {value!r}, not {' or '.join(_KIND_NAMES[k] for k in kinds)}")
            values[f.name] = float(value) if float in kinds and isinstance(value, int) else copy.deepcopy(value)
        for name in ("log_window", "eval_window"):
            window = values.get(name)
            if window is not None and not (_is_kind(window.get("n"), int) and _is_kind(window.get("loss"), float)
                                           and isinstance(window.get("parts"), dict)):
                raise corrupt(f"its {name} is {window!r}, not a running mean (n, loss, parts)")
        return cls(**values)


_KIND_NAMES = {int: "a whole number", float: "a number", str: "a string", bool: "true or false", dict: "an object",
               list: "a list", None: "null"}


@functools.cache
def _field_kinds() -> dict[str, tuple[type | None, ...]]:
    """Each TrainerState field's accepted JSON kinds, read from its annotation (``dict[str, Any] | None``:
    dict or None)."""
    kinds = {}
    for name, annotation in typing.get_type_hints(TrainerState).items():
        options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
        kinds[name] = tuple(None if a is type(None) else (typing.get_origin(a) or a) for a in options)
    return kinds


def _is_kind(value: Any, kind: type | None) -> bool:
    if kind is None:
        return value is None
    if kind is bool or isinstance(value, bool):  # JSON's true is no number, and 1 is no boolean
        return kind is bool and isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def save_last(acc: Any, root: Path, model: nn.Module, optimizer: Any, scheduler: Any, state: TrainerState,
              extra_params: Sequence[nn.Parameter]) -> None:
    """Write ``root/last`` atomically; every process calls it (each saves its own RNG state)."""
    final = root / LAST
    tmp = shared_sibling(final)
    into = atomic_folder(final, existing="old", tmp=tmp, durable=True) if acc.is_main_process \
        else contextlib.nullcontext(tmp)
    with writing(final, "a checkpoint"), into:
        acc.wait_for_everyone()  # the main process has emptied tmp
        _torch_save(_rng_state(), tmp / f"rng_state_{acc.process_index}.pt")
        if acc.is_main_process:
            _save_weights(acc.unwrap_model(model), tmp / MODEL_FILE)
            if extra_params:
                tensors = {str(i): p.detach().to("cpu", copy=True).contiguous() for i, p in enumerate(extra_params)}
                safetensors.torch.save_file(tensors, str(tmp / EXTRA_FILE), metadata={"format": "pt"})
                fsync_file(tmp / EXTRA_FILE)
            _torch_save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
            _torch_save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
            _write_json(state.to_dict(), tmp / STATE_FILE)  # last: its presence marks a complete folder
        acc.wait_for_everyone()  # every process's RNG state is in tmp before it is renamed
    acc.wait_for_everyone()


def load_last(acc: Any, ckpt: Path, model: nn.Module, optimizer: Any, scheduler: Any, *,
              fresh: TrainerState, extra_params: Sequence[nn.Parameter], desc: str) -> TrainerState:
    """Restore model, extra parameters, optimizer, scheduler and RNG states from ``ckpt``; return its
    trainer state. ``fresh``: this run's state at step 0, whose settings the checkpoint must share."""
    raw = _read(ckpt / STATE_FILE, lambda p: json.loads(p.read_text()))
    if not isinstance(raw, Mapping) or "format" not in raw:
        raise CorruptCheckpoint(f"The checkpoint file {ckpt / STATE_FILE} is corrupt: it has no format.")
    # every file is read before any is applied: a corrupt one leaves model and optimizer untouched
    optimizer_state = _read(ckpt / OPTIMIZER_FILE, _torch_load)
    scheduler_state = _read(ckpt / SCHEDULER_FILE, _torch_load)
    rng_file = ckpt / f"rng_state_{acc.process_index}.pt"
    rng = _read(rng_file, _torch_load) if rng_file.is_file() else None
    if raw["format"] != STATE_FORMAT:
        raise DistilleryError(f"{ckpt} was written by another version of distillery and cannot be resumed.")
    state = TrainerState.from_dict(raw, ckpt / STATE_FILE)
    total_steps = fresh.total_steps
    differing = [f"{k} {getattr(state, k)} (now {getattr(fresh, k)})" for k in MUST_MATCH
                 if getattr(state, k) != getattr(fresh, k)]
    if differing:
        raise DistilleryError(
            f"Cannot resume from {ckpt}: it was written with {', '.join(differing)}; "
            f"use the same data and settings, or a new output folder."
        )
    if state.total_steps != total_steps:
        logger.warning(
            f"{desc}: the checkpoint planned {state.total_steps} steps, this run plans {total_steps}; "
            f"the learning-rate schedule follows the new plan."
        )
        state.total_steps = total_steps

    _load_weights(acc.unwrap_model(model), ckpt / MODEL_FILE)
    if extra_params:
        if not (ckpt / EXTRA_FILE).is_file():
            raise DistilleryError(f"{ckpt} has no {EXTRA_FILE}, but this run trains extra parameters.")
        tensors = _read(ckpt / EXTRA_FILE, lambda p: safetensors.torch.load_file(str(p)))
        if len(tensors) != len(extra_params):
            raise DistilleryError(f"{ckpt} holds {len(tensors)} extra parameters, this run trains {len(extra_params)}.")
        with torch.no_grad():
            for i, p in enumerate(extra_params):
                p.copy_(tensors[str(i)])
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    if rng is not None:
        _set_rng_state(rng)
    else:
        logger.warning(f"{desc}: no RNG state for process {acc.process_index} in {ckpt}; dropout will differ.")
    if acc.is_main_process:
        logger.info(
            f"{desc}: resumed from {ckpt} at step {state.global_step} "
            f"(epoch {state.epoch + 1}, batch {state.batch_in_epoch})."
        )
    return state


def resume_last(acc: Any, out_dir: Path, model: nn.Module, optimizer: Any, scheduler: Any, *,
                fresh: TrainerState, extra_params: Sequence[nn.Parameter], desc: str) -> TrainerState | None:
    """The trainer state of the newest readable ``last`` checkpoint, everything else restored from it
    as :func:`load_last` does; None when there is none."""
    candidates = complete_checkpoints(out_dir, LAST)
    if not candidates and acc.is_main_process:
        logger.info(f"{desc}: no checkpoint in {out_dir / CHECKPOINTS_DIR}, starting from scratch.")
    for i, ckpt in enumerate(candidates):
        try:
            return load_last(acc, ckpt, model, optimizer, scheduler, fresh=fresh, extra_params=extra_params, desc=desc)
        except CorruptCheckpoint as e:
            if i + 1 == len(candidates):
                raise CorruptCheckpoint(f"{e} No complete earlier checkpoint is left: delete {ckpt} "
                                        f"to start over.") from None
            # every file of the previous version is read again, so nothing of the bad one remains
            logger.warning(f"{desc}: {e} Resuming from the previous checkpoint {candidates[i + 1]}.")
    return None


# ----------------------------------------------------------------------------------------------
# best: the weights with the best main metric


def save_best(root: Path, model: nn.Module, step: int, main_metric: str, metrics: Mapping[str, Any]) -> None:
    """Write ``root/best`` atomically (the main process only)."""
    final = root / BEST
    with writing(final, "the best weights (a checkpoint)"), \
            atomic_folder(final, existing="old", tmp=shared_sibling(final), durable=True) as tmp:
        _save_weights(model, tmp / MODEL_FILE)
        _write_json({"step": step, "main_metric": main_metric, "metrics": metrics}, tmp / BEST_FILE)


def load_best(out_dir: Path, model: nn.Module, step: int, desc: str) -> bool:
    """Load the saved best weights into ``model``; False (with a warning) when there are none."""
    best = find_checkpoint(out_dir, BEST)
    if best is None:
        logger.warning(f"{desc}: the best weights are missing from {out_dir / CHECKPOINTS_DIR}; keeping the last.")
        return False
    recorded = json.loads((best / BEST_FILE).read_text()).get("step")
    if recorded != step:
        logger.warning(f"{desc}: {best} holds step {recorded}, the run recorded step {step} as best.")
    _load_weights(model, best / MODEL_FILE)
    return True
