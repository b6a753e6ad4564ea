"""Reproduce the five papers' claims at CPU scale: train every (claim, method, seed), summarise, plot.

Usage::

    .venv/bin/python scripts/reproduce.py CLAIM... [--quick] [--seeds 0 1 2] [--out runs/repro]
    .venv/bin/python scripts/reproduce.py --list

Each claim is a list of methods (a packaged ``cpu-*`` preset plus ``key=value`` overrides) that
share one step budget, one data split and one selection protocol. Runs go to
``OUT/CLAIM/METHOD/seed<N>``; a run with ``metrics.json`` is skipped and an interrupted run is
resumed from its last checkpoint, so the command can be repeated until everything is done.
Per claim the script writes ``OUT/CLAIM/summary.json`` (mean and std over seeds of every metric,
wall time, steps), ``OUT/CLAIM/summary.md`` (the table) and PNG figures into ``docs/figures/``.
Runs are sequential on ``--threads`` torch threads (default 1). Claims with ``folds=k`` use the
class-disjoint k-fold protocol of ASAP Table 1 instead (``dmlkit.crossval``): one model per fold, selected on its held-out fold,
reported as the fold-model average and the concatenated-embedding ensemble.
``--core`` runs only the arms each verdict rests on (``all --quick --core`` is the short check).

These MNIST / digits claims are toy scale. The five papers' claims with networks that learn, seeded
class-disjoint splits and paired statistics are ``reproduce.py claims``::

    .venv/bin/python scripts/reproduce.py claims [CLAIM...] [--quick] [--seeds 0 1 2 3 4 5 6 7] [--out results/claims]
    .venv/bin/python scripts/reproduce.py claims --list
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "docs" / "figures"

#: Overrides every run gets: no progress bar, checkpoint selection on 20% of the training classes'
#: images (never the test digits), no early stopping (equal budgets). Threads: ``THREADS``.
COMMON = ("train.progress=false", "protocol.val_fraction=0.2", "train.patience=null")

#: Torch threads per run (``--threads``); 1 so that runs next to other jobs do not oversubscribe.
THREADS = 1


@dataclass(frozen=True)
class Method:
    """One arm of a comparison: a preset plus overrides."""

    name: str
    preset: str
    overrides: tuple[str, ...] = ()
    full_only: bool = False
    core: bool = True


@dataclass(frozen=True)
class Claim:
    """A paper claim: the methods compared under one budget and the metrics reported."""

    name: str
    title: str
    methods: tuple[Method, ...]
    steps: int
    quick_steps: int
    evals: int = 10
    metrics: tuple[str, ...] = ("recall_at_1", "map_at_r", "nmi", "nmi_plus")
    extras: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    figures: tuple[str, ...] = ()
    folds: int = 0
    core: bool = True


# ----------------------------------------------------------------------------- the claims

_MARGIN = ("loss.name=margin", "loss.args={margin: 0.2, beta: 1.2, learn_beta: true}")
_MS = ("loss.name=multi_similarity", "loss.args={alpha: 2, beta: 40, base: 0.5}")
#: EPS Sec. 5.2.2: MS with "the same hyper-parameters as in (Wang et al., 2019) alpha = 2, lambda = 1, beta = 50".
_MS_EPS = ("loss.name=multi_similarity", "loss.args={alpha: 2, beta: 50, base: 1.0}")
_TRIPLET_SH = (
    "loss.name=triplet_margin", "loss.args={margin: 0.2}", "loss.miner.name=triplet_margin",
    "loss.miner.args={margin: 0.2, type_of_triplets: semihard}", "optimizer.loss_lr_multiplier=1",
)
_DRO = ("loss.name=dro",)
_ASAP_2D = ("model.name=small_cnn", "model.args.downsample=stride", "asap.patience=2")
_ASAP_64D = ("model.name=small_cnn", "model.args.downsample=stride", "model.embedding_size=64", "model.normalization=l2",
             "asap.patience=2")


def _dro(**args) -> tuple[str, ...]:
    inner = ", ".join(f"{k}: {v}" for k, v in args.items())
    return (*_DRO, f"loss.args={{{inner}}}")


def _proxy_pair(pair: str, pair_args: str, k: int | None = None, reduction: str | None = None) -> tuple[str, ...]:
    """``pair`` against learnt proxies; ``k=None`` leaves the proxy count to ``asap.proxies_per_class``;
    ``reduction="mean"`` is ASAP Eq. (4.11)'s average over batch x proxies (``pair_args`` must sum)."""
    per_class = "" if k is None else f", proxies_per_class: {k}"
    per_class += "" if reduction is None else f", reduction: {reduction}"
    return ("loss.name=proxy_pair", f"loss.args={{pair_loss: {{name: {pair}, args: {pair_args}}}{per_class}}}")


_C2_ARGS = "{pos_margin: 0.0, neg_margin: 0.3841}"
#: ASAP's C1 (App. A.2: XBM's cosine contrastive, margin 0.5; the asap-c1-* presets); dot = cosine on the L2 output.
_C1_ARGS = "{distance: dot, margin: 0.5}"
_C1_PAIR_ARGS = "{distance: dot, margin: 0.5, reduction: sum}"
#: The asap-c1-* presets' earlier C1: a Euclidean contrastive loss with negative margin 0.5.
_C1_EUCLIDEAN_ARGS = "{distance: euclidean, pos_margin: 0.0, neg_margin: 0.5}"
_MS_ARGS = "{alpha: 2, beta: 40, base: 0.5}"
#: ASAP's triplet setting (asap-triplet-* presets): Euclidean distance, margin 0.0961, all triplets.
_TRIPLET_ARGS = "{distance: euclidean, margin: 0.0961}"

