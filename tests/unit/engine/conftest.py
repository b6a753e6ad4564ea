"""A tiny version of the default job for engine tests (8-wide CNN, batches of 32, a few steps)."""

import pytest

from dmlkit.config import load_config

TINY = [
    "train.max_steps=4", "train.log_every=1", "train.progress=false", "train.eval_every=1000",
    "train.checkpoint_every=1000", "eval.clustering=false", "eval.save_embeddings=false",
    "model.args={width: 8}", "sampler.batch_size=32", "sampler.m=8", "train.mixed_precision=none", "model.shift_average=0",
]


@pytest.fixture(scope="session")
def tiny_config():
    """``tiny_config(*overrides)``: the mnist-proxy-anchor preset shrunk by :data:`TINY`, then ``overrides``."""

    def make(*overrides: str):
        return load_config(preset="mnist-proxy-anchor", overrides=[*TINY, *overrides])

    return make
