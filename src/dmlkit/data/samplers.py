"""Batch-composition samplers: m-per-class, one-per-class (proxy losses) and plain shuffled.

Every sampler yields flat dataset indices for ``DataLoader(batch_size=sampler.local_batch_size,
sampler=sampler)``; each consecutive ``local_batch_size`` indices form this rank's part of one
global batch. The order of epoch ``e`` depends only on ``(seed, e)``; ``state_dict()`` holds
epoch and position so a run resumes mid-epoch with the same remaining batches.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from dmlkit.core.registry import Registry
from dmlkit.core.seeds import derive_generator
from dmlkit.core.validation import NONE, InstanceOf, Interval, as_class_ids, validate_params
from dmlkit.exceptions import BatchCompositionError, CheckpointError, DataError, InvalidParameterError

SAMPLERS: Registry = Registry("sampler")


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A CPU generator for the batches of ``epoch`` (:func:`dmlkit.core.seeds.derive_generator`)."""
    return derive_generator(seed, epoch)


def _as_labels(labels: torch.Tensor | Sequence[int] | np.ndarray, owner: str) -> torch.Tensor:
    labels = as_class_ids(labels, owner)
    if labels.numel() == 0:
        raise DataError(f"labels given to {owner} must be a non-empty 1-D [N] tensor. Got shape {tuple(labels.shape)}.")
    return labels


