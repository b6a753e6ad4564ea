"""The CPU fast paths of the fused losses: ``exp`` against float64, and ``matmul_nt``."""

import pytest
import torch

import dmlkit.core.cpu_ops as cpu_ops_module
from dmlkit.core.cpu_ops import exp, exp_, matmul_nt


@pytest.mark.parametrize("bound", [1.0, 32.0, 80.0])
def test_fp32_relative_error_is_a_few_ulp_of_the_exponent(bound):
    x = torch.empty(200_000).uniform_(-bound, bound, generator=torch.Generator().manual_seed(0))
    ref = torch.exp(x.double())
    got = exp(x)
    assert got.dtype == torch.float32
    rel = ((got.double() - ref).abs() / ref).max().item()
    assert rel <= bound * 2.0**-24 + 2.0**-22  # rounding of x log2 e, plus exp2's own error


def test_fp64_is_exact_to_1e_13_and_special_values_pass_through():
    x = torch.linspace(-700, 700, 10_001, dtype=torch.float64)
    torch.testing.assert_close(exp(x), torch.exp(x), rtol=1e-13, atol=0)
    special = torch.tensor([float("-inf"), float("inf"), float("nan"), 0.0])
    out = exp(special)
    assert out[0] == 0 and out[1] == float("inf") and out[2].isnan() and out[3] == 1


def test_in_place_version_overwrites_its_argument():
    x = torch.tensor([0.0, 1.0, -2.0])
    same = exp_(x)
    assert same.data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, torch.exp(torch.tensor([0.0, 1.0, -2.0])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_matmul_nt_is_a_times_b_transposed_for_every_dtype_and_layout(dtype):
    g = torch.Generator().manual_seed(5)
    a = torch.randn(300, 16, generator=g).to(dtype)
    b = torch.randn(16, 24, generator=g).to(dtype).T  # a transposed (non-contiguous) [24, 16] view
    out = matmul_nt(a, b)
    assert out.shape == (300, 24) and out.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), a.double() @ b.double().T, rtol=tol, atol=tol)


def test_matmul_nt_falls_back_to_torch_mm(monkeypatch):
    a, b = torch.randn(50, 8), torch.randn(6, 8)
    monkeypatch.setattr(cpu_ops_module, "_use_onednn", [False])
    torch.testing.assert_close(cpu_ops_module.matmul_nt(a, b), a @ b.T)


def test_matmul_nt_under_autograd_has_the_mm_gradient():
    a = torch.randn(400, 8, requires_grad=True)
    b = torch.randn(5, 8, requires_grad=True)
    (matmul_nt(a, b) ** 2).sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    ((a @ b.T) ** 2).sum().backward()
    torch.testing.assert_close(ga, a.grad)
    torch.testing.assert_close(gb, b.grad)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (frozenset({"avx2", "avx512f", "avx512bw", "avx512_vnni"}), False),  # oneDNN emulates bf16 here
        (frozenset({"avx512f", "avx512_bf16"}), True),
        (frozenset({"avx512f", "amx_bf16", "amx_tile"}), True),
        (frozenset({"fp", "asimd", "bf16"}), True),  # Arm
        (None, True),  # flags unknown: oneDNN's answer stands
    ],
)
def test_bf16_is_native_only_where_the_cpu_lists_a_bf16_instruction_set(monkeypatch, flags, expected):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(cpu_ops_module, "cpu_flags", lambda: flags)
    assert cpu_ops_module.cpu_bf16_native() is expected


def test_bf16_is_never_native_where_onednn_has_no_bf16(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    monkeypatch.setattr(cpu_ops_module, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert cpu_ops_module.cpu_bf16_native() is False


def test_cpu_flags_are_read_from_the_kernel_where_it_lists_them(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 avx2 avx512f\n\nprocessor\t: 1\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo" else path, *a, **k))
    cpu_ops_module.cpu_flags.cache_clear()
    try:
        assert cpu_ops_module.cpu_flags() == frozenset({"fpu", "sse2", "avx2", "avx512f"})
    finally:
        cpu_ops_module.cpu_flags.cache_clear()
