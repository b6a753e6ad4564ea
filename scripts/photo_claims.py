"""The five papers' claims on photographs: ``scripts/reproduce.py photos [--seeds 0 1 2] [--quick] [--core] [--out DIR]``.

Every arm of every claim trains an embedding head (``dmlkit.models.FeatureHead``, 1280 -> 512: a 128-D
random head loses far more of the backbone's retrieval quality at these budgets) with ``dmlkit.fit`` on
the pooled features of a frozen ImageNet-pretrained EfficientNet-Lite0, computed
once per (data set, backbone, weights, view, images) by ``dmlkit.engine.feature_store.FeatureStore``
and read back by every arm, seed and later call. Each claim's arms share one data split per seed
(class-disjoint train / validation / test units; the test units are the same for every seed), one
step budget, one sampler and optimiser, checkpoint selection on the validation classes only
(or the held-out fold, ``folds=4``), then the test classes scored once.

Runs go to ``OUT/CLAIM/ARM/seed<N>[/fold<f>]``; a run with ``metrics.json`` is skipped and an
interrupted one resumes from its last checkpoint. Per claim ``OUT/CLAIM/summary.json`` and
``summary.md``: mean +- standard error of each metric over seeds (fold claims: over fold models,
and the concatenated fold ensemble over seeds), the paired difference of each compared pair of arms
with its standard error, and a verdict (:func:`verdict`) beside what the paper reports.

``--quick``: 16 images a class of mini-ImageNet (1,024 photos) and 6 drawings a character of
Omniglot (816), each claim's ``quick_steps`` (100), seed 0 unless ``--seeds``: a check that
everything runs, not a result (its figure goes to ``OUT/figures``, never ``docs/figures``).
``--core``: only the two arms of each claim's first comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
FIGURES = REPO / "docs" / "figures"

#: Torch threads for feature extraction and training (``--threads``).
THREADS = 2

#: A paired difference is separable when its magnitude exceeds this many standard errors (about 95%).
Z = 2.0

BACKBONE = "efficientnet_lite0"

#: The trained head: ``EMBEDDING_SIZE``-D, initialised as ``HEAD_INIT`` (``identity`` needs the backbone's width).
EMBEDDING_SIZE = 512
HEAD_INIT = "kaiming"


def create_backbone(name: str) -> torch.nn.Module:
    """The frozen backbone (ImageNet weights, offline), an Embedder whose ``features`` are the pooled trunk output."""
    from dmlkit.models import create_model

    model = create_model(name, pretrained=True, embedding_size=None, head_init="identity")
    return model.to("cuda") if torch.cuda.is_available() else model


#: How the script builds a backbone from its name (tests put a tiny stub here).
BACKBONES: dict[str, Callable[[str], torch.nn.Module]] = {BACKBONE: create_backbone}


_BUILT: dict[str, torch.nn.Module] = {}


def _backbone(name: str) -> torch.nn.Module:
    """The backbone ``name``, built once per process."""
    if name not in _BUILT:
        _BUILT[name] = BACKBONES[name](name)
    return _BUILT[name]


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class PhotoData:
    """A development set: its images, the split unit and label of each, and the view its features use.

    ``units`` name what train / validation / test are disjoint in (classes; Omniglot: characters);
    ``train_labels`` are the labels the training split is trained with (Omniglot: alphabets, so each
    class holds several modes), ``eval_labels`` those validation and test are scored with.
    """

    name: str
    read: Callable[[int | None], tuple[list | torch.Tensor, list[str], list[str], list[str]]]
    image_size: int
    test_units: float
    val_units: float
    quick_per_unit: int


def _read_miniimagenet(per_class: int | None) -> tuple[list[str], list[str], list[str], list[str]]:
    from dmlkit.data.folder import IMAGE_EXTENSIONS

    root = SHARED / "miniimagenet64" / "images"
    paths, names = [], []
    for cls in sorted(p.name for p in root.iterdir() if p.is_dir()):
        files = sorted(f for f in (root / cls).iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS)
        for f in files[:per_class]:
            paths.append(str(f))
            names.append(cls)
    return paths, names, names, names


def _read_omniglot(per_character: int | None) -> tuple[torch.Tensor, list[str], list[str], list[str]]:
    from dmlkit.data.registry import get_dataset_spec

    sets = get_dataset_spec("omniglot").read(SHARED / "omniglot" / "images_background_small1.zip", "character", "character")
    images = torch.cat([sets["train"].images, sets["test"].images])
    characters = sets["train"].names["character"] + sets["test"].names["character"]
    alphabets = sets["train"].names["alphabet"] + sets["test"].names["alphabet"]
    keep, seen = [], {}
    for i, c in enumerate(characters):
        seen[c] = seen.get(c, 0) + 1
        if per_character is None or seen[c] <= per_character:
            keep.append(i)
    rows = torch.tensor(keep)
    return images[rows], [characters[i] for i in keep], [alphabets[i] for i in keep], [characters[i] for i in keep]


DATA: dict[str, PhotoData] = {
    # 64 classes: 24 test classes (fixed), 8 validation classes (drawn per seed), 32 training classes
    "miniimagenet": PhotoData("miniimagenet", _read_miniimagenet, 224, 0.375, 0.2, 16),
    # ~140 characters of 5 alphabets: 30% test characters, 20% of the rest for validation; trained on alphabets
    "omniglot": PhotoData("omniglot", _read_omniglot, 112, 0.3, 0.2, 6),
}


@dataclass
class SplitFeatures:
    """One seed's class-disjoint splits of a data set's stored features."""

    train: object
    val: object
    test: object
    train_units: list[str]
    unit_of_row: list[str]


def unit_split(units: list[str], test_fraction: float, val_fraction: float, seed: int) -> tuple[list, list, list]:
    """(train, val, test) units: the test units are fixed (seed-independent draw), validation drawn with ``seed``."""
    names = sorted(set(units))
    fixed = torch.randperm(len(names), generator=torch.Generator().manual_seed(2**31 - 1)).tolist()
    n_test = round(len(names) * test_fraction)
    test = sorted(names[i] for i in fixed[:n_test])
    rest = sorted(names[i] for i in fixed[n_test:])
    order = torch.randperm(len(rest), generator=torch.Generator().manual_seed(int(seed))).tolist()
    n_val = max(1, round(len(rest) * val_fraction))
    val = sorted(rest[i] for i in order[:n_val])
    return sorted(rest[i] for i in order[n_val:]), val, test


# ----------------------------------------------------------------------------- claims


@dataclass(frozen=True)
class Arm:
    """One arm of a claim: config sections for ``dmlkit.fit`` (loss, miner, optimiser, ASAP) and the head's normalisation."""

    name: str
    config: dict
    normalization: str = "l2"


