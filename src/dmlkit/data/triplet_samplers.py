"""Samplers that hand out triplets or weight images by how often a miner picks them."""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch.utils.data import Sampler

from dmlkit.core.seeds import derive_generator
from dmlkit.core.validation import NONE, Interval, validate_params
from dmlkit.data.samplers import EpochSampler, _as_labels, epoch_generator
from dmlkit.exceptions import BatchCompositionError


def draw_triplets(labels: torch.Tensor, num_triplets: int, generator: torch.Generator) -> torch.Tensor:
    """``[num_triplets, 3]`` ``(anchor, positive, negative)`` dataset indices.

    Each triplet draws two distinct classes uniformly, an anchor and a positive of the first
    (two distinct images when the class has two or more) and a negative of the second.
    """
    classes, class_of, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    by_class = torch.argsort(class_of, stable=True)
    offsets = counts.cumsum(0) - counts
    num_classes = len(classes)
    anchor_class = torch.randint(num_classes, (num_triplets,), generator=generator)
    negative_class = (anchor_class + 1 + torch.randint(num_classes - 1, (num_triplets,), generator=generator)) % num_classes
    size = counts[anchor_class]
    first = (torch.rand(num_triplets, generator=generator, dtype=torch.float64) * size).long().clamp_max_(size - 1)
    others = (size - 1).clamp_min(1)  # the positive is one of the class's other images
    second = (torch.rand(num_triplets, generator=generator, dtype=torch.float64) * others).long().clamp_max_(others - 1)
    second = torch.where(size > 1, second + (second >= first), first)
    neg_size = counts[negative_class]
    third = (torch.rand(num_triplets, generator=generator, dtype=torch.float64) * neg_size).long().clamp_max_(neg_size - 1)
    base, neg_base = offsets[anchor_class], offsets[negative_class]
    return torch.stack([by_class[base + first], by_class[base + second], by_class[neg_base + third]], dim=1)


class FixedSetOfTriplets(EpochSampler):
    """``num_triplets`` triplets drawn once, yielded as consecutive ``(a, p, n)`` indices.

    pytorch-metric-learning's sampler for training from triplets alone: the set is fixed at
    construction (from ``seed``); each epoch yields it in a new order (from ``(seed, epoch)``),
    each triplet's three indices kept together, so any ``DataLoader`` batch size that is a
    multiple of 3 gives whole triplets for :class:`dmlkit.mining.EmbeddingsAlreadyPackagedAsTriplets`.
    """

    def __init__(self, labels: torch.Tensor | Sequence[int], num_triplets: int, *, seed: int = 0):
        owner = type(self).__name__
        validate_params(owner, dict(num_triplets=num_triplets, seed=seed),
                        dict(num_triplets=[Interval(int, 1, None)], seed=[Interval(int, 0, None)]))
        labels = _as_labels(labels, owner)
        if len(torch.unique(labels)) < 2:
            raise BatchCompositionError(f"{owner} needs labels of at least 2 classes (a negative of another class).")
        super().__init__(3, seed, 0, 1)
        self.num_triplets = int(num_triplets)
        self.num_batches = self.num_triplets
        self.fixed_set_of_triplets = draw_triplets(labels, self.num_triplets, derive_generator(seed, "triplets"))

    def _fingerprint(self) -> dict:
        return super()._fingerprint() | {"num_triplets": self.num_triplets}

    def global_batches(self, generator: torch.Generator) -> torch.Tensor:
        return self.fixed_set_of_triplets[torch.randperm(self.num_triplets, generator=generator)]


class TuplesToWeightsSampler(Sampler[int]):
    """Images drawn with replacement in proportion to how often a miner picks them.

    pytorch-metric-learning's sampler: each epoch embeds the data set (or a random
    ``subset_size`` of it) with ``model``, mines the embeddings with ``miner`` (a dmlkit miner or
    PML's), weighs each image by its count in the mined pairs or triplets divided by the largest
    count, and draws ``len(self)`` images with those weights. Randomness comes from
    ``(seed, epoch)``; ``weights`` holds the last epoch's weights over the whole data set.
    """

    def __init__(self, model: torch.nn.Module, miner, dataset, subset_size: int | None = None, *,
                 batch_size: int = 32, dataloader_num_workers: int = 0, seed: int = 0):
        owner = type(self).__name__
        validate_params(owner, dict(subset_size=subset_size, batch_size=batch_size,
                                    dataloader_num_workers=dataloader_num_workers, seed=seed),
                        dict(subset_size=[Interval(int, 1, None), NONE], batch_size=[Interval(int, 1, None)],
                             dataloader_num_workers=[Interval(int, 0, None)], seed=[Interval(int, 0, None)]))
        self.model = model
        self.miner = miner
        self.dataset = dataset
        self.subset_size = subset_size
        self.batch_size = batch_size
        self.dataloader_num_workers = dataloader_num_workers
        self.seed = seed
        self.epoch = 0
        self.weights: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.subset_size if self.subset_size else len(self.dataset)

    def image_weights(self, indices: torch.Tensor) -> torch.Tensor:
        """``[len(dataset)]`` weights: mined counts of the embedded ``indices`` over their largest count."""
        from dmlkit.evaluation.embed import embed_dataset
        from dmlkit.mining.selection import PairSelection, TripletSelection

        subset = torch.utils.data.Subset(self.dataset, indices.tolist())
        with torch.random.fork_rng(devices=[]):  # the DataLoader draws a base seed from the global generator
            embeddings, labels = embed_dataset(self.model, subset, batch_size=self.batch_size,
                                               num_workers=self.dataloader_num_workers)
        mined = self.miner(embeddings, labels.reshape(-1))
        if isinstance(mined, (PairSelection, TripletSelection)):
            mined = mined.to_indices_tuple()
        picked = torch.cat([t.reshape(-1).long().cpu() for t in mined])
        counts = torch.bincount(picked, minlength=len(indices)).float()
        weights = torch.zeros(len(self.dataset))
        weights[indices] = counts / counts.max() if picked.numel() else torch.ones(len(indices))
        return weights

    def __iter__(self) -> Iterator[int]:
        generator = epoch_generator(self.seed, self.epoch)
        self.epoch += 1
        if self.subset_size:
            n = len(self.dataset)
            indices = (torch.randperm(n, generator=generator)[: self.subset_size] if self.subset_size <= n
                       else torch.randint(n, (self.subset_size,), generator=generator))
        else:
            indices = torch.arange(len(self.dataset))
        self.weights = self.image_weights(indices)
        drawn = torch.multinomial(self.weights, len(self), replacement=True, generator=generator)
        return iter(drawn.tolist())