#: The three arms of ASAP Fig. 1 / Table 1 for the C2 loss at 64-D: pairs in the batch, one proxy problem, ASAP.
_C2_ARMS_64D = (
    Method("c2", "cpu-asap-mnist-2d-c2-baseline", _ASAP_64D),
    Method("c2-proxy", "cpu-asap-mnist-2d-c2-proxy", _ASAP_64D),
    Method("c2-asap", "cpu-asap-mnist-2d-c2", _ASAP_64D),
)

#: Proxy-Anchor Fig. 1 / Table 2 arms (claim 4), on whichever data set the claim sets.
_PROXY_ANCHOR_ARMS = (
    Method("proxy-anchor", "cpu-proxy-anchor-mnist"),
    Method("proxy-nca", "cpu-proxy-nca-mnist"),
    Method("ms", "cpu-ms-mnist"),
    Method("triplet", "cpu-ms-mnist", _TRIPLET_SH),
)

CLAIMS: dict[str, Claim] = {}


def register(claim: Claim) -> Claim:
    CLAIMS[claim.name] = claim
    return claim


register(Claim(
    name="eps-mnist",
    title="EPS Table 1 / Fig. 2: triplet with and without easy positives, MNIST even/odd, 2-D",
    methods=(
        Method("triplet", "cpu-eps-mnist-parity-triplet"),
        Method("triplet+eps", "cpu-eps-mnist-parity-triplet-eps"),
        Method("triplet-r2", "cpu-eps-mnist-parity-triplet", ("model.normalization=none",), core=False),
        Method("triplet+eps-r2", "cpu-eps-mnist-parity-triplet-eps", ("model.normalization=none",), core=False),
    ),
    steps=800, quick_steps=300,
    metrics=("recall_at_1", "recall_at_5", "recall_at_10", "nmi", "nmi_plus"),
    extras=("train_recall_at_1", "train_recall_at_5", "train_recall_at_10", "train_parity_nmi", "train_parity_nmi_plus",
            "train_class_collapse"),
    overrides=("eval.ks=[1, 5, 10]",),
    figures=("train_digits",),
))

register(Claim(
    name="eps-losses",
    title="EPS Table 2: EPS with distance-weighted margin and MS against the same losses, MNIST even/odd, 2-D",
    methods=(
        Method("margin", "cpu-eps-mnist-parity-triplet",
               (*_MARGIN, "loss.miner.name=distance_weighted", "loss.miner.args={cutoff: 0.5, nonzero_loss_cutoff: 1.4}"),
               core=False),
        Method("margin+eps", "cpu-eps-mnist-parity-triplet",
               (*_MARGIN, "loss.miner.name=easy_positive", "loss.miner.args={negative: distance_weighted}"), core=False),
        Method("ms", "cpu-eps-mnist-parity-triplet",
               (*_MS_EPS, "loss.miner.name=multi_similarity", "loss.miner.args={epsilon: 0.1}")),
        Method("ms+eps", "cpu-eps-mnist-parity-triplet",
               (*_MS_EPS, "loss.miner.name=easy_positive", "loss.miner.args={negative: multi_similarity, epsilon: 0.1}")),
    ),
    steps=800, quick_steps=300,
    metrics=("recall_at_1", "recall_at_2", "recall_at_4", "nmi", "nmi_plus"),
    extras=("train_recall_at_1", "train_parity_nmi", "train_parity_nmi_plus", "train_class_collapse"),
    figures=("train_digits",),
))

register(Claim(
    name="asap-2d",
    title="ASAP Fig. 1 / Fig. 4(a): C2 vs C2-Proxy vs C2-ASAP, MNIST-5k, 2-D embeddings",
    methods=(
        Method("c2", "cpu-asap-mnist-2d-c2-baseline", _ASAP_2D),
        Method("c2-proxy", "cpu-asap-mnist-2d-c2-proxy", _ASAP_2D),
        Method("c2-asap", "cpu-asap-mnist-2d-c2", _ASAP_2D),
    ),
    steps=1500, quick_steps=400, evals=16,
    metrics=("map_at_r", "recall_at_1", "nmi", "covering_radius", "radius_over_interclass"),
    extras=("projections", "train_covering_radius_last"),
    figures=("scatter_2d", "covering_radius"),
))

register(Claim(
    name="asap-losses",
    title="ASAP Table 1 in miniature: C2/MS/triplet alone, with one proxy problem, with ASAP, and with XBM",
    methods=(
        *_C2_ARMS_64D,
        Method("c2-xbm", "cpu-asap-mnist-2d-c2-baseline", (*_ASAP_64D, "loss.memory.memory_size=320"), core=False),
        Method("c1", "cpu-asap-mnist-2d-c2-baseline", (*_ASAP_64D, "loss.name=cosine_contrastive", f"loss.args={_C1_ARGS}"),
               core=False),
        Method("c1-proxy", "cpu-asap-mnist-2d-c2-proxy",
               (*_ASAP_64D, *_proxy_pair("cosine_contrastive", _C1_PAIR_ARGS, 4, "mean")), core=False),
        Method("c1-asap", "cpu-asap-mnist-2d-c2", (*_ASAP_64D, *_proxy_pair("cosine_contrastive", _C1_PAIR_ARGS, None, "mean")),
               core=False),
        Method("c1-euclidean", "cpu-asap-mnist-2d-c2-baseline",
               (*_ASAP_64D, "loss.name=contrastive", f"loss.args={_C1_EUCLIDEAN_ARGS}"), core=False),
        Method("c1-euclidean-proxy", "cpu-asap-mnist-2d-c2-proxy",
               (*_ASAP_64D, *_proxy_pair("contrastive", _C1_EUCLIDEAN_ARGS, 4)), core=False),
        Method("c1-euclidean-asap", "cpu-asap-mnist-2d-c2",
               (*_ASAP_64D, *_proxy_pair("contrastive", _C1_EUCLIDEAN_ARGS)), core=False),
        Method("ms", "cpu-asap-mnist-2d-c2-baseline", (*_ASAP_64D, *_MS), core=False),
        Method("ms-proxy", "cpu-asap-mnist-2d-c2-proxy", (*_ASAP_64D, *_proxy_pair("multi_similarity", _MS_ARGS, 4)),
               core=False),
        Method("ms-asap", "cpu-asap-mnist-2d-c2", (*_ASAP_64D, *_proxy_pair("multi_similarity", _MS_ARGS)), core=False),
        Method("triplet", "cpu-asap-mnist-2d-c2-baseline", (*_ASAP_64D, "loss.name=triplet_margin", f"loss.args={_TRIPLET_ARGS}"),
               core=False),
        Method("triplet-proxy", "cpu-asap-mnist-2d-c2-proxy",
               (*_ASAP_64D, *_proxy_pair("triplet_margin", _TRIPLET_ARGS, 4)), core=False),
        Method("triplet-asap", "cpu-asap-mnist-2d-c2", (*_ASAP_64D, *_proxy_pair("triplet_margin", _TRIPLET_ARGS)),
               core=False),
    ),
    steps=1500, quick_steps=400, evals=16,
    metrics=("map_at_r", "recall_at_1", "nmi", "covering_radius"),
    extras=("projections",),
))

