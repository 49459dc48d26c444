"""The one training loop: teacher fine-tuning, the baseline and every method train through it.

``Trainer`` wraps ``accelerate.Accelerator`` so that the same code runs on a CPU, one GPU, or many
processes (``accelerate launch`` / ``torchrun``). A method only supplies ``loss_fn(model, batch)``
(and optionally ``eval_fn(model)``); data order, optimisation, evaluation, best-weight selection,
checkpoints and exact resume live here, once.

Reproducibility contract
  - The batches of each step are a pure function of (seed, epoch, batch index)
    (``distillery.training.data_order``); evaluation does not advance the global generators either,
    so they drive only the model (dropout).
  - A checkpoint (``distillery.training.checkpoint``) holds weights, optimizer, scheduler, RNG
    states and the data position, so a run stopped and resumed ends with the same weights as one
    that never stopped.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration, broadcast_object_list, set_seed
from torch import Tensor, nn
from torch.utils.data import default_collate
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from distillery.config import TrainConfig
from distillery.training.checkpoint import (
    CHECKPOINTS_DIR,
    LAST,
    TrainerState,
    find_checkpoint,
    json_float,
    load_best,
    preserved_rng,
    resume_last,
    save_best,
    save_last,
)
from distillery.training.data_order import EpochSampler, SeededCollate, train_loader
from distillery.training.optim import flatten_extra, optimizer_and_schedule, schedule_lengths, trained_parameters
from distillery.errors import DistilleryError
from distillery.folders import record

logger = logging.getLogger("distillery")

LossOutput = Tensor | tuple[Tensor, Mapping[str, float]]


@dataclass
class TrainResult:
    """What ``Trainer.train`` returns.

    ``seconds`` is the training time over all sessions of the run (a resumed run adds to it);
    ``examples_per_s`` is measured over this session only.
    """

    model: nn.Module  # unwrapped; the best weights when select_best and an eval_fn were given
    best_metrics: dict[str, float]
    history: list[dict[str, Any]]  # one entry per evaluation point: step, epoch, loss, lr, metrics
    global_step: int
    seconds: float
    examples_per_s: float
    best_step: int | None = None
    checkpoint_dir: Path | None = None


def _metrics_to_floats(metrics: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        if isinstance(v, Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, (bool, str)) or v is None:
            out[str(k)] = v
        else:
            try:
                out[str(k)] = float(v)
            except (TypeError, ValueError):
                continue  # nested or non-numeric values are the caller's to keep
    return out


# ----------------------------------------------------------------------------------------------
# Trainer


class Trainer:
    """Train ``model`` on ``train_dataset`` by minimising ``loss_fn``.

    Args:
        model: a ``torch.nn.Module`` (usually a ``PreTrainedModel``), trained in place.
        config: the loop's settings (:class:`distillery.config.TrainConfig`).
        train_dataset: a map-style dataset (``datasets.Dataset``, a list, ...).
        collate_fn: turns a list of examples into a batch (a dict of tensors, usually). Any key it
            produces reaches ``loss_fn`` untouched, moved to the device when it is a tensor.
        loss_fn: ``loss_fn(model, batch) -> loss`` or ``(loss, {name: float})``; the extra numbers
            are averaged and logged. ``model`` is the prepared model (a DDP wrapper when
            distributed): call it, and read attributes from ``trainer.model`` instead.
        out_dir: the run folder; checkpoints go to ``out_dir/checkpoints/``.
        eval_fn: ``eval_fn(model) -> {metric: value}``, called on the main process only, with the
            unwrapped model in eval mode under ``torch.no_grad()``.
        main_metric: the metric that selects the best weights (required with ``eval_fn``).
        greater_is_better: whether a larger ``main_metric`` is better.
        resume: continue from ``out_dir/checkpoints/last`` if it exists (fresh start otherwise).
        extra_parameters: modules or parameters used inside ``loss_fn`` and trained with the model
            (a :class:`~distillery.training.losses.HiddenProjection`, say); they are checkpointed.
        desc: the run's name in the progress bar, the log and TensorBoard.
        checkpoint_every: also write ``last`` every this many optimizer steps.
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        train_dataset: Any,
        collate_fn: Callable[[list], Any] | None,
        loss_fn: Callable[[nn.Module, Any], LossOutput],
        *,
        out_dir: str | os.PathLike,
        eval_fn: Callable[[nn.Module], Mapping[str, float]] | None = None,
        main_metric: str | None = None,
        greater_is_better: bool = True,
        resume: bool = False,
        extra_parameters: Iterable[nn.Module | nn.Parameter] = (),
        desc: str = "train",
        checkpoint_every: int | None = None,
    ):
        self.num_examples = _checked_arguments(model, config, train_dataset, eval_fn, main_metric, checkpoint_every)
        self.model = model
        self.config = config
        self.train_dataset = train_dataset
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        self.loss_fn = loss_fn
        self.out_dir = Path(out_dir)
        self.checkpoint_root = self.out_dir / CHECKPOINTS_DIR
        self.eval_fn = eval_fn
        self.main_metric = main_metric
        self.greater_is_better = greater_is_better
        self.resume = resume
        self.extra_modules, self.extra_params = flatten_extra(extra_parameters)
        self.desc = desc
        self.checkpoint_every = checkpoint_every
        self.accelerator = _accelerator(config, self.out_dir)
        self._best_state: dict[str, Tensor] | None = None

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    # -- the loop ------------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Train to the end of the schedule (resuming first when asked); return the trained model."""
        # log lines go through tqdm.write, so they print above the progress bar instead of into it
        with logging_redirect_tqdm():  # the root logger's console handlers
            return self._train()

    def _train(self) -> TrainResult:
        run = self._setup()
        acc = self.accelerator
        active_loader = None
        try:
            start_epoch = run.state.epoch
            for epoch in range(start_epoch, run.num_epochs):
                if run.state.global_step >= run.total_steps:
                    break
                skip = run.state.batch_in_epoch if epoch == start_epoch else 0
                run.sampler.epoch = epoch
                run.collate.start(epoch, skip)
                active_loader = acc.skip_first_batches(run.loader, skip) if skip else run.loader
                if self._train_epoch(run, active_loader, epoch, skip):
                    break
                self._release(active_loader)
                active_loader = None
        except KeyboardInterrupt:
            ckpt = find_checkpoint(self.out_dir, LAST)
            self._info(f"{self.desc}: interrupted; resume from {ckpt}." if ckpt else f"{self.desc}: interrupted.")
            raise
        finally:
            self._release(active_loader)
            run.progress.close()
            if self.config.tensorboard:
                acc.end_training()
                record(self.out_dir / "tb")
        return self._finish(run)

    def _setup(self) -> "_Session":
        """Seed, build the data loader, optimizer and schedule, prepare them, restore a checkpoint."""
        cfg, acc = self.config, self.accelerator
        set_seed(cfg.seed)
        self._best_state = None

        loader, sampler, collate = train_loader(self.train_dataset, self.collate_fn, cfg)
        num_batches = len(loader)
        steps_per_epoch, total_steps, num_epochs = schedule_lengths(num_batches, cfg)
        model, optimizer, loader, scheduler = self._prepare(loader, total_steps)
        state = self._start_or_resume(model, optimizer, scheduler, total_steps)

        if cfg.tensorboard:
            hparams = {k: v for k, v in vars(cfg).items() if isinstance(v, (int, float, str, bool))}
            acc.init_trackers(self.desc, config=hparams)
        self._info(
            f"{self.desc}: {self.num_examples} examples, global batch {cfg.batch_size} x {cfg.grad_accum} "
            f"accumulation, {total_steps} optimizer steps ({steps_per_epoch} per epoch) on "
            f"{acc.num_processes} process(es), device {acc.device}."
        )
        progress = tqdm(total=total_steps, initial=min(state.global_step, total_steps), desc=self.desc,
                        disable=not acc.is_local_main_process, dynamic_ncols=True)
        return _Session(
            model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, sampler=sampler, collate=collate,
            state=state, num_batches=num_batches, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
            num_epochs=num_epochs, previous_seconds=float(state.seconds), progress=progress,
            # running means survive a resume so that the history of a resumed run is the same
            log_window=_Window.from_dict(state.log_window), eval_window=_Window.from_dict(state.eval_window),
        )

    def _prepare(self, loader: Any, total_steps: int) -> tuple[nn.Module, Any, Any, Any]:
        """Model, optimizer, loader and schedule on the device, wrapped by accelerate."""
        acc = self.accelerator
        for module in self.extra_modules:
            module.to(acc.device)
            module.train()
        for p in self.extra_params:
            if p.device != acc.device:
                p.data = p.data.to(acc.device)
        self.model.train()
        optimizer, scheduler = optimizer_and_schedule(self.model, self.extra_modules, self.extra_params, self.config,
                                                      acc.device, total_steps)
        return acc.prepare(self.model, optimizer, loader, scheduler)

    def _start_or_resume(self, model: nn.Module, optimizer: Any, scheduler: Any, total_steps: int) -> TrainerState:
        """The state at step 0, or the one of the last checkpoint when resuming (everything else restored too)."""
        acc = self.accelerator
        state = TrainerState.fresh(desc=self.desc, total_steps=total_steps, main_metric=self.main_metric,
                                   greater_is_better=self.greater_is_better, num_examples=self.num_examples,
                                   config=self.config, num_processes=acc.num_processes)
        if self.resume:
            # restores the RNG states too: nothing after it may draw from the global generators
            return resume_last(acc, self.out_dir, model, optimizer, scheduler, fresh=state,
                               extra_params=self.extra_params, desc=self.desc) or state
        if find_checkpoint(self.out_dir, LAST) is not None:
            self._info(f"{self.desc}: not resuming; the checkpoints in {self.checkpoint_root} will be replaced.")
        return state

    def _train_epoch(self, run: "_Session", loader: Iterable, epoch: int, batch_in_epoch: int) -> bool:
        """One pass over ``loader`` (the rest of epoch ``epoch``); True when the schedule is done."""
        acc, cfg = self.accelerator, self.config
        step_loss = _Window()
        for batch in loader:
            with acc.accumulate(run.model):
                loss, parts = self._call_loss(run.model, batch)
                reduced = acc.reduce(loss.detach().float(), reduction="mean")
                if not torch.isfinite(reduced):
                    raise self._non_finite("loss", reduced.item(), run.state, epoch, batch_in_epoch)
                step_loss.add(reduced.item(), parts)
                acc.backward(loss)
                if acc.sync_gradients:
                    self._optimizer_step(run, epoch, batch_in_epoch)
            examples = min(cfg.batch_size, self.num_examples - batch_in_epoch * cfg.batch_size)
            run.session_examples += examples
            run.state.examples_seen += examples
            batch_in_epoch += 1
            if acc.sync_gradients:
                epoch_end = batch_in_epoch >= run.num_batches
                run.state.global_step += 1
                run.state.epoch, run.state.batch_in_epoch = (
                    (epoch + 1, 0) if epoch_end else (epoch, batch_in_epoch)
                )
                self._after_step(run, step_loss.mean(), epoch_end)
                step_loss = _Window()
                if run.state.global_step >= run.total_steps or self._out_of_patience(run.state):
                    return True
        return False

    def _optimizer_step(self, run: "_Session", epoch: int, batch_in_epoch: int) -> None:
        acc, cfg = self.accelerator, self.config
        self._reduce_extra_grads()
        if cfg.max_grad_norm:
            grad_norm = acc.clip_grad_norm_(trained_parameters(run.model, self.extra_params), cfg.max_grad_norm)
            # fp16 overflows are expected: its gradient scaler skips those steps by itself
            if grad_norm is not None and acc.mixed_precision != "fp16":
                if not torch.isfinite(torch.as_tensor(grad_norm)):
                    raise self._non_finite("gradient norm", float(grad_norm), run.state, epoch, batch_in_epoch)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)

    def _after_step(self, run: "_Session", step_mean: tuple[float, dict[str, float]], epoch_end: bool) -> None:
        """Progress, logging, evaluation and checkpoints after optimizer step ``global_step``."""
        cfg, state = self.config, run.state
        step = state.global_step
        loss, parts = step_mean
        run.log_window.add(loss, parts)
        run.eval_window.add(loss, parts)
        elapsed = time.perf_counter() - run.start
        state.seconds = run.previous_seconds + elapsed
        rate = run.session_examples / elapsed if elapsed > 0 else 0.0
        lr = run.scheduler.get_last_lr()[0]
        run.progress.update(1)
        run.progress.set_postfix(loss=f"{loss:.4f}", ex_s=f"{rate:.0f}", refresh=False)
        if cfg.log_every and step % cfg.log_every == 0:
            self._log_train(step, run.total_steps, run.log_window, lr, rate)
            run.log_window = _Window()

        last_step = step >= run.total_steps
        do_eval = (
            (cfg.eval_every is not None and step % cfg.eval_every == 0)
            or (cfg.eval_every is None and epoch_end)
            or last_step
        )
        do_save = (
            do_eval or epoch_end or (self.checkpoint_every is not None and step % self.checkpoint_every == 0)
        )
        if do_eval:
            self._evaluation_point(run.model, state, run.eval_window, lr, run.steps_per_epoch)
            run.eval_window = _Window()
        if do_save:
            state.log_window, state.eval_window = run.log_window.to_dict(), run.eval_window.to_dict()
            save_last(self.accelerator, self.checkpoint_root, run.model, run.optimizer, run.scheduler, state,
                      self.extra_params)

    def _out_of_patience(self, state: TrainerState) -> bool:
        """Early stopping: ``patience`` evaluations in a row without a new best main metric. Read
        from the history and best step alone, so a resumed run stops where the first one would have."""
        patience = self.config.patience
        if not patience or self.eval_fn is None or state.best_step is None:
            return False
        since_best = sum(1 for e in state.history if e.get("metrics") and e["step"] > state.best_step)
        if since_best < patience:
            return False
        if not state.stopped_early:
            state.stopped_early = True
            self._info(f"{self.desc}: stopping early at step {state.global_step}: {since_best} evaluations "
                       f"without a better {self.main_metric} (best at step {state.best_step}).")
        return True

    def _finish(self, run: "_Session") -> TrainResult:
        acc, state = self.accelerator, run.state
        session_seconds = time.perf_counter() - run.start
        unwrapped = acc.unwrap_model(run.model)
        self._load_best_if_selected(unwrapped, state)
        unwrapped.eval()
        acc.wait_for_everyone()
        if acc.device.type != "cpu":  # gives the device's cache back; its full gc.collect (0.3 s in a process with
            acc.free_memory()  # many objects) frees nothing on CPU: the trainer's optimizer goes with the trainer
        return TrainResult(
            model=unwrapped,
            best_metrics=dict(state.best_metrics),
            history=copy.deepcopy(state.history),
            global_step=state.global_step,
            seconds=float(state.seconds),
            examples_per_s=run.session_examples / session_seconds if session_seconds > 0 else 0.0,
            best_step=state.best_step,
            checkpoint_dir=self.checkpoint_root,
        )

    # -- step helpers --------------------------------------------------------------------------

    def _call_loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, float]]:
        out = self.loss_fn(model, batch)
        parts: Mapping[str, Any] = {}
        if isinstance(out, tuple):
            if len(out) != 2:
                raise TypeError("loss_fn must return a loss tensor or (loss, {name: float}).")
            out, parts = out
        if not isinstance(out, Tensor) or out.numel() != 1:
            raise TypeError(f"loss_fn must return a scalar loss tensor, got {type(out).__name__}.")
        return out.reshape(()), {k: float(v) for k, v in parts.items()}

    def _reduce_extra_grads(self) -> None:
        # DDP averages the wrapped model's gradients only; extra parameters live outside it
        if self.accelerator.num_processes == 1:
            return
        for p in self.extra_params:
            if p.grad is not None:
                p.grad.copy_(self.accelerator.reduce(p.grad, reduction="mean"))

    def _non_finite(self, what: str, value: float, state: TrainerState, epoch: int,
                    batch_in_epoch: int) -> DistilleryError:
        ckpt = find_checkpoint(self.out_dir, LAST)
        where = f"the last good checkpoint is in {ckpt}" if ckpt else "no checkpoint had been written yet"
        return DistilleryError(
            f"{self.desc} stopped: non-finite {what} ({value}) at step {state.global_step + 1} "
            f"(epoch {epoch + 1}, batch {batch_in_epoch + 1}) before the optimizer step; {where}. "
            f"Lower the learning rate or check the inputs and the loss."
        )

    def _release(self, active_loader: Any) -> None:
        # a loop left early (max_steps, an exception) never reaches the loader's own cleanup, and
        # accelerate's gradient state is shared by every Accelerator of the process
        if active_loader is not None and hasattr(active_loader, "end"):
            active_loader.end()

    def _info(self, message: str) -> None:
        if self.accelerator.is_main_process:
            logger.info(message)

    def _log_train(self, step: int, total: int, window: "_Window", lr: float, rate: float) -> None:
        loss, parts = window.mean()
        extra = "".join(f" | {k} {v:.4f}" for k, v in parts.items())
        self._info(f"{self.desc} step {step}/{total} | loss {loss:.4f}{extra} | lr {lr:.3g} | {rate:.1f} ex/s")
        if self.config.tensorboard:
            values = {"train/loss": loss, "train/lr": lr, "train/examples_per_s": rate}
            values.update({f"train/{k}": v for k, v in parts.items()})
            self.accelerator.log(values, step=step)

    # -- evaluation and best weights -----------------------------------------------------------

    def _evaluate(self, model: nn.Module) -> dict[str, Any]:
        acc = self.accelerator
        metrics: dict[str, Any] | None = None
        if acc.is_main_process:
            unwrapped = acc.unwrap_model(model)
            was_training = unwrapped.training
            unwrapped.eval()
            try:
                with preserved_rng(), torch.no_grad():
                    raw = self.eval_fn(unwrapped)
            finally:
                unwrapped.train(was_training)
            if not isinstance(raw, Mapping) or self.main_metric not in raw:
                raise ValueError(
                    f"eval_fn must return a dict containing the main metric {self.main_metric!r}, got {raw!r}."
                )
            metrics = _metrics_to_floats(raw)
        if acc.num_processes > 1:
            metrics = broadcast_object_list([metrics])[0]
        return metrics

    def _is_better(self, value: float, best: float | None) -> bool:
        if value is None or not math.isfinite(value):
            return False
        if best is None:
            return True
        return value > best if self.greater_is_better else value < best

    def _evaluation_point(
        self, model: nn.Module, state: TrainerState, since_eval: "_Window", lr: float, steps_per_epoch: int
    ) -> None:
        step = state.global_step
        loss, parts = since_eval.mean()
        metrics: dict[str, Any] = {}
        if self.eval_fn is not None:
            metrics = self._evaluate(model)
            value = metrics.get(self.main_metric)
            if self._is_better(value, state.best_metric):
                state.best_metric, state.best_step, state.best_metrics = float(value), step, dict(metrics)
                self._save_best(model, state)
            shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
            best = state.best_metric
            best_text = f"{best:.4f} at step {state.best_step}" if best is not None else "none yet"
            self._info(f"{self.desc} step {step}: {shown} (best {self.main_metric}: {best_text})")
            if self.config.tensorboard:
                numeric = {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, float)}
                self.accelerator.log(numeric, step=step)
        entry = {"step": step, "epoch": step / steps_per_epoch, "loss": json_float(loss), "lr": lr, "metrics": metrics}
        if parts:
            entry["parts"] = parts
        state.history.append(entry)

    def _save_best(self, model: nn.Module, state: TrainerState) -> None:
        acc = self.accelerator
        unwrapped = acc.unwrap_model(model)
        if self.config.select_best:
            self._best_state = {k: v.detach().to("cpu", copy=True) for k, v in unwrapped.state_dict().items()}
        if acc.is_main_process:
            save_best(self.checkpoint_root, unwrapped, state.global_step, self.main_metric, state.best_metrics)
        acc.wait_for_everyone()

    def _load_best_if_selected(self, unwrapped: nn.Module, state: TrainerState) -> None:
        if not (self.config.select_best and self.eval_fn is not None and state.best_step is not None):
            return
        if self._best_state is not None:
            unwrapped.load_state_dict(self._best_state)
            self._best_state = None
        elif not load_best(self.out_dir, unwrapped, state.best_step, self.desc):  # found before a resume
            return
        self._info(
            f"{self.desc}: loaded the best weights (step {state.best_step}, "
            f"{self.main_metric} {state.best_metric:.4f})."
        )


