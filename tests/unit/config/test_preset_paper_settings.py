"""Presets that claim a paper's setting carry that paper's numbers."""

import pytest
import torch

from dmlkit.config import load_config
from dmlkit.engine.objective import build_objective


@pytest.mark.parametrize("preset", [f"eps{kind}-ms-{data}" for kind in ("", "-baseline")
                                    for data in ("cub", "cars", "omniglot")])
def test_eps_ms_presets_use_wang_et_al_hyperparameters(preset):
    """EPS Sec. 5.2.2: "the same hyper-parameters as in (Wang et al., 2019) alpha = 2, lambda = 1, beta = 50"."""
    loss = build_objective(load_config(preset=preset, overrides=["model.embedding_size=4"]), 10).loss
    assert (loss.alpha, loss.beta, loss.base) == (2.0, 50.0, 1.0)


@pytest.mark.parametrize("preset", ["cpu-asap-mnist-2d-c2", "cpu-asap-mnist-2d-c2-proxy", "cpu-asap-mnist-2d-c2-baseline"])
def test_2d_asap_presets_measure_the_bounded_output_without_renormalising(preset):
    """ASAP Sec. 4.4: v / ||v|| only when ||v|| > 1; the loss must see points inside the disk as they are."""
    loss = build_objective(load_config(preset=preset), 5).loss
    pair = getattr(loss, "pair_loss", loss)
    inside = torch.tensor([[0.3, 0.0], [0.0, 0.4]], dtype=torch.float64)
    assert pair.distance(inside, inside)[0, 1].item() == pytest.approx(0.5, rel=1e-12)  # |(0.3, -0.4)|