register(Claim(
    name="asap-ablation",
    title="ASAP Fig. 3 / Fig. 8: proxies per class K, pool size b and batch size for C2-ASAP (2-D) against C2",
    methods=(
        Method("asap-k1-b16", "cpu-asap-mnist-2d-c2", (*_ASAP_2D, "asap.proxies_per_class=1")),
        Method("asap-k4-b16", "cpu-asap-mnist-2d-c2", _ASAP_2D),
        Method("asap-k8-b16", "cpu-asap-mnist-2d-c2", (*_ASAP_2D, "asap.proxies_per_class=8")),
        Method("asap-k4-b4", "cpu-asap-mnist-2d-c2", (*_ASAP_2D, "asap.pool_size=4")),
        Method("asap-k4-b32", "cpu-asap-mnist-2d-c2", (*_ASAP_2D, "asap.pool_size=32")),
        Method("asap-batch32", "cpu-asap-mnist-2d-c2", (*_ASAP_2D, "sampler.batch_size=32", "sampler.m=8")),
        Method("c2-batch32", "cpu-asap-mnist-2d-c2-baseline", (*_ASAP_2D, "sampler.batch_size=32", "sampler.m=8")),
    ),
    steps=1500, quick_steps=400, evals=16,
    metrics=("map_at_r", "recall_at_1", "covering_radius"),
    extras=("projections",),
    core=False,
))

register(Claim(
    name="asap-crossval",
    title="ASAP Table 1 protocol: C2 vs C2-Proxy vs C2-ASAP (64-D) under 4-fold class-disjoint cross-validation",
    methods=_C2_ARMS_64D,
    steps=1500, quick_steps=400,
    # One validation, at the end: 3 of the 4 folds of the 5 training digits hold a single digit,
    # on which MAP@R is 1 for every checkpoint, so selection (and ASAP's projection schedule) on
    # them would stop at the first evaluation. Batches of 3 digits x 16: one fold model sees 3 digits.
    evals=1,
    metrics=("map_at_r", "recall_at_1", "r_precision", "precision_at_1"),
    extras=("covering_radius", "projections"),
    overrides=("sampler.batch_size=48", "sampler.m=16"),
    figures=("fold_ensemble",),
    folds=4,
    core=False,
))

register(Claim(
    name="proxy-anchor",
    title="Proxy-Anchor Fig. 1 / Table 2: Proxy-Anchor vs Proxy-NCA, MS and triplet, small CNN 64-D, MNIST-5k",
    methods=(
        *_PROXY_ANCHOR_ARMS,
        Method("proxy-anchor-batch32", "cpu-proxy-anchor-mnist", ("sampler.batch_size=32", "sampler.m=8"), core=False),
        Method("ms-batch32", "cpu-ms-mnist", ("sampler.batch_size=32", "sampler.m=8"), core=False),
    ),
    steps=600, quick_steps=300,
    metrics=("recall_at_1", "map_at_r", "nmi"),
    extras=("val_recall_at_1_per_second", "seconds_per_step", "steps_to_90pct"),
    figures=("val_curves",),
))

register(Claim(
    name="proxy-anchor-digits",
    title="Proxy-Anchor Table 2 on scikit-learn digits (8x8): Proxy-Anchor vs Proxy-NCA, MS and triplet, small CNN 64-D",
    methods=tuple(Method(m.name, m.preset, m.overrides, core=m.name in ("proxy-anchor", "ms")) for m in _PROXY_ANCHOR_ARMS),
    steps=600, quick_steps=300,
    metrics=("recall_at_1", "map_at_r", "nmi"),
    extras=("steps_to_90pct",),
    overrides=("data.name=digits",),
    figures=("val_curves",),
))

register(Claim(
    name="proxy-nca",
    title="Proxy-NCA Fig. 6-7: fewer proxies than classes, static vs dynamic assignment, MNIST-5k (5 classes)",
    methods=(
        Method("proxies-1.0-static", "cpu-proxy-nca-mnist"),
        Method("proxies-0.6-static", "cpu-proxy-nca-mnist", ("loss.args={softmax_scale: 1, proxies_per_class: 0.6}",),
               core=False),
        Method("proxies-0.4-static", "cpu-proxy-nca-mnist", ("loss.args={softmax_scale: 1, proxies_per_class: 0.4}",)),
        Method("proxies-0.4-dynamic", "cpu-proxy-nca-mnist",
               ("loss.args={softmax_scale: 1, proxies_per_class: 0.4, assignment: dynamic}",)),
        Method("proxies-0.2-dynamic", "cpu-proxy-nca-mnist",
               ("loss.args={softmax_scale: 1, proxies_per_class: 0.2, assignment: dynamic}",), core=False),
    ),
    steps=600, quick_steps=300,
    metrics=("recall_at_1", "map_at_r", "nmi"),
))

