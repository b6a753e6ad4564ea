"""Batches drawn from a class hierarchy: a few super-classes per batch, whole classes inside each."""

from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from dmlkit.core.validation import Interval, Options, validate_params
from dmlkit.data.samplers import epoch_generator
from dmlkit.exceptions import BatchCompositionError, CheckpointError, DataError


def _hierarchy_labels(labels: object, owner: str) -> torch.Tensor:
    """``labels`` as a CPU int64 ``[N, levels]`` tensor (a row per image, a column per level)."""
    labels = torch.as_tensor(np.asarray(labels) if not isinstance(labels, torch.Tensor) else labels)
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise DataError(f"labels given to {owner} must hold integer class ids (int64). Got dtype {labels.dtype}.")
    if labels.dim() != 2 or labels.shape[0] == 0:
        raise DataError(f"labels given to {owner} must be a non-empty [N, levels] tensor (one column per level "
                        f"of the hierarchy). Got shape {tuple(labels.shape)}.")
    return labels.to(torch.int64).cpu()


class HierarchicalSampler(Sampler[list]):
    """pytorch-metric-learning's hierarchical batch sampler (for ``DataLoader(batch_sampler=...)``).

    Brown et al., "Smooth-AP" (2020) and the Deep-Metric-Learning-Baselines sampler it follows:
    ``labels`` is ``[N, levels]``; column ``outer_label`` holds super-classes, column
    ``inner_label`` classes. Every combination of ``super_classes_per_batch`` super-classes gets
    ``batches_per_super_tuple`` batches per epoch; each batch is made of one sub-batch of
    ``batch_size // super_classes_per_batch`` images per super-class, filled class by class in a
    random class order with ``samples_per_class`` images each (drawn without replacement when the
    class has enough, else with), or with all of a class's images (``"all"``) while they fit.
    Batches and their order depend only on ``(seed, epoch)``; ``state_dict`` holds the epoch and
    the batches already handed out.
    """

    def __init__(self, labels, batch_size: int, samples_per_class: int | str, batches_per_super_tuple: int = 4,
                 super_classes_per_batch: int = 2, inner_label: int = 0, outer_label: int = 1, *, seed: int = 0):
        owner = type(self).__name__
        validate_params(owner,
                        dict(batch_size=batch_size, batches_per_super_tuple=batches_per_super_tuple,
                             super_classes_per_batch=super_classes_per_batch, seed=seed),
                        dict(batch_size=[Interval(int, 1, None)], batches_per_super_tuple=[Interval(int, 1, None)],
                             super_classes_per_batch=[Interval(int, 1, None)], seed=[Interval(int, 0, None)]))
        if samples_per_class != "all":
            validate_params(owner, {"samples_per_class": samples_per_class},
                            {"samples_per_class": [Interval(int, 1, None), Options(("all",))]})
        labels = _hierarchy_labels(labels, owner)
        validate_params(owner, {"inner_label": inner_label, "outer_label": outer_label},
                        {"inner_label": [Interval(int, 0, labels.shape[1] - 1)],
                         "outer_label": [Interval(int, 0, labels.shape[1] - 1)]})
        if batch_size % super_classes_per_batch:
            raise BatchCompositionError(
                f"batch_size {batch_size} of {owner} is not a multiple of super_classes_per_batch {super_classes_per_batch}.")
        self.sub_batch_len = batch_size // super_classes_per_batch
        if samples_per_class != "all" and self.sub_batch_len % samples_per_class:
            raise BatchCompositionError(
                f"batch_size // super_classes_per_batch = {self.sub_batch_len} of {owner} is not a multiple of "
                f"samples_per_class {samples_per_class}.")
        self.batch_size = batch_size
        self.samples_per_class = samples_per_class
        self.batches_per_super_tuple = batches_per_super_tuple
        self.super_classes_per_batch = super_classes_per_batch
        self.seed = seed
        # images of each class of each super-class: {super: [(class, image indices), ...]}
        self._members: dict[int, list[torch.Tensor]] = {}
        for sup in torch.unique(labels[:, outer_label]).tolist():
            rows = (labels[:, outer_label] == sup).nonzero(as_tuple=True)[0]
            classes, inverse = torch.unique(labels[rows, inner_label], return_inverse=True)
            by_class = torch.argsort(inverse, stable=True)
            counts = torch.bincount(inverse, minlength=len(classes)).tolist()
            self._members[sup] = list(torch.split(rows[by_class], counts))
        self.super_tuples = list(itertools.combinations(sorted(self._members), super_classes_per_batch))
        self.epoch = 0
        self._resume_from = 0
        self._position = 0

    def __len__(self) -> int:
        return len(self.super_tuples) * self.batches_per_super_tuple

    def _sub_batch(self, super_label: int, generator: torch.Generator) -> list[torch.Tensor]:
        classes = self._members[super_label]
        parts, filled = [], 0
        for c in torch.randperm(len(classes), generator=generator).tolist():
            if filled >= self.sub_batch_len:
                break
            images = classes[c]
            take = len(images) if self.samples_per_class == "all" else self.samples_per_class
            if filled + take > self.sub_batch_len:
                continue
            if take <= len(images):
                parts.append(images[torch.randperm(len(images), generator=generator)[:take]])
            else:
                parts.append(images[torch.randint(len(images), (take,), generator=generator)])
            filled += take
        return parts

    def batches(self, epoch: int | None = None) -> list[list[int]]:
        """Every batch of ``epoch`` (lists of dataset indices), in the order they are yielded."""
        generator = epoch_generator(self.seed, self.epoch if epoch is None else epoch)
        out = []
        for super_tuple in self.super_tuples:
            for _ in range(self.batches_per_super_tuple):
                batch = torch.cat([p for s in super_tuple for p in self._sub_batch(s, generator)]
                                  or [torch.zeros(0, dtype=torch.long)])
                out.append(batch[torch.randperm(len(batch), generator=generator)].tolist())
        return [out[i] for i in torch.randperm(len(out), generator=generator).tolist()]

    def __iter__(self) -> Iterator[list[int]]:
        epoch, start = self.epoch, self._resume_from
        self._resume_from = 0
        for position, batch in enumerate(self.batches(epoch)[start:], start=start + 1):
            self._position = position
            yield batch
        self.epoch = epoch + 1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._resume_from = 0

    def state_dict(self) -> dict:
        """``{"epoch", "position", "seed", "num_batches"}``: ``position`` batches of ``epoch`` were handed out."""
        return {"epoch": self.epoch, "position": self._position, "seed": self.seed,
                "num_batches": len(self)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed") != self.seed or state.get("num_batches") != len(self):
            raise CheckpointError(f"{type(self).__name__} state (seed {state.get('seed')}, {state.get('num_batches')} "
                                  f"batches) does not match this sampler (seed {self.seed}, {len(self)} batches).")
        self.epoch = int(state["epoch"])
        self._resume_from = int(state["position"])
