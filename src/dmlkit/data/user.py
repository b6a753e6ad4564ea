"""Any map-style ``Dataset`` of ``(image, label)`` as a dmlkit split (the object API's data).

The user's dataset keeps its own transforms: an item is whatever image tensor it returns. Labels
are read once, from ``.labels`` or ``.targets`` when the dataset has them (torchvision's
``ImageFolder``, ``MNIST``, ``CIFAR``...), else by one pass over the items; they become int64
ids ``0..C-1`` in sorted order of the original labels (``class_names`` keeps those).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.utils.data import Dataset

from dmlkit.exceptions import DataError


def read_labels(dataset: Any) -> list:
    """The label of every item: ``dataset.labels`` / ``dataset.targets`` when present, else one pass."""
    for attr in ("labels", "targets"):
        found = getattr(dataset, attr, None)
        if found is not None:
            values = found.tolist() if hasattr(found, "tolist") else list(found)
            if len(values) != len(dataset):
                raise DataError(f"{type(dataset).__name__}.{attr} has {len(values)} entries but the dataset has "
                                f"{len(dataset)} items.")
            return values
    labels = []
    for i in range(len(dataset)):
        item = dataset[i]
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise DataError(f"{type(dataset).__name__}[{i}] must be an (image, label) pair. Got {type(item).__name__}.")
        labels.append(item[1].item() if isinstance(item[1], torch.Tensor) else item[1])
    return labels


class UserDataset(Dataset):
    """A user's ``(image, label)`` dataset seen through ``rows`` (a subset), with dmlkit's split interface."""

    transform = None  # the user's dataset applies its own transforms
    augmentation_seed = None

    def __init__(self, dataset: Any, rows: Sequence[int] | None = None, raw_labels: list | None = None,
                 name: str | None = None):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise DataError(f"A dataset must be a map-style Dataset (with __len__ and __getitem__). "
                            f"Got {type(dataset).__name__}.")
        self.dataset = dataset
        self.name = name or type(dataset).__name__
        raw = raw_labels if raw_labels is not None else read_labels(dataset)
        self.rows = torch.arange(len(raw)) if rows is None else torch.as_tensor(rows, dtype=torch.int64)
        self._raw = raw
        kept = [raw[i] for i in self.rows.tolist()]
        try:
            names = sorted(set(kept))
        except TypeError as exc:
            raise DataError(f"The labels of {self.name} must be comparable (ints or strings): {exc}") from None
        index = {value: i for i, value in enumerate(names)}
        self.labels = torch.tensor([index[v] for v in kept], dtype=torch.int64)
        self.class_names = [str(v) for v in names]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.dataset[int(self.rows[index])][0]
        if not isinstance(image, torch.Tensor):
            raise DataError(f"{self.name} returned a {type(image).__name__} image; the model needs a tensor "
                            "(add transforms.ToTensor() or similar to the dataset).")
        return image, int(self.labels[index])

    def subset(self, indices: torch.Tensor, *, relabel: bool = True) -> "UserDataset":
        """The items ``indices`` of this split (labels renumbered over the classes they keep)."""
        return UserDataset(self.dataset, self.rows[torch.as_tensor(indices, dtype=torch.int64)], self._raw, self.name)

    def sample_images(self, count: int) -> torch.Tensor:
        """Up to ``count`` evenly spaced images as float ``[n, C, 64, 64]`` (the recipe's first look).

        A dataset with its own ``sample_images(count)`` (stored features: ``[n, F, 1, 1]``) gives its own look.
        """
        own = getattr(self.dataset, "sample_images", None)
        if own is not None and len(self.rows) == len(self.dataset):
            return own(count)
        step = max(1, len(self) // count)
        images = torch.stack([self[i][0].float() for i in range(0, len(self), step)[:count]])
        return torch.nn.functional.interpolate(images, size=(64, 64), mode="bilinear", align_corners=False)


def user_splits(train: Any, val: Any = None, test: Any = None):
    """:class:`~dmlkit.data.base.DataSplits` of the user's datasets (``None`` for a missing split)."""
    from dmlkit.data.base import DataSplits, ImageFileDataset, TensorImageDataset

    def wrap(dataset):  # dmlkit's own splits are used as they are
        keep = dataset is None or isinstance(dataset, (UserDataset, ImageFileDataset, TensorImageDataset))
        return dataset if keep else UserDataset(dataset)

    return DataSplits(name=f"user:{type(train).__name__}", train=wrap(train), val=wrap(val), test=wrap(test))


__all__ = ["UserDataset", "read_labels", "user_splits"]
