"""The base class every dmlkit loss derives from.

``loss(embeddings, labels, **kwargs)`` validates its inputs, turns off autocast and upcasts
half-precision inputs so the loss is accumulated in fp32, then hands over to
``compute_loss``. A batch with nothing to learn from returns :func:`zero_loss`, which stays
connected to the autograd graph.
"""

from __future__ import annotations

import torch
from torch import nn

from dmlkit._registry import Registry
from dmlkit._validation import check_embeddings_labels

LOSSES: Registry[nn.Module] = Registry("loss")


def zero_loss(*tensors: torch.Tensor) -> torch.Tensor:
    """A scalar 0 that depends on ``tensors`` so ``backward()`` works and yields zero gradients."""
    total = None
    for t in tensors:
        if t is not None and t.requires_grad:
            term = (t * 0).sum()
            total = term if total is None else total + term
    if total is None:
        ref = tensors[0]
        return torch.zeros((), dtype=torch.float32 if not ref.is_floating_point() else ref.dtype, device=ref.device)
    return total


def as_fp32(x: torch.Tensor) -> torch.Tensor:
    """Upcast fp16/bf16 to fp32; leave fp32/fp64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class MetricLoss(nn.Module):
    """Base of every loss: ``forward(embeddings [B, D], labels [B], **kwargs) -> scalar``."""

    #: False for losses that accept ``labels=None`` with an explicit ``pos_mask``.
    requires_labels: bool = True

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        check_embeddings_labels(embeddings, labels)
        if labels is None and self.requires_labels and kwargs.get("pos_mask") is None:
            raise ValueError(f"{type(self).__name__} needs labels (or an explicit pos_mask).")
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            return self.compute_loss(as_fp32(embeddings), labels, **kwargs)

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor | None, **kwargs) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def extra_repr(self) -> str:
        keys = getattr(self, "_repr_keys", ())
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in keys)
