"""scripts/reproduce.py photos: the claim registry, the statistics, and a tiny photo claim end to end (stub backbone)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from dmlkit.models import Embedder, GlobalPool, make_cfg


@pytest.fixture(scope="module")
def photos(script_loader):
    return script_loader("photo_claims")


def test_claim_registry_is_well_formed(photos):
    """Each paper has a claim; comparisons name arms of their claim; --core keeps both arms of the first one."""
    papers = {"proxy-anchor", "asap", "proxy-nca", "dro", "eps"}
    assert papers <= set(photos.CLAIMS)
    for claim in photos.CLAIMS.values():
        arms = [a.name for a in claim.arms]
        assert len(arms) == len(set(arms)) >= 2
        assert claim.data in photos.DATA and claim.steps > claim.quick_steps > 0
        assert claim.comparisons and claim.differs
        for c in claim.comparisons:
            assert c.better in arms and c.worse in arms and c.better != c.worse and c.paper
        assert photos.core_arms(claim) <= set(arms) and len(photos.core_arms(claim)) == 2
        for arm in claim.arms:
            assert {"loss", "optimizer"} <= set(arm.config)
            assert arm.normalization in ("l2", "bounded")
    assert photos.CLAIMS["asap"].folds == 4
    assert any(c.metric.startswith("ensemble_") for c in photos.CLAIMS["asap"].comparisons)
    assert any(c.metric == "nmi_plus" for c in photos.CLAIMS["eps"].comparisons)


def test_paired_difference_and_verdicts_by_hand(photos):
    """Differences 0.1, 0.2, 0.05: mean 0.116667, SE = 0.076376 / sqrt(3) = 0.044096 -> holds (> 2 SE)."""
    better = {"0": 0.5, "1": 0.7, "2": 0.6, "9": 1.0}  # key 9 has no partner: left out
    worse = {"0": 0.4, "1": 0.5, "2": 0.55}
    d = photos.paired_difference(better, worse)
    assert d["n"] == 3
    assert math.isclose(d["mean"], 0.35 / 3, rel_tol=1e-12)
    assert math.isclose(d["se"], 0.0763762615825973 / math.sqrt(3), rel_tol=1e-9)
    assert photos.verdict(d) == "holds"
    assert photos.verdict(photos.paired_difference(worse, better)) == "reversed"
    # 0.1, -0.05, 0.02: mean 0.023333, SE 0.044096 -> not separable
    mixed = photos.paired_difference({"0": 0.5, "1": 0.45, "2": 0.57}, worse)
    assert math.isclose(mixed["mean"], 0.07 / 3, rel_tol=1e-9)
    assert photos.verdict(mixed) == "not separable at this scale"
    assert photos.verdict(photos.paired_difference({"0": 0.9}, {"0": 0.1})) == "not separable at this scale (1 run)"
    assert photos.mean_se([1.0, 2.0, 4.0]) == pytest.approx({"mean": 7 / 3, "se": math.sqrt(7 / 3) / math.sqrt(3), "n": 3})


def test_unit_split_is_class_disjoint_with_fixed_test_units(photos):
    units = [f"u{i:02d}" for i in range(20)]
    a = photos.unit_split(units, 0.25, 0.2, seed=0)
    b = photos.unit_split(units, 0.25, 0.2, seed=1)
    assert a[2] == b[2] and len(a[2]) == 5  # the same test units for every seed
    assert a[1] != b[1] and len(a[1]) == 3  # validation drawn per seed
    for train, val, test in (a, b):
        assert not (set(train) & set(val)) and not (set(train) & set(test)) and not (set(val) & set(test))
        assert sorted(train + val + test) == units


class _StubTrunk(nn.Module):
    """Mean colour per channel plus its square: class colours of the fixture separate in these 6 features."""

    num_features = 6

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.pretrained_cfg = make_cfg(mean=(0.5,) * 3, std=(0.25,) * 3, input_size=(3, 16, 16), color="RGB")

    def forward(self, x):
        return torch.cat([x, x * x], dim=1) * self.scale


def _fixture_folder(root, classes=14, per_class=6):
    rng = np.random.default_rng(0)
    for c in range(classes):
        colour = rng.integers(96, 160, 3)
        (root / f"class{c:02d}").mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(colour + rng.normal(0, 40, (24, 20, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"class{c:02d}" / f"{i}.png")


def test_tiny_photo_claims_run_end_to_end_and_resume(photos, tmp_path, monkeypatch):
    """A 2-arm claim (2 seeds) and a 2-fold claim on a generated folder: summaries, verdicts, ensembles; a rerun skips."""
    _fixture_folder(tmp_path / "images")

    def read(per_class):
        paths = sorted(str(p) for p in (tmp_path / "images").glob("*/*.png"))
        names = [p.split("/")[-2] for p in paths]
        return paths, names, names, names

    monkeypatch.setitem(photos.DATA, "fixture", photos.PhotoData("fixture", read, 16, 0.3, 0.2, 3))
    monkeypatch.setitem(photos.BACKBONES, photos.BACKBONE, lambda name: Embedder(_StubTrunk(), GlobalPool("avg"),
                                                                                  nn.Identity(), "none"))
    monkeypatch.setattr(photos, "_BUILT", {})
    monkeypatch.setattr(photos, "FIGURES", tmp_path / "figures")
    arms = (photos.Arm("pa", photos._loss("proxy_anchor", lr_multiplier=100, margin=0.1, alpha=32)),
            photos.Arm("ms", photos._loss("multi_similarity", photos._MS_MINER, **photos._MS)))
    comparison = (photos.Comparison("pa", "ms", "map_at_r", "paper says pa"),)
    small = {"name": "m_per_class", "batch_size": 8, "m": 2}
    monkeypatch.setitem(photos.CLAIMS, "tiny", photos.PhotoClaim(
        "tiny", "tiny", "fixture", arms, comparison, steps=4, quick_steps=4, differs="stub, {steps} steps", evals=2, sampler=small))
    monkeypatch.setitem(photos.CLAIMS, "tiny-folds", photos.PhotoClaim(
        "tiny-folds", "tiny folds", "fixture", arms,
        (photos.Comparison("pa", "ms", "ensemble_map_at_r", "ensemble"),), steps=3, quick_steps=3, differs="stub",
        evals=1, folds=2, metrics=("map_at_r", "ensemble_map_at_r"), sampler=small))
    out = tmp_path / "out"
    photos.THREADS = 1
    assert photos.main(["tiny", "--seeds", "0", "1", "--out", str(out), "--no-figures", "--threads", "1"]) == 0
    summary = json.loads((out / "tiny" / "summary.json").read_text())
    for arm in ("pa", "ms"):
        stats = summary["arms"][arm]["map_at_r"]
        assert stats["n"] == 2 and 0 < stats["mean"] <= 1 and stats["se"] >= 0
        assert summary["arms"][arm]["steps"]["mean"] == 4
    reference = summary["arms"]["backbone (no head)"]["map_at_r"]  # the stored features themselves, scored once
    assert reference["n"] == 1 and 0 < reference["mean"] <= 1
    (cmp,) = summary["comparisons"]
    assert cmp["difference"]["n"] == 2 and cmp["verdict"] in ("holds", "reversed", "not separable at this scale")
    table = (out / "tiny" / "summary.md").read_text()
    assert "| pa − ms | map_at_r |" in table and "Differs from the paper: stub, 4 steps." in table
    # the features were stored once and every run read them; test classes are the same in every run
    assert len(list((out / "features").iterdir())) == 1
    labels = [np.load(out / "tiny" / a / f"seed{s}" / "embeddings" / "test.npz")["labels"] for a in ("pa", "ms")
              for s in (0, 1)]
    assert all(np.array_equal(labels[0], x) for x in labels)
    stamp = (out / "tiny" / "ms" / "seed1" / "metrics.json").stat().st_mtime_ns
    assert photos.main(["tiny", "--seeds", "0", "1", "--out", str(out), "--no-figures", "--threads", "1"]) == 0
    assert (out / "tiny" / "ms" / "seed1" / "metrics.json").stat().st_mtime_ns == stamp

    assert photos.main(["tiny-folds", "--seeds", "0", "--out", str(out), "--no-figures", "--threads", "1"]) == 0
    folds = json.loads((out / "tiny-folds" / "summary.json").read_text())
    assert folds["arms"]["pa"]["map_at_r"]["n"] == 2  # one model per fold
    assert folds["arms"]["pa"]["ensemble_map_at_r"]["n"] == 1  # one concatenated ensemble per seed
    ens = folds["arms"]["pa"]["ensemble_map_at_r"]["mean"]
    parts = [np.load(out / "tiny-folds" / "pa" / "seed0" / f"fold{f}" / "embeddings" / "test.npz") for f in (0, 1)]
    joined = np.concatenate([p["embeddings"] / np.linalg.norm(p["embeddings"], axis=1, keepdims=True) for p in parts], 1)
    from dmlkit.evaluation import retrieval_metrics

    want = float(retrieval_metrics(torch.from_numpy(joined).float(), torch.from_numpy(parts[0]["labels"]))["map_at_r"])
    assert ens == pytest.approx(want, abs=1e-6)
