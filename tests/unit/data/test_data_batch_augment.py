"""Batched translation augmentation for in-memory data sets."""

import pytest
import torch

from dmlkit.data.transforms import RandomTranslate, batch_augmentation
from dmlkit.exceptions import InvalidParameterError


def reference_shift(img: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """Loop reference: out[y, x] = img[clamp(y - dy), clamp(x - dx)] (border repeated)."""
    c, h, w = img.shape
    out = torch.empty_like(img)
    for y in range(h):
        for x in range(w):
            out[:, y, x] = img[:, min(max(y - dy, 0), h - 1), min(max(x - dx, 0), w - 1)]
    return out


def test_matches_loop_reference_with_the_same_draws():
    images = torch.randn(6, 2, 5, 7)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    out = RandomTranslate(2)(images, g1)
    shifts = torch.randint(-2, 3, (6, 2), generator=g2)
    for i in range(6):
        assert torch.equal(out[i], reference_shift(images[i], int(shifts[i, 0]), int(shifts[i, 1])))


def test_same_generator_seed_same_result_and_zero_shift_is_identity():
    images = torch.rand(4, 1, 28, 28)
    a = RandomTranslate(3)(images, torch.Generator().manual_seed(1))
    b = RandomTranslate(3)(images, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, images)
    assert torch.equal(RandomTranslate(0)(images), images)


def test_factory_and_validation():
    assert batch_augmentation("none") is None
    assert isinstance(batch_augmentation("translate", 1), RandomTranslate)
    with pytest.raises(InvalidParameterError, match="data.augment must be one of"):
        batch_augmentation("rotate")
    with pytest.raises(InvalidParameterError, match="'max_shift' parameter of RandomTranslate"):
        RandomTranslate(-1)


def test_one_module_over_batches_of_other_shapes_matches_the_loop_reference():
    """The index grids are kept between batches: a batch of another shape gets its own."""
    translate = RandomTranslate(2)
    for seed, shape in enumerate([(5, 3, 9, 7), (3, 3, 9, 7), (5, 1, 6, 11), (5, 3, 9, 7)]):
        images = torch.rand(shape, dtype=torch.float64)
        out = translate(images, torch.Generator().manual_seed(seed))
        shifts = torch.randint(-2, 3, (shape[0], 2), generator=torch.Generator().manual_seed(seed))
        for i in range(shape[0]):
            assert torch.equal(out[i], reference_shift(images[i], int(shifts[i, 0]), int(shifts[i, 1])))