@dataclass(frozen=True)
class Comparison:
    """``better`` should beat ``worse`` on ``metric`` (the paper's direction); ``paper`` says what it reports."""

    better: str
    worse: str
    metric: str
    paper: str


@dataclass(frozen=True)
class PhotoClaim:
    """A paper's claim: arms under one budget and protocol, the comparisons its verdicts rest on."""

    name: str
    title: str
    data: str
    arms: tuple[Arm, ...]
    comparisons: tuple[Comparison, ...]
    steps: int
    quick_steps: int
    differs: str
    evals: int = 8
    folds: int = 0
    metrics: tuple[str, ...] = ("recall_at_1", "map_at_r", "nmi")
    sampler: dict = field(default_factory=lambda: {"name": "m_per_class", "batch_size": 64, "m": 4})


_ADAM = {"name": "adam", "lr": 1e-3, "weight_decay": 1e-4}


def _loss(name: str, miner: tuple[str, dict] | None = None, lr_multiplier: float = 1, **args) -> dict:
    loss = {"name": name, "args": args}
    if miner is not None:
        loss["miner"] = {"name": miner[0], "args": miner[1]}
    return {"loss": loss, "optimizer": {**_ADAM, "loss_lr_multiplier": lr_multiplier}}


_MS = dict(alpha=2, beta=50, base=0.5)
_MS_MINER = ("multi_similarity", {"epsilon": 0.1})
_C2 = dict(distance="euclidean", pos_margin=0.0, neg_margin=0.3841)
_ASAP = {"enabled": True, "proximal_lambda": 2e-4, "proxies_per_class": 4, "pool_size": 16, "patience": 2}
_SQ = {"name": "squared_euclidean", "args": {"normalize_embeddings": True}}


def _proxy_pair(pair: str, pair_args: dict, per_class: int | None = None, asap: bool = False) -> dict:
    args: dict = {"pair_loss": {"name": pair, "args": {**pair_args, "reduction": "sum"}}, "reduction": "mean"}
    if per_class is not None:
        args["proxies_per_class"] = per_class
    return {**_loss("proxy_pair", **args), **({"asap": dict(_ASAP)} if asap else {})}


