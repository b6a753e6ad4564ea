"""Fixtures of the loss tests."""

import pytest
import torch


@pytest.fixture
def make_batch():
    """``make_batch(seed, n, d, classes, dtype) -> (embeddings [n, d], labels [n])``, seeded and random."""

    def make(seed=0, n=12, d=5, classes=4, dtype=torch.float64):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, d, generator=g, dtype=dtype), torch.randint(0, classes, (n,), generator=g)

    return make
