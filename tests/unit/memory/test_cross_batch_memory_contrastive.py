"""CrossBatchMemory with the issue-30 pair losses (NT-Xent, SupCon, Circle): PML's memory loss, step by step."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from dmlkit.losses import CircleLoss, NTXentLoss, SupConLoss
from dmlkit.memory import CrossBatchMemory


@pytest.mark.parametrize("name", ["NTXentLoss", "SupConLoss", "CircleLoss"])
def test_matches_pml_through_wrap_around(name):
    ours = {"NTXentLoss": NTXentLoss, "SupConLoss": SupConLoss, "CircleLoss": CircleLoss}[name]
    a = CrossBatchMemory(ours(), 6, memory_size=20)
    b = pml_losses.CrossBatchMemory(getattr(pml_losses, name)(), 6, memory_size=20)
    g = torch.Generator().manual_seed(0)
    for _ in range(6):  # 48 rows through a 20-slot memory
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        torch.testing.assert_close(a(x, y), b(x, y), rtol=1e-5, atol=1e-5)