register(Claim(
    name="dro",
    title="DRO Tables 1-2: DRO-TopK / TopK-PN / KL (margin and binomial base) vs MS and lifted structure, MNIST-5k",
    methods=(
        Method("ms", "cpu-dro-topk-pn-mnist", (*_MS, "loss.miner.name=multi_similarity", "loss.miner.args={epsilon: 0.1}")),
        Method("lifted", "cpu-dro-topk-pn-mnist", ("loss.name=lifted_structure", "loss.args={neg_margin: 1.0, pos_margin: 0.0}")),
        Method("dro-topk-margin", "cpu-dro-topk-pn-mnist",
               _dro(weighting="top_k", base="margin", margin=0.2, threshold=0.5, k=128), core=False),
        Method("dro-topk-pn-margin", "cpu-dro-topk-pn-mnist"),
        Method("dro-kl-margin", "cpu-dro-topk-pn-mnist",
               _dro(weighting="kl", base="margin", margin=0.2, threshold=0.5, gamma=0.1, sample="true", num_samples=128),
               core=False),
        Method("dro-topk-binomial", "cpu-dro-topk-pn-mnist",
               _dro(weighting="top_k", base="binomial", threshold=0.5, alpha=2.0, beta=50.0, k=128), core=False),
        Method("dro-topk-pn-binomial", "cpu-dro-topk-pn-mnist",
               _dro(weighting="top_k_pn", base="binomial", threshold=0.5, alpha=2.0, beta=50.0, k_pos=64, k_neg=64),
               core=False),
        Method("dro-kl-binomial", "cpu-dro-topk-pn-mnist",
               _dro(weighting="kl", base="binomial", threshold=0.5, alpha=2.0, beta=50.0, gamma=0.1, sample="true",
                    num_samples=128),
               core=False),
    ),
    steps=600, quick_steps=300,
    metrics=("recall_at_1", "map_at_r", "nmi"),
))

register(Claim(
    name="dro-sensitivity",
    title="DRO Sec. 4.2 / Fig. 1-2: DRO-KL-G over gamma, DRO-TopK over K, TopK-PN over the positive:negative split",
    methods=(
        *(Method(f"kl-g-gamma{g}", "cpu-dro-topk-pn-mnist",
                 ("loss.name=dro_kl_g", f"loss.args={{gamma_pos: {g}, gamma_neg: {g}, ignore_zero_losses: true, "
                                        f"base: margin, margin: 0.2, threshold: 0.5}}"))
          for g in ("1.0", "0.1", "0.01", "0.001")),
        *(Method(f"topk-k{k}", "cpu-dro-topk-pn-mnist", _dro(weighting="top_k", base="margin", margin=0.2, threshold=0.5, k=k))
          for k in (32, 128, 512)),
        *(Method(f"topk-pn-{p}-{n}", "cpu-dro-topk-pn-mnist",
                 _dro(weighting="top_k_pn", base="margin", margin=0.2, threshold=0.5, k_pos=p, k_neg=n))
          for p, n in ((32, 96), (96, 32))),
    ),
    steps=600, quick_steps=300,
    metrics=("recall_at_1", "map_at_r", "nmi"),
    core=False,
))


# ----------------------------------------------------------------------------- running


