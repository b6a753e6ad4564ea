"""Paper presets run the papers' equations and protocol: float64 references written from the papers."""

from __future__ import annotations

import math

import pytest
import torch

from dmlkit.config import load_config
from dmlkit.config.loading import list_presets
from dmlkit.engine.objective import build_objective
from dmlkit.recipe.rules import selects_by_significance

PROXY_NCA = ["proxy-nca-cars", "proxy-nca-cub", "proxy-nca-sop", "proxy-nca-cars-fractional"]
EPS_TRIPLET = ["eps-triplet-cub", "eps-triplet-cars", "eps-triplet-omniglot", "cpu-eps-mnist-parity-triplet-eps",
               "cpu-omniglot-eps-alphabet"]


def paper_presets() -> list[str]:
    return [p.name for p in list_presets() if p.name.split("-")[0] in ("asap", "dro", "eps", "proxy")]


@pytest.mark.parametrize("preset", PROXY_NCA)
def test_proxy_nca_presets_run_eq4_on_raw_vectors_without_the_positive_in_the_denominator(preset):
    """Proxy-NCA Eq. (4): L = -log( exp(-||x - p(y)||^2) / sum_{z in Z} exp(-||x - p(z)||^2) ), Z = negatives."""
    cfg = load_config(preset=preset, overrides=["model.embedding_size=3"])
    assert cfg.model.normalization == "none"
    loss = build_objective(cfg, 4).loss.double()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        loss.proxies.copy_(2.0 * torch.randn(loss.proxies.shape, generator=g, dtype=torch.float64))
    x = 2.0 * torch.randn(7, 3, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    own = loss.bank.candidate_columns(labels)[:, 0]  # the class's proxy (shared by two classes when fractional)
    total = 0.0
    for i in range(7):
        d = [sum((float(a) - float(b)) ** 2 for a, b in zip(x[i], p)) for p in loss.proxies.detach()]
        negatives = [math.exp(-v) for j, v in enumerate(d) if j != int(own[i])]
        total += -math.log(math.exp(-d[int(own[i])]) / sum(negatives))
    assert float(loss(x, labels).detach()) == pytest.approx(total / 7, rel=1e-10)


def test_the_dynamic_proxy_nca_preset_draws_class_balanced_batches():
    cfg = load_config(preset="proxy-nca-cars-dynamic")
    assert (cfg.sampler.name, cfg.sampler.batch_size, cfg.sampler.m) == ("m_per_class", 32, 2)
    assert cfg.loss.args["exclude_positive"] is True


def eps_reference(x: torch.Tensor, labels: torch.Tensor, margin: float) -> float:
    """EPS Sec. 3-4.3: D = ||f(a) - f(b)||^2 (unit embeddings), p_a = argmin_{t in C_a} D(a, t), every semi-hard
    negative D(a, p_a) < D(a, n) < D(a, p_a) + margin, loss (D_ap - D_an + margin)_+, mean over those triplets."""
    z = [[float(v) for v in row / row.norm()] for row in x]
    D = [[sum((a - b) ** 2 for a, b in zip(u, v)) for v in z] for u in z]
    losses = []
    for a in range(len(z)):
        same = [t for t in range(len(z)) if t != a and labels[t] == labels[a]]
        if not same:
            continue
        p = min(same, key=lambda t: D[a][t])
        for n in range(len(z)):
            if labels[n] != labels[a] and D[a][p] < D[a][n] < D[a][p] + margin:
                losses.append(max(D[a][p] - D[a][n] + margin, 0.0))
    assert losses, "the batch must hold semi-hard triplets"
    return sum(losses) / len(losses)


@pytest.mark.parametrize("preset", EPS_TRIPLET)
def test_eps_triplet_presets_put_the_margin_on_squared_distances(preset):
    cfg = load_config(preset=preset, overrides=["model.embedding_size=2"])
    objective = build_objective(cfg, 3).double()
    angles = torch.rand(24, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2 * math.pi
    x = torch.stack([angles.cos(), angles.sin()], 1)
    labels = torch.arange(24) % 3
    assert float(objective(x, labels).detach()) == pytest.approx(eps_reference(x, labels, 0.2), rel=1e-9)


@pytest.mark.parametrize("preset", [p for p in paper_presets() if p.startswith("eps-")])
def test_eps_presets_report_nmi_plus_at_30_times_the_classes(preset):
    assert load_config(preset=preset).eval.over_cluster == 30


@pytest.mark.parametrize("preset", [p for p in paper_presets()
                                    if load_config(preset=p, overrides=["model.embedding_size=4"]).model.pretrained])
def test_paper_presets_select_the_best_validation_map_at_r(preset):
    cfg = load_config(preset=preset)
    assert cfg.protocol.selection == "best" and not selects_by_significance(cfg)


def test_the_default_photo_recipe_keeps_the_significance_rule():
    cfg = load_config(overrides=["model.pretrained=true"])
    assert cfg.protocol.selection == "significant" and selects_by_significance(cfg)
    refused = "data.pipeline=musgrave decides the training crops"
    with pytest.raises(ValueError, match=refused):
        load_config(overrides=["data.pipeline=musgrave", "data.augment=affine"])
