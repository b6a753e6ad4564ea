"""The run's batched training augmentation from ``data.augment`` (and a paper pipeline's crops), filled with the
background as the model sees it."""

from __future__ import annotations

import torch

from dmlkit.config.schema import RunConfig


def build_batch_augmentation(cfg: RunConfig, fill: list[float]):
    """The batched training augmentation of ``data.augment`` (None for ``none``), called with a generator.

    ``crop`` with a paper ``data.pipeline`` is that pipeline's training crop of the stored views
    (:meth:`~dmlkit.data.transforms.PhotoPipeline.train_batch`); ``fill`` is the background as the
    model sees it (the affine warp's fill).
    """
    from dmlkit.data.transforms import batch_augmentation, photo_pipeline

    d = cfg.data
    if d.augment == "crop" and d.pipeline != "recipe":
        return photo_pipeline(d.pipeline, d.image_size, d.crop_size).train_batch()
    return batch_augmentation(d.augment, d.max_shift, fill=fill, crop_size=d.crop_size)


def background_fill(splits, background) -> list[float]:
    """The batch augmentation's fill: ``background`` (per channel, as the data holds it) after the training split's
    normalisation, as the model sees it."""
    background = torch.tensor(background).view(1, -1, 1, 1)
    transform = splits.train.transform
    return (transform(background) if getattr(transform, "batched", False) else background).flatten().tolist()


__all__ = ["background_fill", "build_batch_augmentation"]
