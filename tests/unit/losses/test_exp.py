"""The CPU ``exp`` of the fused losses (``2^(x log2 e)``) against the float64 exponential."""

import pytest
import torch

from dmlkit.losses._exp import exp, exp_


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