def _checked_arguments(model: Any, config: Any, train_dataset: Any, eval_fn: Any, main_metric: str | None,
                       checkpoint_every: int | None) -> int:
    """Refuse what the Trainer cannot run with; return the number of training examples."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}.")
    if eval_fn is not None and not main_metric:
        raise ValueError("main_metric is required when eval_fn is given: it selects the best weights.")
    if config.eval_every is not None and config.eval_every < 1:
        raise DistilleryError(f"eval_every must be a positive number of steps, got {config.eval_every}.")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise DistilleryError(f"checkpoint_every must be a positive number of steps, got {checkpoint_every}.")
    try:
        num_examples = len(train_dataset)
    except TypeError:
        raise TypeError("train_dataset must have a length (a map-style dataset).") from None
    if num_examples == 0:
        raise DistilleryError("The training set is empty; there is nothing to train on.")
    return num_examples


def _accelerator(config: TrainConfig, out_dir: Path) -> Accelerator:
    """The Accelerator of one Trainer; the global batch must split evenly over its processes."""
    if config.tensorboard:
        from accelerate.utils import is_tensorboard_available

        if not is_tensorboard_available():
            raise DistilleryError(
                "tensorboard is on but the tensorboard package is not installed; "
                "install it (pip install 'distillery[dev]') or turn tensorboard off."
            )
    accelerator = Accelerator(
        gradient_accumulation_steps=config.grad_accum,
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        cpu=not torch.cuda.is_available(),
        log_with="tensorboard" if config.tensorboard else None,
        project_config=ProjectConfiguration(project_dir=str(out_dir), logging_dir=str(out_dir / "tb")),
        # a loss may leave parts of the model out of a step (the pooler, an expert no token chose)
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
    )
    if config.batch_size % accelerator.num_processes:
        raise DistilleryError(
            f"batch_size ({config.batch_size}) is the global batch and must be a multiple of the "
            f"number of processes ({accelerator.num_processes})."
        )
    return accelerator


class _Window:
    """Running means of the loss and of the named parts a loss_fn reports."""

    def __init__(self) -> None:
        self.n = 0
        self.loss = 0.0
        self.parts: dict[str, float] = {}

    def add(self, loss: float, parts: Mapping[str, float]) -> None:
        self.n += 1
        self.loss += loss
        for k, v in parts.items():
            self.parts[k] = self.parts.get(k, 0.0) + v

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "loss": self.loss, "parts": dict(self.parts)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "_Window":
        window = cls()
        if d:
            window.n, window.loss, window.parts = int(d["n"]), float(d["loss"]), dict(d["parts"])
        return window

    def mean(self) -> tuple[float, dict[str, float]]:
        if self.n == 0:
            return float("nan"), {}
        return self.loss / self.n, {k: v / self.n for k, v in self.parts.items()}


@dataclass
class _Session:
    """What one call of ``Trainer.train`` works with."""

    model: nn.Module  # prepared (a DDP wrapper when distributed)
    optimizer: Any
    scheduler: Any
    loader: Any
    sampler: EpochSampler
    collate: SeededCollate
    state: TrainerState
    num_batches: int
    steps_per_epoch: int
    total_steps: int
    num_epochs: int
    previous_seconds: float
    log_window: "_Window"
    eval_window: "_Window"
    progress: Any
    start: float = field(default_factory=time.perf_counter)
    session_examples: int = 0
