"""The copy of a model that the embedding loop runs: batch norm folded into the convolution before it.

In eval mode a batch-norm layer is a fixed per-channel affine map, ``y = s * x + t`` with
``s = gamma / sqrt(running_var + eps)`` and ``t = beta - running_mean * s``. Applied to a
convolution's output it folds into that convolution: weights ``s * W`` (per output channel), bias
``s * b + t``. On EfficientNet-Lite0 the 49 batch-norm layers were 30% of a bf16 forward pass on the
CPU (benchmarks/bench_photos.py measures the embedding speed).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

#: Largest relative difference accepted between the folded copy and the model (fp32, probe batch).
FOLD_TOLERANCE = 1e-4


def _conv_batch_norm_pairs(model: nn.Module, probe: torch.Tensor) -> list[tuple[nn.Conv2d, nn.BatchNorm2d]]:
    """``(conv, bn)`` pairs where ``bn`` reads exactly the output of ``conv`` in a forward pass of ``probe``."""
    produced: dict[int, tuple[nn.Conv2d, torch.Tensor]] = {}  # outputs kept alive: ids are not reused
    pairs: list[tuple[nn.Conv2d, nn.BatchNorm2d]] = []
    hooks = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):  # timm's Conv2dSame too: its padding comes before the product
            hooks.append(module.register_forward_hook(lambda mod, args, out: produced.__setitem__(id(out), (mod, out))))
        elif isinstance(module, nn.BatchNorm2d):
            hooks.append(module.register_forward_pre_hook(
                lambda mod, args: pairs.append((produced[id(args[0])][0], mod)) if id(args[0]) in produced else None))
    try:
        with torch.no_grad():
            model(probe)
    finally:
        for hook in hooks:
            hook.remove()
    first: dict[int, tuple[nn.Conv2d, nn.BatchNorm2d]] = {}
    for conv, bn in pairs:  # a layer run twice in one pass (flip or shift averaging) is folded once
        first.setdefault(id(bn), (conv, bn))
    return list(first.values())


def _fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
    with torch.no_grad():
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps) if bn.affine else 1 / torch.sqrt(bn.running_var + bn.eps)
        shift = (bn.bias if bn.affine else 0) - bn.running_mean * scale
        conv.weight.mul_(scale.reshape(-1, 1, 1, 1).to(conv.weight.dtype))
        bias = shift if conv.bias is None else conv.bias * scale + shift
        conv.bias = nn.Parameter(bias.to(conv.weight.dtype), requires_grad=False)


def _without_batch_norm(bn: nn.BatchNorm2d) -> nn.Module:
    """What is left of ``bn`` once its affine map is folded: timm's ``BatchNormAct2d`` keeps its drop and act."""
    rest = [m for m in (getattr(bn, "drop", None), getattr(bn, "act", None)) if isinstance(m, nn.Module)]
    return nn.Sequential(*rest) if rest else nn.Identity()


def inference_copy(model: nn.Module, probe: torch.Tensor) -> nn.Module:
    """An eval-mode copy of ``model`` with every batch norm that directly follows a convolution folded into it.

    ``probe`` is a small input batch (one or two images) used to find the pairs and to check the
    copy: if its fp32 output differs from the model's by more than :data:`FOLD_TOLERANCE` (relative;
    for example a convolution whose output also feeds another layer), ``model`` itself is returned.
    Batch norm in training mode (``track_running_stats=False``) is never folded.
    """
    probe = probe[:2]
    folded = copy.deepcopy(model).eval()
    pairs = [(c, b) for c, b in _conv_batch_norm_pairs(folded, probe)
             if b.track_running_stats and b.running_mean is not None and c.out_channels == b.num_features]
    if not pairs:
        return model
    parents = {id(child): (parent, name) for parent in folded.modules() for name, child in parent.named_children()}
    for conv, bn in pairs:
        _fold(conv, bn)
        parent, name = parents[id(bn)]
        setattr(parent, name, _without_batch_norm(bn))
    with torch.no_grad(), torch.autocast(probe.device.type, enabled=False):
        was_training = model.training
        model.eval()
        want = model(probe).float()
        model.train(was_training)
        got = folded(probe).float()
    if not torch.allclose(got, want, rtol=FOLD_TOLERANCE, atol=FOLD_TOLERANCE * float(want.abs().max().clamp_min(1e-12))):
        return model
    return folded