class EpochSampler(Sampler[int]):
    """Base class: seeded per-epoch global batches, split across ranks, resumable mid-epoch.

    Subclasses implement ``global_batches(generator) -> [num_batches, batch_size]`` int64.
    """

    def __init__(self, batch_size: int, seed: int, rank: int, world_size: int):
        """``batch_size`` is the global batch (split over ``world_size`` ranks)."""
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        if rank >= world_size:
            raise InvalidParameterError(
                f"The 'rank' parameter of {type(self).__name__} must be an int in the range [0, {world_size - 1}]. "
                f"Got {rank} instead."
            )
        if batch_size % world_size:
            raise InvalidParameterError(
                f"batch_size {batch_size} of {type(self).__name__} is not divisible by world_size {world_size}."
            )
        self.local_batch_size = batch_size // world_size
        self.epoch = 0
        self._position = 0  # local indices handed out in the current epoch
        self._resume_from = 0
        self._active_epoch: int | None = None

    # -- to implement -------------------------------------------------------------------------
    num_batches: int

    def global_batches(self, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def _fingerprint(self) -> dict:
        return {"batch_size": self.batch_size, "world_size": self.world_size, "num_batches": self.num_batches}

    # -- shared machinery ----------------------------------------------------------------------
    def batches(self, epoch: int | None = None) -> torch.Tensor:
        """This rank's part of every batch of ``epoch``: ``[num_batches, local_batch_size]`` int64."""
        epoch = self.epoch if epoch is None else epoch
        full = self.global_batches(epoch_generator(self.seed, epoch))
        lo = self.rank * self.local_batch_size
        return full[:, lo : lo + self.local_batch_size]

    def __len__(self) -> int:
        return self.num_batches * self.local_batch_size

    def __iter__(self) -> Iterator[int]:
        epoch, start = self.epoch, self._resume_from
        self._resume_from = 0
        self._active_epoch = epoch
        flat = self.batches(epoch).reshape(-1)[start:].tolist()
        self._position = start
        for index in flat:
            self._position += 1
            yield index
        self.epoch = epoch + 1
        self._position = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch`` for the next iteration (keeps a pending resume position for that same epoch)."""
        if epoch != self.epoch:
            self._resume_from = 0
            self._position = 0
        self.epoch = int(epoch)

    def state_dict(self, batches_done: int | None = None) -> dict:
        """``{"epoch", "position", "seed", ...}``; ``position`` counts this rank's indices already used.

        With DataLoader workers the sampler runs ahead of training, so pass ``batches_done``
        (optimizer steps taken in the current epoch) for an exact position.
        """
        if batches_done is None:
            epoch, position = self.epoch, self._position
        else:
            epoch = self._active_epoch if self._active_epoch is not None else self.epoch
            position = int(batches_done) * self.local_batch_size
            if position >= len(self):
                epoch, position = epoch + 1, 0
        return {"epoch": int(epoch), "position": int(position), "seed": self.seed, **self._fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state["epoch"]``, skipping the first ``state["position"]`` indices of that epoch."""
        mine = self._fingerprint() | {"seed": self.seed}
        diff = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: checkpoint {a!r} vs sampler {b!r}" for k, (a, b) in diff.items())
            raise CheckpointError(f"{type(self).__name__} state does not match this sampler ({detail}).")
        position = int(state["position"])
        if not 0 <= position <= len(self):
            raise CheckpointError(f"{type(self).__name__} state position {position} is outside [0, {len(self)}].")
        self.epoch = int(state["epoch"])
        self._resume_from = position
        self._position = position


@SAMPLERS.register("m_per_class")
class MPerClassSampler(EpochSampler):
    """Batches of ``batch_size // m`` distinct classes with ``m`` images each (e.g. 32 = 8 x 4).

    pytorch-metric-learning's arguments and defaults: ``MPerClassSampler(labels, m,
    batch_size=None, length_before_new_iter=100000)``. An epoch has ``length_before_new_iter //
    batch_size`` batches (``length_before_new_iter=None``: one pass over ``labels``). Without
    ``batch_size`` a "batch" is one pass over every class (``m`` images each), so any
    ``DataLoader`` batch size that divides ``m * num_classes`` gets whole classes; the epoch is
    then ``length_before_new_iter`` rounded down to whole passes (as in PML).

    Classes are visited in seeded random rounds (every class once per round, so over an epoch
    class appearances differ by at most one, where PML draws each batch's classes anew);
    within a class, images are taken in a seeded shuffled cycle, so a class with ``n >= m`` images
    gives ``m`` distinct images per batch and a class with ``n < m`` images repeats them (each
    appears ``floor(m/n)`` or ``ceil(m/n)`` times). Randomness comes from ``seed`` (keyword-only)
    and the epoch, never from a global generator.
    """

    def __init__(
        self,
        labels: torch.Tensor | Sequence[int],
        m: int,
        batch_size: int | None = None,
        length_before_new_iter: int | None = 100000,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        owner = type(self).__name__
        validate_params(
            owner,
            dict(m=m, batch_size=batch_size, seed=seed, length_before_new_iter=length_before_new_iter,
                 rank=rank, world_size=world_size),
            dict(
                m=[Interval(int, 1, None)],
                batch_size=[Interval(int, 1, None), NONE],
                seed=[Interval(int, 0, None)],
                length_before_new_iter=[Interval(int, 1, None), NONE],
                rank=[Interval(int, 0, None)],
                world_size=[Interval(int, 1, None)],
            ),
        )
        labels = _as_labels(labels, owner)
        classes, class_of_sample, counts = torch.unique(labels, return_inverse=True, return_counts=True)
        one_pass = m * len(classes)
        length = len(labels) if length_before_new_iter is None else length_before_new_iter
        if batch_size is None:
            batch = one_pass
            num_batches = max(length // one_pass, 1)
        else:
            batch = batch_size
            if batch_size % m:
                raise BatchCompositionError(f"batch_size {batch_size} of {owner} is not divisible by m {m}.")
            if batch_size > one_pass:
                raise BatchCompositionError(
                    f"batch_size {batch_size} with m={m} needs {batch_size // m} distinct classes per batch "
                    f"but labels has {len(classes)} classes."
                )
            num_batches = length // batch_size
            if num_batches == 0:
                raise BatchCompositionError(
                    f"length_before_new_iter {length} of {owner} is smaller than batch_size {batch_size}.")
        super().__init__(batch, seed, rank, world_size)
        self.batch_size = batch_size
        self.m = m
        self.classes_per_batch = batch // m
        self.length_before_new_iter = length
        self.num_batches = num_batches
        self.num_samples = len(labels)
        self._class_of_sample = class_of_sample
        self._counts = counts
        self._offsets = torch.cumsum(counts, 0) - counts

    def _fingerprint(self) -> dict:
        return super()._fingerprint() | {"m": self.m, "num_samples": self.num_samples}

    def _class_sequence(self, generator: torch.Generator) -> torch.Tensor:
        """Class of each (batch, slot): ``[num_batches * cpb]``, rounds of all classes, no repeat inside a batch."""
        num_classes, cpb = len(self._counts), self.classes_per_batch
        total = self.num_batches * cpb
        rounds = []
        filled = 0
        while filled < total:  # one iteration per round of all classes (few per epoch)
            perm = torch.randperm(num_classes, generator=generator)
            open_slots = filled % cpb  # classes already placed in a batch that crosses rounds
            if open_slots:
                clash = torch.isin(perm, rounds[-1][-open_slots:])
                head = torch.nonzero(~clash).flatten()[: cpb - open_slots]
                keep = torch.ones(num_classes, dtype=torch.bool)
                keep[head] = False
                perm = torch.cat([perm[head], perm[keep]])
            rounds.append(perm)
            filled += num_classes
        return torch.cat(rounds)[:total]

    def global_batches(self, generator: torch.Generator) -> torch.Tensor:
        cpb, m = self.classes_per_batch, self.m
        class_seq = self._class_sequence(generator)
        # Per-class shuffled image order: sort by (class, random key).
        keys = torch.rand(self.num_samples, generator=generator)
        by_key = keys.argsort()
        order = by_key[self._class_of_sample[by_key].argsort(stable=True)]
        # Occurrence number of each class appearance (0 for its first batch of the epoch, 1, ...).
        seq_sorted, seq_order = class_seq.sort(stable=True)
        first = torch.searchsorted(seq_sorted, seq_sorted, side="left")
        occurrence = torch.empty_like(class_seq)
        occurrence[seq_order] = torch.arange(len(class_seq)) - first
        counts = self._counts[class_seq].unsqueeze(1)
        cycle = (occurrence.unsqueeze(1) * m + torch.arange(m)) % counts
        positions = self._offsets[class_seq].unsqueeze(1) + cycle
        return order[positions].reshape(self.num_batches, cpb * m)


@SAMPLERS.register("one_per_class")
class OnePerClassSampler(MPerClassSampler):
    """Batches of ``batch_size`` distinct classes, one image each (for proxy losses); ``m = 1``.

    An epoch is one pass over ``labels`` unless ``length_before_new_iter`` is given.
    """

    def __init__(
        self,
        labels: torch.Tensor | Sequence[int],
        batch_size: int,
        length_before_new_iter: int | None = None,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        super().__init__(labels, 1, batch_size, length_before_new_iter, seed=seed, rank=rank, world_size=world_size)


@SAMPLERS.register("random")
class ShuffledSampler(EpochSampler):
    """A seeded random permutation per epoch cut into batches of ``batch_size``.

    ``drop_last=True`` drops the incomplete last batch; otherwise it is filled with the first
    indices of the permutation so every rank gets a full part.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        drop_last: bool = True,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        owner = type(self).__name__
        validate_params(
            owner,
            dict(num_samples=num_samples, batch_size=batch_size, seed=seed, drop_last=drop_last,
                 rank=rank, world_size=world_size),
            dict(
                num_samples=[Interval(int, 1, None)],
                batch_size=[Interval(int, 1, None)],
                seed=[Interval(int, 0, None)],
                drop_last=[InstanceOf((bool,))],
                rank=[Interval(int, 0, None)],
                world_size=[Interval(int, 1, None)],
            ),
        )
        super().__init__(batch_size, seed, rank, world_size)
        self.num_samples = num_samples
        self.drop_last = drop_last
        self.num_batches = num_samples // batch_size if drop_last else -(-num_samples // batch_size)
        if self.num_batches == 0:
            raise InvalidParameterError(
                f"num_samples {num_samples} of {owner} is smaller than batch_size {batch_size} with drop_last=True."
            )

    def _fingerprint(self) -> dict:
        return super()._fingerprint() | {"num_samples": self.num_samples}

    def global_batches(self, generator: torch.Generator) -> torch.Tensor:
        perm = torch.randperm(self.num_samples, generator=generator)
        total = self.num_batches * self.batch_size
        if total > self.num_samples:
            perm = perm.repeat(-(-total // self.num_samples))
        return perm[:total].reshape(self.num_batches, self.batch_size)


def create_sampler(name: str, **kwargs) -> EpochSampler:
    """Build the sampler registered as ``name`` (``m_per_class``, ``one_per_class``, ``random``)."""
    return SAMPLERS.create(name, **kwargs)
