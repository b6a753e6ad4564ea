"""One seed-derivation rule: streams depend only on (seed, keys), differ across keys, and keep their values."""

import numpy as np
import torch

from dmlkit.core.seeds import derive_generator, derive_seed
from dmlkit.data.base import item_seed
from dmlkit.data.samplers import epoch_generator


def test_streams_are_reproducible_independent_and_unchanged():
    assert derive_seed(3, 1, 2) == derive_seed(3, 1, 2) != derive_seed(3, 2, 1)
    assert derive_seed(3, "augment") != derive_seed(3, "pool") and 0 <= derive_seed(0) < 2**63
    a, b = derive_generator(5, 7), derive_generator(5, 7)
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))
    # the data streams are this rule: SeedSequence([seed, *keys]) -> 63 bits, as in every earlier session
    expected = int(np.random.SeedSequence([11, 2, 9]).generate_state(1, dtype=np.uint64)[0]) & ((1 << 63) - 1)
    assert item_seed(11, 2, 9) == expected
    assert torch.equal(torch.rand(3, generator=epoch_generator(4, 1)), torch.rand(3, generator=derive_generator(4, 1)))