def run_config(claim: Claim, method: Method, seed: int, steps: int):
    """The validated RunConfig of one (claim, method, seed) under the claim's step budget."""
    from dmlkit.config.loading import load_config

    every = max(1, steps // claim.evals)
    # k-fold claims: fold 0 here, ``train_folds`` sets each fold
    folds = (f"protocol.num_folds={claim.folds}", "protocol.fold=0", "protocol.val_fraction=0.0") if claim.folds else ()
    overrides = [
        *COMMON, f"train.num_threads={THREADS}", *folds, *claim.overrides, *method.overrides,
        f"train.max_steps={steps}", f"train.eval_every={every}", f"train.checkpoint_every={every}",
        f"seed={seed}", f"protocol.seed={seed}", f"name={claim.name}-{method.name}-seed{seed}",
    ]
    return load_config(preset=method.preset, overrides=overrides)


def _finish(metrics_path: Path, t0: float, echo: Callable[[str], None]) -> dict:
    """Add the run's wall time to its ``metrics.json``, report it and return the metrics."""
    metrics = json.loads(metrics_path.read_text())
    metrics["wall_seconds"] = round(time.perf_counter() - t0, 1)
    metrics_path.write_text(json.dumps(metrics, indent=1))
    echo(f"    done in {metrics['wall_seconds']} s: " + ", ".join(
        f"{k}={metrics[k]:.3f}" for k in ("recall_at_1", "map_at_r") if k in metrics))
    return metrics


def train_one(claim: Claim, method: Method, seed: int, steps: int, out: Path, echo: Callable[[str], None]) -> dict:
    """Train one run (or resume it, or skip it when finished); returns its metrics.json."""
    from dmlkit.recipe import Trainer

    run_dir = out / claim.name / method.name / f"seed{seed}"
    metrics_path = run_dir / "metrics.json"
    if metrics_path.exists():
        return json.loads(metrics_path.read_text())
    cfg = run_config(claim, method, seed, steps)
    resume = (run_dir / "checkpoints" / "last.pt").exists()
    if run_dir.exists() and not resume:
        shutil.rmtree(run_dir)
    echo(f"[{time.strftime('%H:%M:%S')}] {claim.name}/{method.name}/seed{seed}: {steps} steps{' (resume)' if resume else ''}")
    t0 = time.perf_counter()
    Trainer(cfg, run_dir, resume=resume, echo=lambda s: None).fit()
    return _finish(metrics_path, t0, echo)


def train_folds(claim: Claim, method: Method, seed: int, steps: int, out: Path, echo: Callable[[str], None]) -> None:
    """Train (or resume, or skip) the ``claim.folds`` fold models of one (method, seed) with ``dmlkit crossval``'s engine.

    Fold ``f`` goes to ``OUT/CLAIM/METHOD/seed<N>/fold<f>``: trained on the other folds of the
    training classes, validated on fold ``f``, then embeds the whole test split.
    """
    from dmlkit.crossval import run_crossval

    cfg = run_config(claim, method, seed, steps)
    for fold in range(claim.folds):
        metrics_path = out / claim.name / method.name / f"seed{seed}" / f"fold{fold}" / "metrics.json"
        if metrics_path.exists():
            continue
        echo(f"[{time.strftime('%H:%M:%S')}] {claim.name}/{method.name}/seed{seed}/fold{fold}: {steps} steps")
        t0 = time.perf_counter()
        run_crossval(cfg, out / claim.name / method.name, seeds=[seed], folds=[fold], echo=lambda s: None)
        _finish(metrics_path, t0, echo)


# ----------------------------------------------------------------------------- post-hoc metrics


def _log(run_dir: Path) -> list[dict]:
    path = run_dir / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _test_embeddings(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor, np.lib.npyio.NpzFile]:
    data = np.load(run_dir / "embeddings" / "test.npz")
    return torch.from_numpy(data["embeddings"]), torch.from_numpy(data["labels"]), data


def training_digit_embeddings(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings ``[N, D]`` and digit labels ``[N]`` of the training digits 0-5 (EPS Table 1, 'train digits')."""
    from dmlkit.data import TensorImageDataset, load_mnist5k
    from dmlkit.engine.splits import build_splits
    from dmlkit.engine.trained_model import load_run
    from dmlkit.evaluation.embed import embed_dataset

    cfg, model = load_run(run_dir)
    splits = build_splits(cfg, model)
    images, digits = load_mnist5k()
    keep = digits < 6
    dataset = TensorImageDataset(images[keep], digits[keep], [str(d) for d in range(6)], splits.test.transform)
    return embed_dataset(model, dataset, 512)


def posthoc_metrics(claim: Claim, run_dir: Path) -> dict:
    """Metrics computed from the saved run: NMI+, geometry, curves, ASAP projections, EPS train digits."""
    from dmlkit.evaluation import (
        class_collapse,
        clustering_metrics,
        covering_radius,
        interclass_distance,
        retrieval_metrics,
    )

    cache = run_dir / "posthoc.json"
    if cache.exists():
        return json.loads(cache.read_text())
    emb, labels, _ = _test_embeddings(run_dir)
    out: dict = {}
    cl = clustering_metrics(emb, labels, over_cluster=4)
    out["nmi_plus"] = cl["nmi_plus"]
    out["covering_radius"] = covering_radius(emb, labels)
    out["class_collapse"] = class_collapse(emb, labels)
    out["interclass_distance"] = interclass_distance(emb, labels)
    out["radius_over_interclass"] = out["covering_radius"] / max(out["interclass_distance"], 1e-12)
    log = _log(run_dir)
    projections = [r for r in log if r.get("kind") == "projection"]
    if projections:
        out["projections"] = len(projections)
        out["train_covering_radius_last"] = projections[-1]["covering_radius_after"]
    val = [r for r in log if r.get("kind") == "eval" and r.get("split") == "val"]
    train = [r for r in log if r.get("kind") == "train"]
    if val and train:
        last_train = train[-1]
        out["seconds_per_step"] = last_train["time"] / max(1, last_train["step"])
        best = max(r["recall_at_1"] for r in val)
        first = next(r for r in val if r["recall_at_1"] >= 0.9 * best)
        out["steps_to_90pct"] = first["step"]
        out["val_recall_at_1_per_second"] = best / max(1e-9, val[-1]["time"])
    if any(e.startswith("train_") and e != "train_covering_radius_last" for e in claim.extras):
        temb, tdig = training_digit_embeddings(run_dir)
        np.savez_compressed(run_dir / "train_digits.npz", embeddings=temb.numpy(), digits=tdig.numpy())
        r = retrieval_metrics(temb, tdig, ks=(1, 2, 4, 5, 10))
        for k in (1, 5, 10):
            out[f"train_recall_at_{k}"] = float(r[f"recall_at_{k}"])
        parity = tdig % 2
        pc = clustering_metrics(temb, parity, over_cluster=3)
        out["train_parity_nmi"], out["train_parity_nmi_plus"] = pc["nmi"], pc["nmi_plus"]
        out["train_class_collapse"] = class_collapse(temb, parity)
    cache.write_text(json.dumps(out, indent=1))
    return out


def pixel_reference(data_name: str) -> dict:
    """Test R@1, MAP@R and NMI of L2-normalised raw pixels of the test digits 5-9 (no training at all)."""
    from dmlkit.data import load_mnist5k, load_sklearn_digits
    from dmlkit.evaluation import clustering_metrics, retrieval_metrics

    images, digits = {"mnist": load_mnist5k, "digits": load_sklearn_digits}[data_name]()
    test = digits >= 5
    emb = torch.nn.functional.normalize(images[test].flatten(1).float(), dim=1)
    labels = digits[test] - 5
    return {**retrieval_metrics(emb, labels, ks=(1,)), **clustering_metrics(emb, labels)}


# ----------------------------------------------------------------------------- summary


def _mean_std(values: list[float]) -> dict:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def summarise(claim: Claim, methods: list[Method], seeds: list[int], steps: int, out: Path) -> dict:
    """``summary.json``: mean/std over seeds of each metric per method, with budget and wall time."""
    keys = (*claim.metrics, *claim.extras, "train_seconds", "wall_seconds", "steps", "best_step")
    summary = {"claim": claim.name, "title": claim.title, "steps": steps, "seeds": seeds, "methods": {}}
    if claim.folds:
        summary["folds"] = claim.folds
    for method in methods:
        rows = []
        for seed in seeds:
            seed_dir = out / claim.name / method.name / f"seed{seed}"
            for run_dir in [seed_dir / f"fold{f}" for f in range(claim.folds)] if claim.folds else [seed_dir]:
                if not (run_dir / "metrics.json").exists():
                    continue
                row = json.loads((run_dir / "metrics.json").read_text())
                row.update(posthoc_metrics(claim, run_dir))
                rows.append(row)
        if rows:
            summary["methods"][method.name] = {
                "preset": method.preset, "overrides": list(method.overrides), "runs": len(rows),
                "selected_on": sorted({r.get("selected_on", "?") for r in rows}),
                **{k: _mean_std([r.get(k) for r in rows]) for k in keys},
                **(fold_ensembles(claim, method, seeds, steps, out) if claim.folds else {}),
            }
    (out / claim.name / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / claim.name / "summary.md").write_text(markdown_table(claim, summary))
    return summary


def fold_ensembles(claim: Claim, method: Method, seeds: list[int], steps: int, out: Path) -> dict:
    """``ensemble_<metric>``: mean/std over seeds of the concatenated fold models' test metrics (ASAP Table 1)."""
    from dmlkit.crossval import REPORTED, run_crossval

    done = [s for s in seeds if all((out / claim.name / method.name / f"seed{s}" / f"fold{f}" / "metrics.json").exists()
                                    for f in range(claim.folds))]
    if not done:
        return {}
    # every fold model exists, so this only reads the embeddings and writes crossval.json
    result = run_crossval(run_config(claim, method, done[0], steps), out / claim.name / method.name, seeds=done,
                          folds=list(range(claim.folds)), echo=lambda s: None)
    return {f"ensemble_{k}": result["ensemble"][k] for k in REPORTED if k in claim.metrics}


def markdown_table(claim: Claim, summary: dict) -> str:
    """The claim's table: one row per method (per fold model for k-fold claims), mean ± std over seeds."""
    cols = [*claim.metrics, *claim.extras]
    if claim.folds:
        cols += [f"ensemble_{k}" for k in claim.metrics if any(f"ensemble_{k}" in m for m in summary["methods"].values())]
    head = "| method | runs | " + " | ".join(cols) + " | train s/run | steps |"
    lines = [head, "|" + "---|" * (len(cols) + 4)]
    for name, m in summary["methods"].items():
        def cell(k):
            s = m.get(k, {"n": 0})
            if not s["n"]:
                return "–"
            scale = 100.0 if k.startswith(("recall", "map", "nmi", "train_recall", "train_parity", "precision", "r_prec",
                                           "ensemble_")) else 1.0
            if k in ("projections", "steps_to_90pct"):
                return f"{s['mean']:.1f} ± {s['std']:.1f}"
            return f"{scale * s['mean']:.{1 if scale == 100 else 3}f} ± {scale * s['std']:.{1 if scale == 100 else 3}f}"
        lines.append(f"| {name} | {m['runs']} | " + " | ".join(cell(k) for k in cols)
                     + f" | {m['train_seconds']['mean']:.0f} | {m['steps']['mean']:.0f} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, claim: Claim, kind: str) -> Path:
    """Write ``docs/figures/CLAIM-KIND.png`` and close the figure."""
    fig.tight_layout()
    path = FIGURES / f"{claim.name}-{kind}.png"
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def figure_train_digits(claim: Claim, methods: list[Method], seed: int, out: Path) -> Path | None:
    """EPS Fig. 2: 2-D embeddings of training digits 0-5 (trained on even/odd only), coloured by digit."""
    runs = [(m, out / claim.name / m.name / f"seed{seed}") for m in methods]
    runs = [(m, d) for m, d in runs if (d / "train_digits.npz").exists()]
    if not runs:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 4), squeeze=False)
    for ax, (m, d) in zip(axes[0], runs):
        data = np.load(d / "train_digits.npz")
        e, y = data["embeddings"], data["digits"]
        for digit in range(6):
            sel = y == digit
            ax.scatter(e[sel, 0], e[sel, 1], s=3, alpha=0.5, label=f"{digit} ({'even' if digit % 2 == 0 else 'odd'})",
                       marker="o" if digit % 2 == 0 else "x")
        ax.set_title(m.name)
        ax.set_aspect("equal")
    axes[0][0].legend(markerscale=4, fontsize=7)
    fig.suptitle(f"{claim.name}: training digits 0-5, trained on even/odd labels (seed {seed})")
    return _save(fig, claim, "train-digits")


def figure_scatter_2d(claim: Claim, methods: list[Method], seed: int, out: Path) -> Path | None:
    """ASAP Fig. 1: 2-D test embeddings (digits 5-9) and the learnt proxies of each method."""
    runs = [(m, out / claim.name / m.name / f"seed{seed}") for m in methods]
    runs = [(m, d) for m, d in runs if (d / "embeddings" / "test.npz").exists()]
    if not runs:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 4), squeeze=False)
    for ax, (m, d) in zip(axes[0], runs):
        emb, labels, data = _test_embeddings(d)
        for c in torch.unique(labels).tolist():
            sel = (labels == c).numpy()
            ax.scatter(emb[sel, 0], emb[sel, 1], s=3, alpha=0.4, label=f"test class {c}")
        title = m.name
        if "proxies" in data:
            p = data["proxies"]
            ax.scatter(p[:, 0], p[:, 1], c="k", marker="*", s=60, label="proxies (train digits)")
        ax.set_title(title)
        ax.set_aspect("equal")
    axes[0][0].legend(markerscale=3, fontsize=7)
    fig.suptitle(f"{claim.name}: test digits 5-9 (classes 0-4) in 2-D, proxies of the train digits (seed {seed})")
    return _save(fig, claim, "scatter")