_FROZEN = ("frozen ImageNet-pretrained EfficientNet-Lite0 (pooled 1280-D features at {size} px) with a trained "
           "512-D linear head, not an end-to-end fine-tuned BN-Inception/ResNet-50; {data}; {budget}")


CLAIMS: dict[str, PhotoClaim] = {}


def register(claim: PhotoClaim) -> PhotoClaim:
    CLAIMS[claim.name] = claim
    return claim


register(PhotoClaim(
    name="proxy-anchor",
    title="Proxy-Anchor Table 2 / Fig. 1: Proxy-Anchor vs Proxy-NCA, MS and triplet (semi-hard); score against steps",
    data="miniimagenet",
    arms=(
        Arm("proxy-anchor", _loss("proxy_anchor", lr_multiplier=100, margin=0.1, alpha=32)),
        Arm("ms", _loss("multi_similarity", _MS_MINER, **_MS)),
        Arm("proxy-nca", _loss("proxy_nca", lr_multiplier=100, softmax_scale=1)),
        Arm("triplet", _loss("triplet_margin", ("triplet_margin", {"margin": 0.2, "type_of_triplets": "semihard"}),
                             margin=0.2)),
    ),
    comparisons=(
        Comparison("proxy-anchor", "ms", "recall_at_1", "Proxy-Anchor above MS (CUB-200 R@1 68.4 vs 65.7 at 512-D)"),
        Comparison("proxy-anchor", "ms", "early_val_map_at_r",
                   "Fig. 1: Proxy-Anchor reaches its accuracy in fewer epochs than MS and the pair losses"),
        Comparison("proxy-anchor", "proxy-nca", "recall_at_1", "Proxy-Anchor above Proxy-NCA on all four data sets"),
        Comparison("proxy-anchor", "triplet", "recall_at_1", "Proxy-Anchor above triplet (semi-hard) on all four data sets"),
    ),
    steps=600, quick_steps=100,
    differs=_FROZEN.format(size=224, data="mini-ImageNet's 64 training classes at 84 px (32 train / 8 val / 24 test "
                           "classes; ImageNet classes the backbone was trained on)", budget="{steps} steps of 64"),
    metrics=("recall_at_1", "recall_at_4", "map_at_r", "nmi", "early_val_map_at_r", "steps_to_90pct"),
))

register(PhotoClaim(
    name="asap",
    title="ASAP Table 1: C2, C2 + proxies, C2 + ASAP (and MS, MS + ASAP), 4-fold class-disjoint protocol",
    data="miniimagenet",
    arms=(
        Arm("c2", _loss("contrastive", **_C2), normalization="bounded"),
        Arm("c2-asap", _proxy_pair("contrastive", _C2, asap=True), normalization="bounded"),
        Arm("c2-proxy", _proxy_pair("contrastive", _C2, per_class=4), normalization="bounded"),
        Arm("ms", _loss("multi_similarity", _MS_MINER, **_MS), normalization="bounded"),
        Arm("ms-asap", _proxy_pair("multi_similarity", _MS, asap=True), normalization="bounded"),
    ),
    comparisons=(
        Comparison("c2-asap", "c2", "map_at_r", "C2 + ASAP above C2 (Table 1, MAP@R and P@1, all four data sets)"),
        Comparison("c2-asap", "c2", "ensemble_map_at_r", "the same for the concatenated 4-fold ensemble (Table 1)"),
        Comparison("c2-asap", "c2-proxy", "map_at_r", "ASAP above one proxy problem without projections (Table 1)"),
        Comparison("ms-asap", "ms", "map_at_r", "MS + ASAP above MS (Table 1)"),
    ),
    steps=600, quick_steps=100, evals=4, folds=4,
    differs=_FROZEN.format(size=224, data="mini-ImageNet, 40 training classes in 4 class-disjoint folds of 10, 24 test "
                           "classes", budget="{steps} steps a fold model (the paper: up to 100 epochs); 512-D fold "
                           "models, so a 2048-D ensemble (the paper: 4 x 128 = 512-D)"),
    metrics=("map_at_r", "precision_at_1", "recall_at_1", "ensemble_map_at_r", "ensemble_precision_at_1"),
))

