"""Training and evaluation inputs on a GPU: where the images live, how they travel, their memory format.

On a CUDA device (``train.device``) the engine keeps the card busy:

* an in-memory split (photos decoded once, glyphs, digits) whose transform is batched moves to the
  card once (:func:`resident_on`: a shallow copy of the split with its images there, when they take
  at most :data:`RESIDENT_SHARE` of the free memory); its batches are indexed, normalised and
  augmented there (the batched crop-and-flip, translate and affine warp are tensor operations whose
  random numbers are drawn on the CPU from the batch's seeded generator, so a GPU run draws what a
  CPU run draws);
* anything else arriving from the CPU (batches of a split too large for the card, images decoded
  by DataLoader workers with ``pin_memory=True``, labels) is copied from page-locked memory without
  blocking (:func:`to_device`);
* convolutional models use the ``channels_last`` memory format (:func:`uses_channels_last`), the
  layout the card's convolution kernels run fastest in (bf16 autocast comes from
  ``train.mixed_precision=auto``, :func:`dmlkit.engine.device.native_bf16`).

On the CPU every function here returns its input: the CPU path is unchanged.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from dmlkit.core.devices import host_to_device

#: An in-memory split moves to the GPU when its images take at most this share of the free memory.
RESIDENT_SHARE = 0.5


def resident_on(dataset, device: torch.device):
    """``dataset`` with its images on ``device`` (a shallow copy; the split itself keeps its CPU images),
    or ``dataset`` itself: on the CPU, for data read per file, with a per-item transform, or when the
    images would take more than :data:`RESIDENT_SHARE` of a CUDA device's free memory."""
    images = getattr(dataset, "images", None)
    if device.type == "cpu" or not isinstance(images, torch.Tensor) or not hasattr(dataset, "get_batch"):
        return dataset
    transform = getattr(dataset, "transform", None)
    if images.device == device or transform is not None and not getattr(transform, "batched", False):
        return dataset
    if device.type == "cuda" and images.numel() * images.element_size() > RESIDENT_SHARE * torch.cuda.mem_get_info(device)[0]:
        return dataset
    resident = copy.copy(dataset)
    resident.images = images.to(device)
    if isinstance(transform, nn.Module):
        resident.transform = copy.deepcopy(transform).to(device)
    return resident


def to_device(tensor: torch.Tensor, device: torch.device, pin: bool) -> torch.Tensor:
    """``tensor`` on ``device``; from the CPU with ``pin`` through page-locked memory, without blocking
    (:func:`dmlkit.core.devices.host_to_device`)."""
    return host_to_device(tensor, device, pin)


def uses_channels_last(model: nn.Module, device: torch.device) -> bool:
    """Whether ``model`` runs in ``channels_last`` on ``device``: a model with 2-D convolutions on CUDA."""
    return device.type == "cuda" and any(isinstance(m, nn.Conv2d) for m in model.modules())