def figure_covering_radius(claim: Claim, methods: list[Method], seeds: list[int], out: Path) -> Path | None:
    """ASAP Fig. 4(a): covering radius of the training embeddings at the end of each projection."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    drawn = False
    for m in methods:
        for seed in seeds:
            proj = [r for r in _log(out / claim.name / m.name / f"seed{seed}") if r.get("kind") == "projection"]
            if proj:
                xs = [0] + [r["projection"] + 1 for r in proj]
                ys = [proj[0]["covering_radius_before"]] + [r["covering_radius_after"] for r in proj]
                ax.plot(xs, ys, marker="o", label=f"{m.name} seed {seed}")
                drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("projection")
    ax.set_ylabel("covering radius (train digits)")
    ax.legend(fontsize=7)
    return _save(fig, claim, "covering-radius")


def figure_val_curves(claim: Claim, methods: list[Method], seeds: list[int], out: Path) -> Path | None:
    """Proxy-Anchor Fig. 1: validation R@1 against training steps and training seconds."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    drawn = False
    for i, m in enumerate(methods):
        for seed in seeds:
            val = [r for r in _log(out / claim.name / m.name / f"seed{seed}")
                   if r.get("kind") == "eval" and r.get("split") == "val"]
            if not val:
                continue
            style = dict(color=f"C{i}", alpha=0.8, label=m.name if seed == seeds[0] else None)
            axes[0].plot([r["step"] for r in val], [r["recall_at_1"] for r in val], **style)
            axes[1].plot([r["time"] for r in val], [r["recall_at_1"] for r in val], **style)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    axes[0].set_xlabel("training step")
    axes[1].set_xlabel("training seconds (shared 2-core machine)")
    for ax in axes:
        ax.set_ylabel("val R@1 (held-out 20% of train digits)")
    axes[0].legend(fontsize=7)
    return _save(fig, claim, "val-curves")