register(PhotoClaim(
    name="proxy-nca",
    title="Proxy-NCA Fig. 6-7: half as many proxies as classes, static vs dynamic assignment, against one per class",
    data="miniimagenet",
    arms=(
        Arm("proxies-1.0", _loss("proxy_nca", lr_multiplier=100, softmax_scale=1)),
        Arm("proxies-0.5-static", _loss("proxy_nca", lr_multiplier=100, softmax_scale=1, proxies_per_class=0.5)),
        Arm("proxies-0.5-dynamic", _loss("proxy_nca", lr_multiplier=100, softmax_scale=1, proxies_per_class=0.5,
                                         assignment="dynamic")),
    ),
    comparisons=(
        Comparison("proxies-0.5-dynamic", "proxies-0.5-static", "recall_at_1",
                   "with fewer proxies than classes, dynamic assignment above static (Sec. 6.5, Fig. 6-7)"),
        Comparison("proxies-1.0", "proxies-0.5-dynamic", "recall_at_1",
                   "one proxy per class at least as good; fewer proxies cost little (Fig. 6-7)"),
    ),
    steps=600, quick_steps=100,
    differs=_FROZEN.format(size=224, data="mini-ImageNet (32 train / 8 val / 24 test classes; 16 proxies for the 32 "
                           "training classes in the 0.5 arms)", budget="{steps} steps of 64"),
))

register(PhotoClaim(
    name="dro",
    title="DRO Tables 1-2: DRO-TopK and DRO-TopK-PN against contrastive, lifted structure and MS",
    data="miniimagenet",
    arms=(
        Arm("dro-topk-pn", _loss("dro", weighting="top_k_pn", base="margin", k_pos=64, k_neg=64, margin=0.2,
                                 threshold=0.5)),
        Arm("ms", _loss("multi_similarity", _MS_MINER, **_MS)),
        Arm("dro-topk", _loss("dro", weighting="top_k", base="margin", k=128, margin=0.2, threshold=0.5)),
        Arm("contrastive", _loss("contrastive", pos_margin=0.0, neg_margin=0.5)),
        Arm("lifted", _loss("lifted_structure", neg_margin=1.0, pos_margin=0.0)),
    ),
    comparisons=(
        Comparison("dro-topk-pn", "ms", "recall_at_1", "DRO-TopK-PN above MS (Table 2, CUB/Cars/SOP R@1)"),
        Comparison("dro-topk", "contrastive", "recall_at_1", "DRO-TopK above contrastive (Table 1)"),
        Comparison("dro-topk-pn", "lifted", "recall_at_1", "DRO-TopK-PN above lifted structure (Tables 1-2)"),
    ),
    steps=600, quick_steps=100,
    differs=_FROZEN.format(size=224, data="mini-ImageNet (32 train / 8 val / 24 test classes), batches of 64 = 16 "
                           "classes x 4", budget="{steps} steps"),
))

register(PhotoClaim(
    name="eps",
    title="EPS Tables 2-3: easy positives with semi-hard, distance-weighted and MS negatives, Omniglot alphabets as classes",
    data="omniglot",
    arms=(
        Arm("triplet", _loss("triplet_margin", ("triplet_margin", {"distance": _SQ, "margin": 0.2,
                                                                   "type_of_triplets": "semihard"}),
                             margin=0.2, distance=_SQ)),
        Arm("triplet+eps", _loss("triplet_margin", ("easy_positive", {"distance": _SQ, "negative": "semihard",
                                                                      "margin": 0.2}),
                                 margin=0.2, distance=_SQ)),
        Arm("margin-dw", _loss("margin", ("distance_weighted", {"cutoff": 0.5, "nonzero_loss_cutoff": 1.4}),
                               margin=0.2, beta=1.2, learn_beta=True)),
        Arm("margin-dw+eps", _loss("margin", ("easy_positive", {"negative": "distance_weighted"}),
                                   margin=0.2, beta=1.2, learn_beta=True)),
        Arm("ms", _loss("multi_similarity", ("multi_similarity", {"epsilon": 0.1}), alpha=2, beta=50, base=1.0)),
        Arm("ms+eps", _loss("multi_similarity", ("easy_positive", {"negative": "multi_similarity", "epsilon": 0.1}),
                            alpha=2, beta=50, base=1.0)),
    ),
    comparisons=(
        Comparison("triplet+eps", "triplet", "nmi_plus", "EPS + semi-hard triplet above triplet (Table 3, Omniglot NMI+)"),
        Comparison("triplet+eps", "triplet", "recall_at_1", "the same on R@1 (Table 3)"),
        Comparison("margin-dw+eps", "margin-dw", "recall_at_1", "EPS with distance-weighted negatives above (Table 2)"),
        Comparison("ms+eps", "ms", "recall_at_1", "EPS with MS negatives above MS (Table 2)"),
    ),
    steps=600, quick_steps=100,
    differs=_FROZEN.format(size=112, data="Omniglot background_small1 (5 alphabets); trained on alphabet labels of 70% of "
                           "the characters, validated and tested on held-out characters with character labels "
                           "(NMI+: 4x over-clustering)", budget="{steps} steps, batches of 4 alphabets x 16"),
    metrics=("recall_at_1", "map_at_r", "nmi", "nmi_plus"),
    sampler={"name": "m_per_class", "batch_size": 64, "m": 16},
))

