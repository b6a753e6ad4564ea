"""A tiny version of the default job for the engine and recipe tests (8-wide CNN, batches of 32, a few steps)."""

import os

import pytest

from dmlkit.config import load_config

TINY = [
    "train.max_steps=4", "train.log_every=1", "train.progress=false", "train.eval_every=1000",
    "train.checkpoint_every=1000", "eval.clustering=false", "eval.save_embeddings=false",
    "model.args={width: 8}", "sampler.batch_size=32", "sampler.m=8", "train.mixed_precision=none", "model.shift_average=0",
]


@pytest.fixture(scope="session")
def tiny_config(test_device):
    """``tiny_config(*overrides)``: the mnist-proxy-anchor preset shrunk by :data:`TINY`, then ``overrides``;
    ``train.device`` is ``DMLKIT_TEST_DEVICE`` when that is set (``tests/conftest.py``)."""
    device = [f"train.device={test_device}"] if os.environ.get("DMLKIT_TEST_DEVICE") else []

    def make(*overrides: str):
        return load_config(preset="mnist-proxy-anchor", overrides=[*TINY, *device, *overrides])

    return make
