"""Splits held in memory are resized once, with the same antialiased filter as image files (PIL)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from dmlkit.data.splits import _resize_images


def test_downsizing_in_memory_matches_pil_and_keeps_thin_strokes():
    images = np.full((105, 105), 255, dtype=np.uint8)
    images[10:95, 50] = 0  # a one-pixel pen stroke, as in Omniglot's 105x105 drawings
    images[30, 5:100] = 0
    got = _resize_images(torch.from_numpy(images)[None, None], 28)[0, 0].numpy().astype(int)
    pil = np.asarray(Image.fromarray(images).resize((28, 28), Image.BILINEAR), dtype=int)
    assert np.abs(got - pil).max() <= 2
    # without antialiasing most of a one-pixel stroke falls between the sampled pixels
    assert got.min() < 200 and (got < 230).sum() >= 2 * 22