# ----------------------------------------------------------------------------- statistics


def mean_se(values: list[float]) -> dict:
    """Mean and standard error of the mean (sample std / sqrt(n)); ``se`` is NaN below two values."""
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"mean": float("nan"), "se": float("nan"), "n": 0}
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return {"mean": statistics.fmean(values), "se": se, "n": len(values)}


def paired_difference(better: dict, worse: dict) -> dict:
    """``better - worse`` over the runs both have (same seed, same fold): mean and standard error of the differences."""
    keys = sorted(set(better) & set(worse))
    return mean_se([better[k] - worse[k] for k in keys])


def verdict(difference: dict, z: float = Z) -> str:
    """``holds`` (difference > z SE), ``reversed`` (< -z SE) or ``not separable at this scale``."""
    mean, se, n = difference["mean"], difference["se"], difference["n"]
    if n < 2 or not math.isfinite(se):
        return f"not separable at this scale ({n} run{'s' if n != 1 else ''})"
    if abs(mean) > z * se and mean != 0:
        return "holds" if mean > 0 else "reversed"
    return "not separable at this scale"


# ----------------------------------------------------------------------------- running


def split_features(claim: PhotoClaim, seed: int, quick: bool, store, echo: Callable[[str], None]) -> SplitFeatures:
    """The claim's data set's stored features, cut into this seed's class-disjoint train / val / test units."""
    data = DATA[claim.data]
    images, units, train_names, eval_names = data.read(data.quick_per_unit if quick else None)
    backbone = _backbone(BACKBONE)
    stored = store.features(backbone, BACKBONE, images, eval_names, image_size=data.image_size, echo=echo)
    train_u, val_u, test_u = unit_split(units, data.test_units, data.val_units, seed)
    if claim.folds:  # the folds of the non-test units validate; no other validation split
        train_u, val_u = sorted(train_u + val_u), []
    part_of = {u: name for name, part in (("train", train_u), ("val", val_u), ("test", test_u)) for u in part}
    rows = {name: [i for i, u in enumerate(units) if part_of[u] == name] for name in ("train", "val", "test")}
    from dmlkit.engine.feature_store import FeatureDataset

    train = FeatureDataset(stored.features[rows["train"]], [train_names[i] for i in rows["train"]])
    return SplitFeatures(train, stored.subset(rows["val"]), stored.subset(rows["test"]), train_u,
                         [units[i] for i in rows["train"]])


def backbone_reference(claim: PhotoClaim, splits: SplitFeatures, out: Path) -> dict:
    """The test metrics of the frozen backbone's L2-normalised pooled features, no head (``OUT/CLAIM/backbone.json``)."""
    from dmlkit.engine.checkpoint import atomic_write_json
    from dmlkit.evaluation import clustering_metrics, retrieval_metrics

    path = out / claim.name / "backbone.json"
    if path.exists():
        return json.loads(path.read_text())
    features = torch.nn.functional.normalize(splits.test.features.float(), dim=1)
    labels = splits.test.labels
    metrics = {k: float(v) for k, v in retrieval_metrics(features, labels, ks=(1, 4)).items()}
    metrics.update({k: float(v) for k, v in clustering_metrics(features, labels, over_cluster=4).items()})
    atomic_write_json(path, metrics)
    return metrics


