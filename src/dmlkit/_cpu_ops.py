"""CPU fast paths of the fused losses and the distances: ``exp`` for the large exponential passes,
and the skinny ``[N, D] x [D, B]`` products (``N >> B``) through oneDNN.

**exp.** One place for the exponential passes of the fused losses. With the PyTorch of session 3,
``torch.exp2`` of fp32 ran several times faster than ``torch.exp`` on CPU, so ``exp(x)`` was
computed as ``2^(x log2 e)``. With PyTorch 2.14 (AVX512) ``torch.exp`` is vectorised and the
faster of the two, without the extra multiply: 17 against 35 us for 256 x 256 fp32 logits in
place, 0.74 against 1.14 ms for 128 x 11,318, one thread (docs/results.md, issue 30 speed), so
``exp`` is ``torch.exp`` again, on every device.

**Products.** :func:`matmul_nt` computes ``a @ b.T`` with oneDNN's linear on CPU (fp32, bf16): for
the skinny ``[P, 128] x [128, 128]`` and ``[44800, 128] x [128, 32]`` shapes of the proxy and memory
losses it is faster than ``torch.mm`` (MKL), with bitwise-equal fp32 results (docs/results.md).
"""

from __future__ import annotations

import torch


def exp_(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` in place (see the module docstring)."""
    return x.exp_()


def exp(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` in a new tensor (see the module docstring)."""
    return torch.exp(x)


_onednn_linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
_use_onednn = [torch.backends.mkldnn.is_available() and _onednn_linear is not None]


def matmul_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` for ``a [M, K]`` and ``b [N, K]`` with ``M >> N`` (oneDNN on CPU, else ``torch.mm``).

    Falls back to ``torch.mm`` for other dtypes and devices, when autograd records the call
    (oneDNN's linear has no derivative), and for good if oneDNN refuses a call.
    """
    tracked = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    fast_dtype = a.dtype in (torch.float32, torch.bfloat16) and b.dtype == a.dtype
    if _use_onednn[0] and not tracked and fast_dtype and a.device.type == "cpu":
        try:
            return _onednn_linear(a.contiguous(), b.contiguous(), None, "none", [], "")
        except RuntimeError:  # pragma: no cover - a build without a usable oneDNN linear
            _use_onednn[0] = False
    return torch.mm(a, b.T)


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 natively through oneDNN (AVX512-BF16 or AMX)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
