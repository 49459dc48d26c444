"""Which examples each optimizer step sees, as a pure function of (seed, epoch, batch index).

  - The data order of epoch ``e`` is ``torch.randperm(n, generator=seeded(seed + e))``, grouped by
    length when ``TrainConfig.group_by_length`` (see ``EpochSampler``); batches are
    global (``split_batches``): N processes see the same global batches as one process, each a
    slice of them, so the result does not depend on the number of processes.
  - With N processes, a final incomplete batch is completed with examples from the start of the
    epoch (accelerate's ``even_batches``); with one process it stays short.
  - Random draws made while collating a batch (MLM masking, say) are seeded by
    ``(seed, epoch, batch index)`` and do not advance the global generators (``SeededCollate``).

A resumed run therefore needs only the epoch and the batch within it to see the same batches.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler, default_collate

from distillery.config import TrainConfig
from distillery.data.encode import example_lengths
from distillery.training.checkpoint import preserved_rng


def train_loader(dataset: Any, collate_fn: Callable[[list], Any] | None, config: TrainConfig
                 ) -> tuple[DataLoader, EpochSampler, SeededCollate]:
    """The loader of global batches over ``dataset``, with the sampler and collator that the trainer
    points at an epoch and batch before each pass."""
    lengths = example_lengths(dataset) if config.group_by_length else None
    sampler = EpochSampler(len(dataset), config.seed, lengths=lengths, batch_size=config.batch_size)
    collate = SeededCollate(collate_fn, config.seed)
    loader = DataLoader(
        dataset,
        batch_size=config.batch_size,
        sampler=sampler,
        collate_fn=collate,
        drop_last=False,
        num_workers=0,
        # its own generator: creating an iterator then draws nothing from the global one
        generator=torch.Generator().manual_seed(config.seed),
    )
    return loader, sampler, collate


class EpochSampler(Sampler[int]):
    """Indices of epoch ``epoch`` in the order ``torch.randperm(n, generator=seeded(seed + epoch))``.

    With ``lengths`` (token counts per example), the order is length-grouped as in HF's
    ``group_by_length``: the permutation is cut into mega-batches of ``GROUP_MEGABATCHES`` batches,
    each sorted by length and cut into batches, and the full batches are shuffled (the last,
    partial one stays last so the loader's batch boundaries hold). Dynamic padding then pads each
    batch to a length close to its examples', which on SST-2 roughly halves the work per epoch.
    The order is still a pure function of (seed, epoch), so resuming stays exact.

    The trainer sets ``epoch`` before each pass. There is deliberately no ``set_epoch`` method and
    no ``generator`` attribute: accelerate would otherwise drive them from its own counters.
    """

    GROUP_MEGABATCHES = 50

    def __init__(self, num_examples: int, seed: int, shuffle: bool = True,
                 lengths: torch.Tensor | None = None, batch_size: int = 1):
        self.num_examples = num_examples
        self.seed = seed
        self.shuffle = shuffle
        self.lengths = lengths
        self.batch_size = batch_size
        self.epoch = 0

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_examples))
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        perm = torch.randperm(self.num_examples, generator=g)
        if self.lengths is None:
            return perm.tolist()
        mega = self.batch_size * self.GROUP_MEGABATCHES
        # a loop over mega-batches (tens per epoch), each one vectorised
        grouped = torch.cat([c[torch.argsort(self.lengths[c], descending=True, stable=True)] for c in perm.split(mega)])
        batches = list(grouped.split(self.batch_size))
        full = len(batches) - (1 if len(batches[-1]) < self.batch_size else 0)
        shuffled = [batches[i] for i in torch.randperm(full, generator=g).tolist()] + batches[full:]
        return torch.cat(shuffled).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order(self.epoch))

    def __len__(self) -> int:
        return self.num_examples


class SeededCollate:
    """Runs ``collate_fn`` with RNGs seeded by ``(seed, epoch, batch index)``, restoring them after.

    Collation happens one batch ahead of the model (the data loader prefetches), so a collator
    that draws random numbers would otherwise interleave with dropout differently after a resume.
    """

    def __init__(self, collate_fn: Callable[[list], Any], seed: int):
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        self.seed = seed
        self.epoch = 0
        self.batch_index = 0

    def start(self, epoch: int, batch_index: int) -> None:
        self.epoch, self.batch_index = epoch, batch_index

    def __call__(self, examples: list) -> Any:
        seed = int(np.random.SeedSequence([self.seed, self.epoch, self.batch_index]).generate_state(1)[0])
        self.batch_index += 1
        with preserved_rng(cuda=False):
            random.seed(seed)
            np.random.seed(seed)
            torch.default_generator.manual_seed(seed)
            return self.collate_fn(examples)
