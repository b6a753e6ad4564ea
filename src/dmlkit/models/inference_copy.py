"""The copy of a model that the embedding loop runs: batch norm folded into the convolution before it,
the activation fused into it, and batches run in chunks whose activations the allocator reuses.

In eval mode a batch-norm layer is a fixed per-channel affine map, ``y = s * x + t`` with
``s = gamma / sqrt(running_var + eps)`` and ``t = beta - running_mean * s``. Applied to a
convolution's output it folds into that convolution: weights ``s * W`` (per output channel), bias
``s * b + t``. On a CPU the folded convolution and the activation after it (ReLU, ReLU6, SiLU,
Hardswish, GELU) then run as one oneDNN primitive, and TensorFlow's asymmetric "same" padding
(timm's ``Conv2dSame``, which pads a copy of the input first) becomes symmetric padding of a kernel
with one leading zero row or column. ``benchmarks/bench_photos.py`` measures the embedding speed.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

#: Largest relative difference accepted between the copy and the model (fp32, probe batch).
FOLD_TOLERANCE = 1e-4
#: Largest activation (bytes) of one forward chunk on a CPU. glibc's malloc hands blocks above
#: 32 MiB out as fresh zero-filled pages from the kernel at every call; the page faults cost more
#: than the convolutions of EfficientNet-Lite0 at batch 64, 160 px (benchmarks/bench_photos.py).
CHUNK_BYTES = 24 * 2**20


@contextlib.contextmanager
def _largest_output(model: nn.Module, images: int) -> Iterator[list[int]]:
    """While open, ``[n]``: the most elements per image (of ``images`` in the batch) any module of ``model`` has
    output so far (per input image: flip averaging runs 2 images per image)."""
    largest = [0]

    def record(module, args, out) -> None:
        if isinstance(out, torch.Tensor):
            largest[0] = max(largest[0], out.numel() // max(1, images))

    hooks = [module.register_forward_hook(record) for module in model.modules()]
    try:
        yield largest
    finally:
        for hook in hooks:
            hook.remove()


def _conv_batch_norm_pairs(
    model: nn.Module, probe: torch.Tensor
) -> tuple[list[tuple[nn.Conv2d, nn.BatchNorm2d]], int, torch.Tensor]:
    """``(conv, bn)`` pairs where ``bn`` reads exactly the output of ``conv`` in a forward pass of
    ``probe``, the largest number of elements per image of any layer's output, and the output."""
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
        with torch.no_grad(), _largest_output(model, len(probe)) as largest:
            output = model(probe)
    finally:
        for hook in hooks:
            hook.remove()
    first: dict[int, tuple[nn.Conv2d, nn.BatchNorm2d]] = {}
    for conv, bn in pairs:  # a layer run twice in one pass (flip or shift averaging) is folded once
        first.setdefault(id(bn), (conv, bn))
    return list(first.values()), largest[0], output


def _onednn_post_op(act: nn.Module | None) -> tuple[str, list[float], str] | None:
    """oneDNN post-op ``(attribute, scalars, algorithm)`` running ``act`` (None: not one oneDNN runs)."""
    if act is None:
        return "none", [], ""
    if type(act) is nn.ReLU:
        return "relu", [], ""
    if type(act) is nn.ReLU6:
        return "hardtanh", [0.0, 6.0], ""
    if type(act) is nn.Hardtanh:
        return "hardtanh", [float(act.min_val), float(act.max_val)], ""
    if type(act) is nn.SiLU:
        return "swish", [], ""
    if type(act) is nn.Hardswish:
        return "hardswish", [], ""
    if type(act) is nn.GELU:
        return "gelu", [], act.approximate
    return None


def _onednn_ready() -> bool:
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise"))


