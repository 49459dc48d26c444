"""Several processes started by ``accelerate launch`` (or torchrun): who writes, and what is shared.

The trainer already trains through Accelerate (DDP). Around it, a run launched on N processes must
still produce one run folder and one report, and must not race on the caches:

- the main process alone writes folders, caches, plots and reports (:func:`is_main`); a decision
  that depends on the file system or the clock (is this teacher cached? the default run folder's
  time stamp) is taken there and sent to the others (:func:`on_main`), so every process follows
  the same path through the collective steps;
- a sum over training examples (importance scores, the refit's normal equations) is split between
  the processes by batch (:func:`shard`) and added up (:func:`all_sum_`): the same sum, N times faster;
- evaluation, benchmarking and the report run on the main process only: the others return once
  the student is trained.

With one process (no launcher, or ``--num_processes 1``) every function here is a no-op, and no
process group is created. Several nodes need the run folder and ``$DISTILLERY_CACHE`` on a file
system they share, as Accelerate's own checkpoints do.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def launched() -> bool:
    """True when this process is one of several (the launcher sets WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _state():
    from accelerate import PartialState

    # the same device choice as the trainer's Accelerator, which shares this state
    return PartialState(cpu=not torch.cuda.is_available())


def device() -> torch.device:
    """This process's device, the one the trainer trains on: its GPU when there is one, else the CPU."""
    return _state().device


def rank() -> int:
    return _state().process_index if launched() else 0


def world_size() -> int:
    return _state().num_processes if launched() else 1


def is_main() -> bool:
    """The process that writes folders, caches and reports."""
    return not launched() or _state().is_main_process


def barrier() -> None:
    if launched():
        _state().wait_for_everyone()


@contextmanager
def local_main_first() -> Iterator[None]:
    """The block runs on each node's first process, then on the others (which find its cache files)."""
    if not launched():
        yield
        return
    with _state().local_main_process_first():
        yield


def on_main(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` run on the main process, its (picklable) result sent to every process.

    If it raises on the main process, that process exits with the error and the launcher stops the
    others (torchrun ends the whole group when one process fails)."""
    result = fn(*args, **kwargs) if is_main() else None
    if not launched():
        return result
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([result], from_process=0)[0]


def shard(items: list[T]) -> list[T]:
    """This process's share of ``items`` (every world_size-th, from its rank): together the processes
    cover each item once."""
    return items[rank()::world_size()] if launched() else items


def all_sum_(*tensors: torch.Tensor) -> None:
    """Add each tensor up over the processes, in place (after each summed its :func:`shard`)."""
    if launched():
        for t in tensors:
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
