"""CPU fast paths of the fused losses and the distances: ``exp`` for the large exponential passes,
and the skinny ``[N, D] x [D, B]`` products (``N >> B``) through oneDNN.

**exp.** One place for the exponential passes of the fused losses. With an earlier PyTorch,
``torch.exp2`` of fp32 ran several times faster than ``torch.exp`` on CPU, so ``exp(x)`` was
computed as ``2^(x log2 e)``. With PyTorch 2.14 (AVX512) ``torch.exp`` is vectorised and the
faster of the two, without the extra multiply: 17 against 35 us for 256 x 256 fp32 logits in
place, 0.74 against 1.14 ms for 128 x 11,318, one thread (an interleaved A/B in one process), so
``exp`` is ``torch.exp`` again, on every device.

**Products.** :func:`matmul_nt` computes ``a @ b.T`` with oneDNN's linear on CPU (fp32, bf16): for
the skinny ``[P, 128] x [128, 128]`` and ``[44800, 128] x [128, 32]`` shapes of the proxy and memory
losses it is faster than ``torch.mm`` (MKL), with bitwise-equal fp32 results (2.2 against 2.6-3.1 ms at 11,318
proxies).
"""

from __future__ import annotations

import functools

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


#: CPU feature flags (``/proc/cpuinfo``) of bf16 arithmetic in hardware: x86 AVX512-BF16 and AMX, Arm's BF16.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str] | None:
    """The feature flags the kernel lists for this CPU (x86 ``flags``, Arm ``Features``); None where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 in hardware through oneDNN (AVX512-BF16, AMX or Arm BF16).

    oneDNN also answers yes on AVX-512 CPUs without those instructions, where it emulates bf16 (a
    Lite0 forward pass 1.8x slower than float32, the MNIST default 1.9x), so where the kernel lists the
    CPU's flags they must name a bf16 instruction set; elsewhere oneDNN's answer stands.
    """
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    flags = cpu_flags()
    return True if flags is None else bool(flags & BF16_CPU_FLAGS)