def figure_fold_ensemble(claim: Claim, methods: list[Method], seeds: list[int], out: Path) -> Path | None:
    """ASAP Table 1 layout as bars: fold-model average and concatenated ensemble, MAP@R and P@1, per method."""
    path = out / claim.name / "summary.json"
    entries = json.loads(path.read_text())["methods"] if path.exists() else {}
    names = [m.name for m in methods if "ensemble_map_at_r" in entries.get(m.name, {})]
    if not names:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    x = np.arange(len(names))
    for ax, metric in zip(axes, ("map_at_r", "precision_at_1")):
        for shift, key, label in ((-0.2, metric, f"{claim.folds}-fold average"), (0.2, f"ensemble_{metric}", "ensemble")):
            stats = [entries[n][key] for n in names]
            ax.bar(x + shift, [100 * s["mean"] for s in stats], 0.4, yerr=[100 * s["std"] for s in stats], capsize=3,
                   label=label)
        ax.set_xticks(x, names)
        ax.set_ylabel(f"test {metric} (%)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{claim.name}: mean ± std over fold models (average) and over seeds {seeds} (ensemble)")
    return _save(fig, claim, "average-ensemble")


def make_figures(claim: Claim, methods: list[Method], seeds: list[int], out: Path) -> list[Path]:
    FIGURES.mkdir(parents=True, exist_ok=True)
    made = []
    for kind in claim.figures:
        if kind == "train_digits":
            made.append(figure_train_digits(claim, methods, seeds[0], out))
        elif kind == "scatter_2d":
            made.append(figure_scatter_2d(claim, methods, seeds[0], out))
        elif kind == "covering_radius":
            made.append(figure_covering_radius(claim, methods, seeds, out))
        elif kind == "val_curves":
            made.append(figure_val_curves(claim, methods, seeds, out))
        elif kind == "fold_ensemble":
            made.append(figure_fold_ensemble(claim, methods, seeds, out))
    return [p for p in made if p is not None]


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("claims", nargs="*", help=f"claims to run: {', '.join(CLAIMS)} (or 'all')")
    parser.add_argument("--quick", action="store_true", help="short budget (quick_steps) and 1 seed unless --seeds")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2; quick: 0)")
    parser.add_argument("--steps", type=int, default=None, help="override the claim's step budget")
    parser.add_argument("--methods", nargs="+", default=None, help="only these methods of the claims")
    parser.add_argument("--core", action="store_true",
                        help="only the claims and arms each verdict rests on (the 15-minute check: all --quick --core)")
    parser.add_argument("--threads", type=int, default=THREADS, help=f"torch threads per run (default {THREADS})")
    parser.add_argument("--out", default=None, help="output root (default runs/repro or runs/repro-quick)")
    parser.add_argument("--summary-only", action="store_true", help="only summarise and plot finished runs")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--list", action="store_true", help="list the claims and their methods")
    parser.add_argument("--pixels", action="store_true",
                        help="print the raw-pixel reference of the MNIST-5k and digits test splits")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["claims"]:
        return claims_main(argv[1:])
    args = parse_args(argv)
    if args.pixels:
        for data_name in ("mnist", "digits"):
            ref = pixel_reference(data_name)
            print(f"{data_name}: raw pixels, " + ", ".join(f"{k}={100 * ref[k]:.1f}" for k in ("recall_at_1", "map_at_r", "nmi")))
        return 0
    if args.list or not args.claims:
        for c in CLAIMS.values():
            protocol = f", {c.folds}-fold" if c.folds else ""
            print(f"{c.name}{'' if c.core else ' (not core)'}: {c.title} [{c.steps} steps, quick {c.quick_steps}{protocol}]")
            for m in c.methods:
                tags = "".join(t for t, on in ((" (full only)", m.full_only), (" (not core)", not m.core)) if on)
                print(f"    {m.name}{tags}: {m.preset} {' '.join(m.overrides)}")
        return 0
    global THREADS
    THREADS = args.threads
    names = list(CLAIMS) if args.claims == ["all"] else args.claims
    if args.core:
        names = [n for n in names if n not in CLAIMS or CLAIMS[n].core]
    unknown = [n for n in names if n not in CLAIMS]
    if unknown:
        print(f"unknown claims {unknown}; known: {', '.join(CLAIMS)}", file=sys.stderr)
        return 2
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    out = Path(args.out or ("runs/repro-quick" if args.quick else "runs/repro"))
    for name in names:
        claim = CLAIMS[name]
        steps = args.steps or (claim.quick_steps if args.quick else claim.steps)
        methods = [m for m in claim.methods if not (args.quick and m.full_only) and (m.core or not args.core)]
        if args.methods:
            methods = [m for m in methods if m.name in args.methods]
        if not args.summary_only:
            for seed in seeds:  # seed-major: every method gets seed 0 before any gets seed 1
                for method in methods:
                    (train_folds if claim.folds else train_one)(claim, method, seed, steps, out, print)
        summary = summarise(claim, methods, seeds, steps, out)
        figures = [] if args.no_figures else make_figures(claim, methods, seeds, out)
        protocol = f", {claim.folds}-fold class-disjoint" if claim.folds else ""
        print(f"\n## {claim.name}: {claim.title}\n{steps} steps{protocol}, seeds {seeds}, out {out / claim.name}\n")
        print(markdown_table(claim, summary))
        for f in figures:
            print(f"figure: {f.relative_to(REPO) if f.is_relative_to(REPO) else f}")
    return 0


