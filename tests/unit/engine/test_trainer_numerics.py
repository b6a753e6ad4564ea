"""Mixed precision and torch.compile end to end on CPU (train.mixed_precision, train.compile)."""

import json
import math

import pytest
import torch

from dmlkit.recipe import Trainer


def fit_tiny(tmp_path, tiny_config, *overrides):
    """Fit a few steps; returns (trainer, result, per-step losses, (trunk output dtype, loss dtype) of each step)."""
    trainer = Trainer(tiny_config(*overrides), tmp_path / "run", echo=lambda _: None)
    dtypes, trunk = [], []
    trainer.model.trunk.register_forward_hook(lambda module, inputs, out: trunk.append(out.dtype))
    trainer.objective.register_forward_hook(lambda module, inputs, out: dtypes.append((trunk[-1], out.dtype)))
    result = trainer.fit()
    log = [json.loads(line) for line in trainer.run_dir.log_path.read_text().splitlines()]
    return trainer, result, [r["loss"] for r in log if r["kind"] == "train"], dtypes


@pytest.fixture(scope="module")
def eager_losses(tmp_path_factory, tiny_config):
    return fit_tiny(tmp_path_factory.mktemp("eager"), tiny_config)[2]


def test_bf16_autocast_embeds_in_bf16_and_accumulates_the_loss_in_fp32(tmp_path, tiny_config, eager_losses):
    trainer, result, losses, dtypes = fit_tiny(tmp_path, tiny_config, "train.mixed_precision=bf16")
    assert trainer.autocast_dtype is torch.bfloat16
    # the trunk runs in bf16; pooling, head and loss in fp32 (a bf16 head costs retrieval accuracy)
    assert len(dtypes) == 4 and all(d == (torch.bfloat16, torch.float32) for d in dtypes)
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    # bf16 keeps ~3 significant digits: the run follows the fp32 one closely, not exactly
    assert losses == pytest.approx(eager_losses, rel=0.05)
    metrics = result.test_metrics
    rates = {k: v for k, v in metrics.items() if not k.startswith(("num_", "threshold_"))}
    assert "roc_auc" in rates and all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in rates.values())
    assert -1.0 <= metrics["threshold_at_fmr_1e-3"] <= 1.0 + 1e-6 and metrics["num_genuine_pairs"] > 0
    assert metrics["map_at_r"] > 0


@pytest.mark.slow
def test_torch_compile_matches_eager(tmp_path, tiny_config, eager_losses):
    import torch._inductor.config as inductor_config

    # one compile thread: no worker pool to start, which on 2 shared cores costs more than it saves
    with inductor_config.patch(compile_threads=1):
        trainer, result, losses, dtypes = fit_tiny(tmp_path, tiny_config, "train.compile=true")
    assert type(trainer.forward_model).__name__ == "OptimizedModule"
    assert all(d == (torch.float32, torch.float32) for d in dtypes)
    assert losses == pytest.approx(eager_losses, rel=1e-3)  # inductor reorders float sums; same steps otherwise
    assert math.isfinite(result.test_metrics["map_at_r"])
