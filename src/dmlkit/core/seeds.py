"""Seed derivation: one rule for every independent random stream.

A stream is named by the run's seed and integer or string keys (``derive_generator(seed, "augment",
epoch, batch)``); numpy's ``SeedSequence`` mixes them, so streams are independent, depend only on
their keys (any number of workers, exact after a resume) and never on Python's hash randomisation.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch


def _entropy(key: int | str) -> int:
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8"))
    return int(key)


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed for the stream ``(seed, *keys)``."""
    state = np.random.SeedSequence([int(seed), *(_entropy(k) for k in keys)]).generate_state(1, dtype=np.uint64)[0]
    return int(state) & ((1 << 63) - 1)


def derive_generator(seed: int, *keys: int | str) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded for the stream ``(seed, *keys)``."""
    return torch.Generator().manual_seed(derive_seed(seed, *keys))