def _verify_claims(path: Path) -> int:
    """``claims --verify FILE``: 0 when every statistic recomputes, 1 listing the disagreements, 2 for an unreadable file."""
    from dmlkit.claims.verify import verify

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        problems = verify(data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {str(path)!r} is not a claims.json the claims runner wrote ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    rows = sum(len(s["comparisons"]) for s in data["claims"].values())
    print(f"{rows} comparisons of {len(data['claims'])} claims: "
          + ("every statistic recomputes" if not problems else f"{len(problems)} disagreements"))
    return 1 if problems else 0


def claims_main(argv: list[str]) -> int:
    """``reproduce.py claims``: the five papers' claims on Omniglot glyphs and grocery photos (:mod:`dmlkit.claims`)."""
    from dmlkit.claims import CLAIMS, UNTESTED, run_claims
    from dmlkit.claims.catalogue import is_photo_claim
    from dmlkit.exceptions import DmlkitError

    parser = argparse.ArgumentParser(prog="reproduce.py claims", description=run_claims.__doc__.split("\n")[0])
    parser.add_argument("claims", nargs="*", help=f"claims to run (default: all): {', '.join(CLAIMS)}")
    parser.add_argument("--quick", action="store_true",
                        help="one grid point, 20 glyph steps on 5 drawings a character, 2 photo steps on 4 photos a product, "
                             "seeds 0 1: every arm end to end, not a result")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="glyph seeds (default 0-7; photos take the first 5; quick: 0 1)")
    parser.add_argument("--out", default=None, help="output folder (default results/claims, which holds the committed "
                                                    "run records, or runs/claims-quick)")
    parser.add_argument("--data-root", default=str(REPO.parent / "shared" / "data"),
                        help="folder holding omniglot/ (images_background*.zip or its folders) and "
                             "grocery/images/<class>/*.jpg with grocery/coarse_classes.csv")
    parser.add_argument("--device", default="cpu", help="where every run trains: cpu, cuda or cuda:N")
    parser.add_argument("--photo-size", type=int, default=None,
                        help="photo training resolution (default 128; 224 is the variant for a card)")
    parser.add_argument("--workers", type=int, default=None,
                        help="runs trained at once, each on --threads torch threads (default: one a core this process "
                             "may use; results do not depend on it)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    parser.add_argument("--list", action="store_true", help="list the claims, their arms and the untested claims")
    parser.add_argument("--verify", metavar="CLAIMS_JSON", default=None,
                        help="recompute every printed statistic of a claims.json from its per-seed values (scipy alone)")
    args = parser.parse_args(argv)
    if args.verify:
        return _verify_claims(Path(args.verify))
    if args.list:
        for c in CLAIMS.values():
            photos = " (photos)" if is_photo_claim(c.name) else ""
            print(f"{c.name}: {c.paper} {c.source}: {c.statement} [{c.metric}; arms {', '.join(c.arms)}]{photos}")
        print("untested:")
        for k, v in UNTESTED.items():
            print(f"  {k}: {v}")
        return 0
    out = Path(args.out or ("runs/claims-quick" if args.quick else REPO / "results" / "claims"))
    try:
        import dataclasses

        from dmlkit.claims.runner import FULL, QUICK

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        workers = args.workers or cores
        budget = dataclasses.replace(QUICK if args.quick else FULL, threads=args.threads, device=args.device)
        if args.photo_size:
            budget = dataclasses.replace(budget, photo_size=args.photo_size)
        run_claims(args.claims or list(CLAIMS), out, args.data_root, quick=args.quick, seeds=args.seeds,
                   budget=budget, workers=workers)
    except DmlkitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print((out / "claims.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
