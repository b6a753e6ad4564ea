"""The inference copy's fused convolution (TF "same" padding made symmetric, activation fused as a
oneDNN post-op) and its chunked forward, against references written from the definitions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Conv2dSame
from torch import nn

from dmlkit.models import inference_copy as ic
from dmlkit.models.inference_copy import FoldedConv2d, chunk_size, inference_copy


def _tf_same_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int,
                       groups: int = 1) -> torch.Tensor:
    """TensorFlow's SAME: output ceil(n / s); total padding max((out - 1) * s + k - n, 0), the smaller half first."""
    pads = []
    for n, k in zip(x.shape[-2:], weight.shape[-2:]):
        out = math.ceil(n / stride)
        total = max((out - 1) * stride + k - n, 0)
        pads.append((total // 2, total - total // 2))
    padded = F.pad(x, (pads[1][0], pads[1][1], pads[0][0], pads[0][1]))
    return F.conv2d(padded, weight, bias, stride, groups=groups)


def _folded(conv: nn.Conv2d, act: nn.Module | None, tf_same: bool) -> FoldedConv2d:
    return FoldedConv2d(conv, conv.weight.detach(), conv.bias.detach(), act, tf_same)


@pytest.mark.parametrize("size", [(16, 16), (15, 15), (16, 13), (9, 10)])
@pytest.mark.parametrize("kernel, stride, groups", [(3, 2, 1), (5, 2, 4), (3, 1, 4), (5, 1, 1), (1, 1, 1)])
def test_tf_same_padding_without_a_padded_copy_matches_tensorflow_same(size, kernel, stride, groups):
    torch.manual_seed(0)
    conv = Conv2dSame(4, 8, kernel, stride=stride, groups=groups, bias=True).double()
    x = torch.randn(2, 4, *size, dtype=torch.float64)
    want = _tf_same_reference(x, conv.weight.detach(), conv.bias.detach(), stride, groups)
    folded = _folded(conv, None, tf_same=True)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), want, rtol=1e-12, atol=1e-12)  # float64: the torch path
        got32 = folded.float()(x.float())  # float32 without autograd: the oneDNN primitive
    torch.testing.assert_close(got32.double(), want, rtol=1e-5, atol=1e-5)


ACTIVATIONS = [
    (nn.ReLU(), lambda y: y.clamp_min(0)),
    (nn.ReLU6(), lambda y: y.clamp(0, 6)),
    (nn.Hardtanh(-1.0, 2.0), lambda y: y.clamp(-1, 2)),
    (nn.SiLU(), lambda y: y / (1 + torch.exp(-y))),
    (nn.Hardswish(), lambda y: y * (y + 3).clamp(0, 6) / 6),
    (nn.GELU(), lambda y: 0.5 * y * (1 + torch.erf(y / math.sqrt(2)))),
    (nn.GELU(approximate="tanh"), lambda y: 0.5 * y * (1 + torch.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))),
]


@pytest.mark.parametrize("act, reference", ACTIVATIONS, ids=lambda a: type(a).__name__ if isinstance(a, nn.Module) else "")
def test_every_fused_activation_equals_its_definition_after_the_convolution(act, reference):
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 6, 3, padding=1, bias=True)
    with torch.no_grad():
        conv.weight.mul_(4)  # pre-activations across every piece of the activations (clamps at 0, 2, 6)
    x = torch.randn(2, 3, 12, 12)
    want = reference(F.conv2d(x.double(), conv.weight.double(), conv.bias.double(), padding=1))
    folded = _folded(conv, act, tf_same=False)
    assert folded.post_op is not None
    with torch.no_grad():
        got = folded(x)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_bf16_autocast_runs_the_fused_convolution_in_bf16_close_to_fp32():
    torch.manual_seed(2)
    conv = Conv2dSame(8, 16, 3, stride=2, bias=True)
    x = torch.randn(4, 8, 20, 20).contiguous(memory_format=torch.channels_last)
    want = _tf_same_reference(x.double(), conv.weight.double(), conv.bias.double(), 2).clamp(0, 6)
    folded = _folded(conv, nn.ReLU6(), tf_same=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = folded(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=3e-2, atol=3e-2)


def test_with_autograd_on_the_copy_falls_back_to_differentiable_layers():
    conv = nn.Conv2d(2, 3, 3, padding=1)
    folded = _folded(conv, nn.ReLU(), tf_same=False)
    x = torch.randn(1, 2, 6, 6, requires_grad=True)
    folded(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


class _Wide(nn.Module):
    """Conv + batch norm + ReLU6 at full resolution: activations of 8 * 32 * 32 elements an image."""

    def __init__(self, track: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8, track_running_stats=track)
        self.act = nn.ReLU6()

    def forward(self, x):
        return self.act(self.bn(self.conv(x))).mean(dim=(2, 3))


def test_chunk_size_keeps_the_largest_activation_within_the_byte_budget():
    assert chunk_size(614_400, torch.bfloat16) == ic.CHUNK_BYTES // (614_400 * 2)
    assert chunk_size(614_400, torch.float32) == ic.CHUNK_BYTES // (614_400 * 4)
    assert chunk_size(10**9, torch.float32) == 1


def test_large_batches_run_in_chunks_with_the_same_output(monkeypatch):
    monkeypatch.setattr(ic, "CHUNK_BYTES", 8 * 32 * 32 * 4 * 3)  # three images' largest activation, fp32
    torch.manual_seed(3)
    model = _Wide().eval()
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(10, 3, 32, 32)
    runner = inference_copy(model, x)
    assert runner.chunk_size == 3
    calls = []
    runner.model.register_forward_pre_hook(lambda mod, args: calls.append(len(args[0])))
    with torch.no_grad():
        torch.testing.assert_close(runner(x), model(x), rtol=1e-5, atol=1e-6)
    assert calls == [3, 3, 3, 1]


def test_a_model_whose_output_depends_on_the_batch_is_not_chunked(monkeypatch):
    monkeypatch.setattr(ic, "CHUNK_BYTES", 8 * 32 * 32 * 4)
    model = _Wide(track=False).eval()  # batch statistics even in eval mode
    runner = inference_copy(model, torch.randn(6, 3, 32, 32))
    assert runner.chunk_size is None


def test_a_model_with_nothing_to_fold_is_searched_once(monkeypatch):
    from dmlkit.models import inference_copy as module

    pooled = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.MaxPool2d(2), nn.BatchNorm2d(8), nn.ReLU()).eval()
    x = torch.randn(4, 3, 16, 16)
    first = module.inference_copy(pooled, x)
    assert first.model is pooled  # conv -> pool -> BN: no pair to fold, the model itself runs

    def no_search(*args):
        raise AssertionError("searched again")

    monkeypatch.setattr(module, "_conv_batch_norm_pairs", no_search)
    with torch.no_grad():
        pooled[0].weight.mul_(2.0)  # new weights (a later validation): the copy is still the model itself
        again = module.inference_copy(pooled, x)
        assert again.model is pooled and again.chunk_size == first.chunk_size
        torch.testing.assert_close(again(x), pooled(x))
    folded = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    with pytest.raises(AssertionError, match="searched again"):  # a model with pairs is folded anew every time
        module.inference_copy(folded, x)