class FoldedConv2d(nn.Module):
    """A convolution with its batch norm folded in and the activation after it fused.

    ``tf_same`` marks TensorFlow "same" padding (pad ``p = max((ceil(n / s) - 1) * s + k - n, 0)``,
    ``p // 2`` before and the rest after, per spatial dimension). Where ``p`` is odd the kernel gets
    one leading zero in that dimension and symmetric padding ``(p + 1) // 2``: the same windows,
    without a padded copy of the input. On a CPU without autograd the product and the activation
    run as one oneDNN primitive (``torch.ops.mkldnn._convolution_pointwise``), in the autocast dtype
    when autocast is on (bf16 only where oneDNN computes it); anywhere else as
    ``F.conv2d`` followed by the activation module.
    """

    def __init__(self, conv: nn.Conv2d, weight: torch.Tensor, bias: torch.Tensor, act: nn.Module | None,
                 tf_same: bool):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.stride, self.dilation, self.groups = tuple(conv.stride), tuple(conv.dilation), conv.groups
        self.padding = (0, 0) if tf_same else tuple(conv.padding)
        self.tf_same = tf_same
        self.act = act
        self.post_op = _onednn_post_op(act)
        self._kernels: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (dtype, extended) -> (weight, bias)

    def _layout(self, x: torch.Tensor) -> tuple[tuple[int, int], tuple[bool, bool]]:
        """Symmetric padding and which dimensions get a leading zero, for input ``x``."""
        if not self.tf_same:
            return self.padding, (False, False)
        pads, extend = [], []
        for n, k, s, d in zip(x.shape[-2:], self.weight.shape[-2:], self.stride, self.dilation):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            extend.append(total % 2 == 1)
            pads.append((total + 1) // 2)
        return (pads[0], pads[1]), (extend[0], extend[1])

    def _extended(self, extend: tuple[bool, bool]) -> torch.Tensor:
        """The weight with one leading zero row / column where ``extend`` says so."""
        return F.pad(self.weight, (int(extend[1]), 0, int(extend[0]), 0)) if any(extend) else self.weight

    def _kernel(self, dtype: torch.dtype, extend: tuple[bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """Weight (extended, channels-last) and bias in ``dtype`` for the oneDNN primitive, made once."""
        key = (dtype, *extend)
        if key not in self._kernels:
            self._kernels[key] = (self._extended(extend).to(dtype).contiguous(memory_format=torch.channels_last),
                                  self.bias.to(dtype))
        return self._kernels[key]

    def _onednn_dtype(self, x: torch.Tensor) -> torch.dtype | None:
        if (x.device.type != "cpu" or torch.is_grad_enabled() or self.post_op is None or not _onednn_ready()
                or (self.tf_same and self.dilation != (1, 1))):
            return None
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        if dtype == torch.float32:
            return dtype
        if dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return dtype
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self._onednn_dtype(x)
        if dtype is None:
            if self.tf_same and self.dilation != (1, 1):
                from timm.layers import pad_same

                x = pad_same(x, self.weight.shape[-2:], self.stride, self.dilation)
                padding = (0, 0)
                weight = self.weight
            else:
                padding, extend = self._layout(x)
                weight = self._extended(extend)
            y = F.conv2d(x, weight, self.bias, self.stride, padding, self.dilation, self.groups)
            return y if self.act is None else self.act(y)
        padding, extend = self._layout(x)
        weight, bias = self._kernel(dtype, extend)
        attr, scalars, algorithm = self.post_op
        return torch.ops.mkldnn._convolution_pointwise(
            x.to(dtype), weight, bias, list(padding), list(self.stride), list(self.dilation), self.groups,
            attr, scalars, algorithm)


def _is_tf_same(conv: nn.Conv2d) -> bool:
    return type(conv).__name__ == "Conv2dSame" and type(conv).__module__.startswith("timm.")


def _fusable(conv: nn.Conv2d) -> bool:
    return (conv.padding_mode == "zeros" and not isinstance(conv.padding, str)
            and (type(conv) is nn.Conv2d or _is_tf_same(conv)))


def _folded(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of ``conv`` followed by eval-mode ``bn``."""
    with torch.no_grad():
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps) if bn.affine else 1 / torch.sqrt(bn.running_var + bn.eps)
        shift = (bn.bias if bn.affine else 0) - bn.running_mean * scale
        weight = conv.weight * scale.reshape(-1, 1, 1, 1).to(conv.weight.dtype)
        bias = shift if conv.bias is None else conv.bias * scale + shift
        return weight, bias.to(conv.weight.dtype)


def _after_batch_norm(bn: nn.BatchNorm2d) -> tuple[nn.Module | None, nn.Module | None]:
    """What is left of ``bn`` once its affine map is folded (timm's ``BatchNormAct2d`` keeps its drop
    and act): ``(activation to fuse, modules to keep)``, one of them None."""
    drop, act = getattr(bn, "drop", None), getattr(bn, "act", None)
    drop = drop if isinstance(drop, nn.Module) and not isinstance(drop, (nn.Identity, nn.Dropout)) else None
    act = act if isinstance(act, nn.Module) and not isinstance(act, nn.Identity) else None
    if drop is None and (act is None or _onednn_post_op(act) is not None):
        return act, None
    rest = [m for m in (drop, act) if m is not None]
    return None, nn.Sequential(*rest)


class InferenceCopy(nn.Module):
    """What :func:`inference_copy` returns: ``model`` (the folded copy, or the model itself when
    nothing folded) run on at most ``chunk_size`` images at a time (``None``: whole batches), the
    outputs concatenated. The embedding loop runs an ``InferenceCopy`` it is given as it is, so a
    caller whose model does not change (:class:`dmlkit.inference.RunEmbedder`) makes it once."""

    def __init__(self, model: nn.Module, chunk_size: int | None):
        super().__init__()
        self.model, self.chunk_size = model, chunk_size
        self.train(False)  # what embed_dataset restores after a call: the copy (and a model it runs) stays in eval mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.chunk_size is None or len(x) <= self.chunk_size:
            return self.model(x)
        return torch.cat([self.model(chunk) for chunk in x.split(self.chunk_size)])


def chunk_size(elements_per_image: int, dtype: torch.dtype) -> int:
    """Images per forward chunk: the largest activation stays within :data:`CHUNK_BYTES`."""
    return max(1, CHUNK_BYTES // max(1, elements_per_image * torch.empty(0, dtype=dtype).element_size()))


def chunk_for(model: nn.Module, run: Callable[[torch.Tensor], Any], image: torch.Tensor,
              dtype: torch.dtype | None = None) -> int:
    """Images per call of ``run`` (a pass through ``model``'s modules, without gradients) on a CPU: the largest
    output of any module for the one-image batch ``image``, kept within :data:`CHUNK_BYTES` (:func:`chunk_size`).

    Whole batches of photos at 224 px cost about twice as much per image as such chunks (fresh zero-filled pages
    for every large activation: the feature cache's build through EfficientNet-Lite2's 4 frozen stages, batches of
    64, 23.7 against 10.9 ms an image-view, ``benchmarks/bench_feature_cache.py``)."""
    with torch.no_grad(), _largest_output(model, len(image)) as largest:
        run(image)
    return chunk_size(largest[0], dtype if dtype is not None else image.dtype)


def _same_output(got: torch.Tensor, want: torch.Tensor) -> bool:
    scale = float(want.abs().max().clamp_min(1e-12))
    return bool(torch.allclose(got.float(), want.float(), rtol=FOLD_TOLERANCE, atol=FOLD_TOLERANCE * scale))


def inference_copy(
    model: nn.Module, probe: torch.Tensor, autocast_dtype: torch.dtype | None = None
) -> InferenceCopy:
    """An eval-mode copy of ``model`` for embedding: every batch norm that directly follows a
    convolution folded into it (with its activation fused), and on a CPU batches run in chunks of
    :func:`chunk_size` images (``autocast_dtype``: the dtype the activations will have).

    ``probe`` is the first input batch, used to find the pairs and the activation sizes and to check
    the copy on two images (a single image is paired with its mirror): if its fp32 output differs
    from the model's by more than :data:`FOLD_TOLERANCE` (relative; for example a convolution whose
    output also feeds another layer), the folding is dropped and the copy runs ``model`` itself;
    if outputs depend on the batch (batch norm with ``track_running_stats=False``), so is the chunking.
    """
    key = (tuple(probe.shape[1:]), probe.device.type, autocast_dtype)
    known = _NOTHING_TO_FOLD.get(model, {})
    if key in known:  # found before: this model's structure has nothing to fold (its weights do not matter)
        return InferenceCopy(model, known[key])
    folded = copy.deepcopy(model).eval()  # eval mode: its output is the model's in eval mode
    two = probe[:2] if len(probe) > 1 else torch.cat([probe, probe.flip(-1)])
    with torch.no_grad(), torch.autocast(probe.device.type, enabled=False):
        found, elements, want = _conv_batch_norm_pairs(folded, two)
    pairs = [(c, b) for c, b in found
             if b.track_running_stats and b.running_mean is not None and c.out_channels == b.num_features]
    parents = {id(child): (parent, name) for parent in folded.modules() for name, child in parent.named_children()}
    for conv, bn in pairs:
        weight, bias = _folded(conv, bn)
        act, rest = _after_batch_norm(bn)
        conv_parent, conv_name = parents[id(conv)]
        if _fusable(conv):
            setattr(conv_parent, conv_name, FoldedConv2d(conv, weight, bias, act, _is_tf_same(conv)))
        else:
            with torch.no_grad():
                conv.weight.copy_(weight)
            conv.bias = nn.Parameter(bias, requires_grad=False)
            rest = rest if act is None else act
        bn_parent, bn_name = parents[id(bn)]
        setattr(bn_parent, bn_name, rest if rest is not None else nn.Identity())
    with torch.no_grad(), torch.autocast(probe.device.type, enabled=False):
        got = folded(two) if pairs else want
        runner = folded if pairs and _same_output(got, want) else model
        alone = runner(two[:1])  # image 0 without image 1: are the outputs independent of the batch?
    dtype = autocast_dtype if autocast_dtype is not None and probe.device.type == "cpu" else probe.dtype
    chunked = probe.device.type == "cpu" and _same_output(alone, want[:1])
    size = chunk_size(elements, dtype) if chunked else None
    if not found:  # no convolution followed by a batch norm (the small CNN pools in between): remember it
        _NOTHING_TO_FOLD.setdefault(model, {})[key] = size
    return InferenceCopy(runner, size)


#: Models found to have no convolution -> batch norm pair, with their chunk size per input shape: a
#: model's structure does not change between the validations of a run, so the search (a deep copy and
#: two traced forward passes, a large share of a small glyph model's validation) is made once.
_NOTHING_TO_FOLD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
