"""The run's batches: the label map onto contiguous class ids, the batch sampler from ``sampler.*``, and the resumable
stream of training batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from dmlkit.config.schema import RunConfig
from dmlkit.exceptions import DataError


class LabelMap:
    """Maps a split's label ids onto contiguous ``0..C-1`` (proxy rows are indexed by class)."""

    def __init__(self, labels: torch.Tensor):
        self.classes = torch.unique(labels)
        self._lookup = {int(c): i for i, c in enumerate(self.classes.tolist())}
        offset = int(self.classes.min())
        span = int(self.classes.max()) - offset + 1
        self._table = None
        if span <= 10_000_000:
            table = torch.full((span,), -1, dtype=torch.int64)
            table[self.classes - offset] = torch.arange(len(self.classes))
            self._table, self._offset = table, offset

    def __len__(self) -> int:
        return len(self.classes)

    def __call__(self, labels: torch.Tensor) -> torch.Tensor:
        if self._table is not None:
            return self._table[labels - self._offset]
        return torch.tensor([self._lookup[int(v)] for v in labels.tolist()], dtype=torch.int64)


@dataclass
class BatchPosition:
    """Where the batch stream is: epoch and batches consumed in it (resumable)."""

    epoch: int = 0
    batch_in_epoch: int = 0


def build_batch_sampler(cfg: RunConfig, labels: torch.Tensor, *, rank: int = 0, world_size: int = 1,
                        member_folds=None, seed: int | None = None):
    """The sampler named by ``cfg.sampler`` (``dmlkit.data.samplers``), seeded by ``seed`` (default ``cfg.seed``);
    with ``member_folds`` one per member over its own training rows, side by side
    (:class:`~dmlkit.engine.member_folds.MemberBatchSampler`; member 0 seeded by ``cfg.seed``, the others by seeds
    derived from it)."""
    from dmlkit.data.samplers import create_sampler

    if member_folds is not None:
        from dmlkit.core.seeds import derive_seed
        from dmlkit.engine.member_folds import MemberBatchSampler

        seeds = [cfg.seed] + [derive_seed(cfg.seed, "member sampler", i) for i in range(1, member_folds.members)]
        samplers = [build_batch_sampler(cfg, labels[rows], rank=rank, world_size=world_size, seed=member_seed)
                    for rows, member_seed in zip(member_folds.train_rows, seeds)]
        return MemberBatchSampler(samplers, member_folds.train_rows)
    s = cfg.sampler
    if len(labels) < s.batch_size * world_size:
        raise DataError(
            f"The training split has {len(labels)} images, fewer than one batch of sampler.batch_size={s.batch_size}"
            + (f" x {world_size} processes" if world_size > 1 else "")
            + ": set a smaller sampler.batch_size or add images."
        )
    classes = int(torch.as_tensor(labels).unique().numel())
    needed = 2 if s.name != "m_per_class" else max(2, s.batch_size // s.m)
    if classes < needed:  # said of the split and the settings, before the sampler's own check of its arguments
        raise DataError(
            f"The train split has {classes} class{'' if classes == 1 else 'es'}"
            + (f"; sampler.batch_size={s.batch_size} with sampler.m={s.m} needs {needed} per batch: lower "
               "sampler.batch_size, raise sampler.m or add classes." if classes >= 2 else
               "; metric learning needs at least 2 classes to train on: add classes (more class folders, or more "
               "labels in the train rows).")
        )
    common = dict(batch_size=s.batch_size, seed=cfg.seed if seed is None else seed, rank=rank, world_size=world_size)
    if s.name == "m_per_class":
        # an epoch is one pass over the training split (PML's default length is 100000 images)
        return create_sampler("m_per_class", labels=labels, m=s.m, length_before_new_iter=len(labels), **common)
    if s.name == "one_per_class":
        return create_sampler("one_per_class", labels=labels, **common)
    return create_sampler("random", num_samples=len(labels), **common)


def iterate_training_batches(
    dataset, sampler, position: BatchPosition, num_workers: int = 0, *, pin_memory: bool = False,
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor, BatchPosition]]:
    """``(indices, images, labels, position)`` from ``position`` on, forever.

    In-memory data sets index whole batches at once (on their images' device: a split moved to the
    GPU gives batches there); image-file data sets are decoded and augmented in ``num_workers``
    DataLoader worker processes (one loader per epoch, created after ``dataset.set_epoch`` so
    augmentation seeds follow the epoch), into page-locked memory with ``pin_memory`` (training on a
    GPU: the copy to the card does not block).
    """
    while True:
        epoch, start = position.epoch, position.batch_in_epoch
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        batches = sampler.batches(epoch)
        if len(batches) == 0:
            raise DataError("The batch sampler produced no batch: the training split is too small for the sampler settings.")
        remaining = batches[start:].tolist()
        if num_workers > 0 and not hasattr(dataset, "get_batch"):
            loader = torch.utils.data.DataLoader(dataset, batch_sampler=remaining, num_workers=num_workers,
                                                 pin_memory=pin_memory)
            stream = ((idx, x, torch.as_tensor(y, dtype=torch.int64)) for idx, (x, y) in zip(remaining, loader))
        else:
            stream = ((idx, *fetch_batch(dataset, idx)) for idx in remaining)
        for offset, (idx, images, labels) in enumerate(stream):
            yield idx, images, labels, BatchPosition(epoch, start + offset + 1)
        position = BatchPosition(epoch + 1, 0)


def fetch_batch(dataset, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels of ``indices``: in-memory data sets batch-index directly."""
    if hasattr(dataset, "get_batch"):
        return dataset.get_batch(indices)
    items = [dataset[i] for i in indices]
    images = torch.stack([it[0] for it in items])
    labels = torch.as_tensor([int(it[1]) for it in items], dtype=torch.int64)
    return images, labels


__all__ = ["BatchPosition", "LabelMap", "build_batch_sampler", "fetch_batch", "iterate_training_batches"]
