"""A user's map-style Dataset of (image, label) as a dmlkit split."""

import pytest
import torch

from dmlkit.data.base import TensorImageDataset
from dmlkit.data.user import UserDataset, read_labels, user_splits
from dmlkit.exceptions import DataError


class Plain(torch.utils.data.Dataset):
    """No .labels/.targets: labels come from one pass over the items."""

    def __init__(self, labels):
        self.items = [(torch.full((1, 4, 4), float(i)), label) for i, label in enumerate(labels)]
        self.reads = 0

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        self.reads += 1
        return self.items[i]


def test_labels_from_one_pass_become_sorted_int64_ids():
    data = Plain(["cat", "dog", "cat", "ant"])
    split = UserDataset(data)
    assert data.reads == 4
    assert split.labels.dtype == torch.int64 and split.labels.tolist() == [1, 2, 1, 0]
    assert split.class_names == ["ant", "cat", "dog"]
    image, label = split[1]
    assert torch.equal(image, torch.full((1, 4, 4), 1.0)) and label == 2


def test_targets_are_read_without_a_pass_and_subsets_renumber_their_classes():
    data = Plain([7, 3, 7, 9])
    data.targets = torch.tensor([7, 3, 7, 9])
    data.reads = 0
    split = UserDataset(data)
    assert data.reads == 0 and split.labels.tolist() == [1, 0, 1, 2]
    part = split.subset(torch.tensor([0, 2, 3]))
    assert part.labels.tolist() == [0, 0, 1] and part.class_names == ["7", "9"]
    assert torch.equal(part[2][0], torch.full((1, 4, 4), 3.0))  # item 3 of the user's dataset
    assert part.sample_images(2).shape == (2, 1, 64, 64)


def test_bad_items_are_data_errors_naming_the_dataset():
    data = Plain([0, 1])
    data.targets = [0, 1, 2]
    with pytest.raises(DataError, match=r"Plain\.targets has 3 entries but the dataset has 2 items"):
        UserDataset(data)
    data.items[0] = (torch.zeros(1, 4, 4),)
    del data.targets
    with pytest.raises(DataError, match=r"Plain\[0\] must be an \(image, label\) pair"):
        read_labels(data)
    data.items[0] = ([[0.0]], 0)
    with pytest.raises(DataError, match="returned a list image"):
        UserDataset(data)[0]


def test_dmlkit_splits_are_used_as_they_are():
    own = TensorImageDataset(torch.zeros(4, 1, 4, 4, dtype=torch.uint8), torch.tensor([0, 0, 1, 1]), ["a", "b"])
    splits = user_splits(own, test=Plain([0, 1]))
    assert splits.train is own and isinstance(splits.test, UserDataset) and splits.val is None
