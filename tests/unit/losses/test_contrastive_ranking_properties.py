"""Properties of the issue-30 contrastive and ranking losses: batch order, relabelling, dtypes, bounds."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.losses import LOSSES

#: registry name -> constructor arguments (RankedListLoss has no defaults for margin and Tn, as PML).
CASES = {
    "ntxent": {}, "supcon": {}, "circle": {}, "ranked_list": dict(margin=0.4, Tn=10),
    "fastap": {}, "smooth_ap": dict(temperature=0.05), "pnp": {}, "histogram": {},
}
#: losses that estimate 1 - (a precision) or a probability: values in [0, 1].
BOUNDED = {"fastap", "smooth_ap", "histogram"}
#: losses that keep PML's float16 roundings of their matrix or weights (test_half_precision_pml_order.py).
PML_FLOAT16_ROUNDINGS = {"circle", "ranked_list"}


def make(name):
    return LOSSES.create(name, **CASES[name])


@pytest.mark.parametrize("name", sorted(CASES))
def test_invariant_to_batch_order_and_relabelling(name, make_batch):
    x, y = make_batch(0, n=24, d=6, classes=5)
    order = torch.randperm(24, generator=torch.Generator().manual_seed(1))
    relabelled = (y * 7 + 3) % 101  # a different id per class
    expected = make(name)(x, y)
    torch.testing.assert_close(make(name)(x[order], y[order]), expected)
    torch.testing.assert_close(make(name)(x, relabelled), expected)


@pytest.mark.parametrize("name", sorted(CASES))
def test_half_precision_input_gives_the_fp32_loss_in_its_dtype(name, make_batch):
    x, y = make_batch(2, n=16, d=6, classes=4, dtype=torch.float32)
    half = x.half().requires_grad_(True)
    value = make(name)(half, y)
    value.backward()
    assert value.dtype == torch.float16 and half.grad.dtype == torch.float16
    reference = make(name)(half.detach().float(), y)
    if name in PML_FLOAT16_ROUNDINGS:  # a few float16 steps as PML's, the rest in fp32: within fp16's resolution
        torch.testing.assert_close(value.float(), reference, rtol=2e-3, atol=1e-4)
        return
    # accumulated in fp32, rounded once: the fp32 loss of the same (rounded) inputs, rounded to fp16
    assert value == reference.half()


@settings(max_examples=25, deadline=None, derandomize=True)
@given(name=st.sampled_from(sorted(CASES)), seed=st.integers(0, 2**16), classes=st.integers(1, 6),
       scale=st.sampled_from([1e-3, 1.0, 1e3]), duplicate=st.booleans())
def test_finite_nonnegative_and_bounded(name, seed, classes, scale, duplicate):
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(12, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (12,), generator=g)
    if duplicate:
        x[1::2] = x[::2]  # identical embeddings
    x.requires_grad_(True)
    value = make(name)(x, y)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(x.grad).all()
    assert value.item() >= -1e-12
    if name in BOUNDED:
        assert value.item() <= 1 + 1e-12