def _fit(claim: PhotoClaim, arm: Arm, seed: int, steps: int, train, val, test, run_dir: Path,
         fold: int | None = None) -> None:
    import dmlkit
    from dmlkit.models import FeatureHead

    every = max(1, steps // claim.evals)
    config = json.loads(json.dumps(arm.config))  # a fresh copy for every run
    config["sampler"] = dict(claim.sampler)
    config["eval"] = {"ks": [1, 2, 4, 8], "over_cluster": 4, "save_embeddings": True}
    config["train"] = {"max_steps": steps, "eval_every": every, "checkpoint_every": every, "progress": False,
                       "patience": None, "num_threads": THREADS, "mixed_precision": "none"}
    # the validation split is ``val`` (fold claims: the held-out fold, which ASAP's schedule reads as protocol.fold)
    config["protocol"] = {"val_class_fraction": 0.0, "seed": seed,
                          **({"num_folds": claim.folds, "fold": fold} if fold is not None else {})}
    if "asap" in config:
        config["asap"]["patience"] = min(config["asap"]["patience"], max(1, claim.evals // 4))
    torch.manual_seed(seed)  # the head's initial weights
    width = train.features.shape[1]
    head = FeatureHead(width, width if HEAD_INIT == "identity" else EMBEDDING_SIZE, arm.normalization, HEAD_INIT)
    if run_dir.exists() and not (run_dir / "checkpoints" / "last.pt").exists():
        shutil.rmtree(run_dir)  # started but nothing to resume from
    dmlkit.fit(head, None, train, val_data=val, test_data=test, out=run_dir, report=False, echo=lambda s: None,
               config=config, seed=seed, name=f"{claim.name}-{arm.name}-seed{seed}")


def run_arm(claim: PhotoClaim, arm: Arm, seed: int, steps: int, splits: SplitFeatures, out: Path,
            echo: Callable[[str], None]) -> None:
    """Train (resume, or skip when finished) one arm at one seed; fold claims: one model per fold."""
    from dmlkit.data.splits import class_disjoint_folds

    seed_dir = out / claim.name / arm.name / f"seed{seed}"
    if claim.folds:
        folds = class_disjoint_folds(splits.train_units, claim.folds, seed)
        units = splits.unit_of_row
        for f, fold in enumerate(folds):
            run_dir = seed_dir / f"fold{f}"
            if (run_dir / "metrics.json").exists():
                continue
            held = set(fold)
            train_rows = [i for i, u in enumerate(units) if u not in held]
            val_rows = [i for i, u in enumerate(units) if u in held]
            val = splits.train.subset(val_rows)
            _timed(lambda: _fit(claim, arm, seed, steps, splits.train.subset(train_rows), val, splits.test, run_dir, f),
                   f"{claim.name}/{arm.name}/seed{seed}/fold{f}", run_dir, echo)
        return
    if (seed_dir / "metrics.json").exists():
        return
    _timed(lambda: _fit(claim, arm, seed, steps, splits.train, splits.val, splits.test, seed_dir),
           f"{claim.name}/{arm.name}/seed{seed}", seed_dir, echo)


def _timed(train: Callable[[], None], what: str, run_dir: Path, echo: Callable[[str], None]) -> None:
    echo(f"[{time.strftime('%H:%M:%S')}] {what}")
    start = time.perf_counter()
    train()
    path = run_dir / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["wall_seconds"] = round(time.perf_counter() - start, 1)
    from dmlkit.engine.checkpoint import atomic_write_json

    atomic_write_json(path, metrics)
    echo(f"    {metrics['wall_seconds']} s: R@1 {metrics.get('recall_at_1', float('nan')):.4f}, "
         f"MAP@R {metrics.get('map_at_r', float('nan')):.4f}")


# ----------------------------------------------------------------------------- summaries


def _log(run_dir: Path) -> list[dict]:
    path = run_dir / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def curve_metrics(run_dir: Path, steps: int) -> dict:
    """From the run's validation log: MAP@R at the first evaluation at or after a quarter of the budget, and
    the first step whose validation MAP@R reaches 90% of the run's best (Proxy-Anchor Fig. 1's convergence)."""
    val = [r for r in _log(run_dir) if r.get("kind") == "eval" and r.get("split") == "val" and "map_at_r" in r]
    if not val:
        return {}
    early = next((r for r in val if r["step"] >= steps / 4), val[-1])
    best = max(r["map_at_r"] for r in val)
    first = next(r for r in val if r["map_at_r"] >= 0.9 * best)
    return {"early_val_map_at_r": early["map_at_r"], "steps_to_90pct": first["step"]}


def _test_embeddings(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    data = np.load(run_dir / "embeddings" / "test.npz")
    return torch.from_numpy(data["embeddings"]), torch.from_numpy(data["labels"])


def ensemble_metrics(fold_dirs: list[Path]) -> dict:
    """ASAP Table 1's ensemble: the fold models' test embeddings (each normalised) concatenated, then scored."""
    from dmlkit.evaluation import retrieval_metrics

    parts, labels = [], None
    for d in fold_dirs:
        emb, lab = _test_embeddings(d)
        if labels is not None and not torch.equal(lab, labels):
            raise ValueError(f"{d}: test labels differ between fold models")
        labels = lab
        parts.append(torch.nn.functional.normalize(emb.double(), dim=1))
    metrics = retrieval_metrics(torch.cat(parts, dim=1).float(), labels, ks=(1,))
    return {f"ensemble_{k}": float(metrics[k]) for k in ("map_at_r", "precision_at_1")}


def run_values(claim: PhotoClaim, arm: Arm, seeds: list[int], steps: int, out: Path) -> dict[str, dict]:
    """``{metric: {run key: value}}`` of one arm: run key ``seed`` (fold claims: ``seed/fold``; ensembles: ``seed``)."""
    values: dict[str, dict] = {}
    for seed in seeds:
        seed_dir = out / claim.name / arm.name / f"seed{seed}"
        dirs = [(f"{seed}/{f}", seed_dir / f"fold{f}") for f in range(claim.folds)] if claim.folds else [(str(seed), seed_dir)]
        done = [(k, d) for k, d in dirs if (d / "metrics.json").exists()]
        for key, d in done:
            row = {**json.loads((d / "metrics.json").read_text()), **curve_metrics(d, steps)}
            for k, v in row.items():
                if isinstance(v, (int, float)):
                    values.setdefault(k, {})[key] = float(v)
        if claim.folds and len(done) == claim.folds:
            for k, v in ensemble_metrics([d for _, d in done]).items():
                values.setdefault(k, {})[str(seed)] = v
    return values


def summarise(claim: PhotoClaim, arms: list[Arm], seeds: list[int], steps: int, out: Path) -> dict:
    """``summary.json`` / ``summary.md`` of a claim: every arm's mean +- SE and each comparison's paired difference."""
    per_arm = {arm.name: run_values(claim, arm, seeds, steps, out) for arm in arms}
    keys = (*claim.metrics, "wall_seconds", "steps")
    summary: dict = {"claim": claim.name, "title": claim.title, "data": claim.data, "steps": steps, "seeds": seeds,
                     "folds": claim.folds, "differs": claim.differs.replace("{steps}", str(steps)), "arms": {}, "comparisons": []}
    reference = out / claim.name / "backbone.json"
    if reference.exists():  # the same test classes for every seed: one value
        row = json.loads(reference.read_text())
        summary["arms"]["backbone (no head)"] = {k: mean_se([row[k]] if k in row else []) for k in keys}
    for name, values in per_arm.items():
        summary["arms"][name] = {k: mean_se(list(values.get(k, {}).values())) for k in keys}
    for c in claim.comparisons:
        if c.better not in per_arm or c.worse not in per_arm:
            continue
        diff = paired_difference(per_arm[c.better].get(c.metric, {}), per_arm[c.worse].get(c.metric, {}))
        summary["comparisons"].append({"better": c.better, "worse": c.worse, "metric": c.metric, "paper": c.paper,
                                       "difference": diff, "verdict": verdict(diff)})
    from dmlkit.engine.checkpoint import atomic_write_json, atomic_write_text

    atomic_write_json(out / claim.name / "summary.json", summary)
    atomic_write_text(out / claim.name / "summary.md", markdown(summary))
    return summary


def _pct(metric: str) -> float:
    return 1.0 if metric in ("steps_to_90pct", "wall_seconds", "steps") else 100.0


def _cell(stats: dict, scale: float) -> str:
    if not stats["n"]:
        return "–"
    se = "" if not math.isfinite(stats["se"]) else f" ± {scale * stats['se']:.1f}"
    return f"{scale * stats['mean']:.1f}{se}"


def markdown(summary: dict) -> str:
    """The claim's two tables: arms (mean ± SE, n), then comparisons (paired difference ± SE, verdict, paper)."""
    metrics = [k for k in next(iter(summary["arms"].values()), {}) if k != "steps"]
    unit = "fold models (ensembles: seeds)" if summary["folds"] else "seeds"
    lines = [f"**{summary['claim']}**: {summary['title']}. {summary['steps']} steps, seeds {summary['seeds']}; "
             f"mean ± standard error over {unit}; metrics in %.", "",
             "| arm | n | " + " | ".join(metrics) + " |", "|" + "---|" * (len(metrics) + 2)]
    for name, arm in summary["arms"].items():
        n = max((s["n"] for s in arm.values()), default=0)
        lines.append(f"| {name} | {n} | " + " | ".join(_cell(arm[k], _pct(k)) for k in metrics) + " |")
    lines += ["", "| comparison | metric | paired difference | n | verdict | paper |", "|---|---|---|---|---|---|"]
    for c in summary["comparisons"]:
        d = c["difference"]
        lines.append(f"| {c['better']} − {c['worse']} | {c['metric']} | {_cell(d, _pct(c['metric']))} | {d['n']} | "
                     f"{c['verdict']} | {c['paper']} |")
    lines += ["", f"Differs from the paper: {summary['differs']}.", ""]
    return "\n".join(lines)


def figure_val_curves(claim: PhotoClaim, arms: list[Arm], seeds: list[int], out: Path, folder: Path) -> Path | None:
    """Proxy-Anchor Fig. 1 on photos: validation MAP@R against training steps, every arm and seed, drawn into
    ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    drawn = False
    for i, arm in enumerate(arms):
        for seed in seeds:
            val = [r for r in _log(out / claim.name / arm.name / f"seed{seed}")
                   if r.get("kind") == "eval" and r.get("split") == "val" and "map_at_r" in r]
            if val:
                ax.plot([r["step"] for r in val], [100 * r["map_at_r"] for r in val], color=f"C{i}", alpha=0.8,
                        label=arm.name if seed == seeds[0] else None)
                drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("training step")
    ax.set_ylabel("validation MAP@R (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"photos-{claim.name}-val-curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="reproduce.py photos", description=__doc__.split("\n")[0])
    parser.add_argument("claims", nargs="*", help=f"claims: {', '.join(CLAIMS)} (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2; quick: 0)")
    parser.add_argument("--quick", action="store_true",
                        help="a few images a class (mini-ImageNet 16, Omniglot 6 a character), quick_steps, seed 0")
    parser.add_argument("--core", action="store_true", help="only the arms of each claim's first comparison")
    parser.add_argument("--steps", type=int, default=None, help="override every claim's step budget")
    parser.add_argument("--out", default=None, help="output root (default runs/photos or runs/photos-quick)")
    parser.add_argument("--features", default=None, help="feature store folder (default OUT/features)")
    parser.add_argument("--threads", type=int, default=THREADS, help=f"torch threads (default {THREADS})")
    parser.add_argument("--summary-only", action="store_true", help="only summarise finished runs")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--list", action="store_true", help="list the claims, arms and comparisons")
    return parser.parse_args(argv)


def core_arms(claim: PhotoClaim) -> set[str]:
    """The arms of the claim's first comparison (what ``--core`` runs)."""
    first = claim.comparisons[0]
    return {first.better, first.worse}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for c in CLAIMS.values():
            print(f"{c.name}: {c.title} [{c.data}, {c.steps} steps, quick {c.quick_steps}"
                  f"{f', {c.folds}-fold' if c.folds else ''}]")
            for a in c.arms:
                print(f"    {a.name}{'' if a.name in core_arms(c) else ' (not core)'}: {json.dumps(a.config['loss'])}")
            for cmp in c.comparisons:
                print(f"    compare {cmp.better} > {cmp.worse} on {cmp.metric}: {cmp.paper}")
        return 0
    global THREADS
    THREADS = args.threads
    torch.set_num_threads(THREADS)
    names = args.claims or list(CLAIMS)
    unknown = [n for n in names if n not in CLAIMS]
    if unknown:
        print(f"unknown photo claims {unknown}; known: {', '.join(CLAIMS)}", file=sys.stderr)
        return 2
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    out = Path(args.out or ("runs/photos-quick" if args.quick else "runs/photos"))
    from dmlkit.engine.feature_store import FeatureStore

    store = FeatureStore(args.features or out / "features")
    start = time.perf_counter()
    for name in names:
        claim = CLAIMS[name]
        steps = args.steps or (claim.quick_steps if args.quick else claim.steps)
        arms = [a for a in claim.arms if not args.core or a.name in core_arms(claim)]
        if not args.summary_only:
            for seed in seeds:
                splits = split_features(claim, seed, args.quick, store, print)
                backbone_reference(claim, splits, out)
                for arm in arms:
                    run_arm(claim, arm, seed, steps, splits, out, print)
        summary = summarise(claim, arms, seeds, steps, out)
        print("\n" + markdown(summary))
        if claim.name == "proxy-anchor" and not args.no_figures:
            # a --quick check draws beside its runs: docs/figures holds the full run's figure
            path = figure_val_curves(claim, arms, seeds, out, out / "figures" if args.quick else FIGURES)
            if path is not None:
                print(f"figure: {path}")
    print(f"photos: {time.perf_counter() - start:.0f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
