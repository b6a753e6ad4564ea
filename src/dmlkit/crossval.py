"""The 4-fold protocol of ASAP Table 1 (after Musgrave et al.): fold models, average and ensemble.

For each seed and each fold ``f`` a model is trained on the other folds of the training classes
and selected on fold ``f``; all fold models embed the same test split. Reported: the mean and
standard deviation over fold models of each metric (the "128-D average"), and the metrics of
the concatenated, re-normalised embeddings of the fold models of one seed (the "512-D
ensemble"), then mean and std over seeds.
"""

from __future__ import annotations

import logging
import shutil
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from dmlkit.config.schema import RunConfig
from dmlkit.core.json_files import read_json
from dmlkit.core.messages import messages
from dmlkit.engine import run_layout as layout
from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.evaluation.metrics import RETRIEVAL_SUMMARY_KEYS
from dmlkit.exceptions import RecordError

REPORTED = RETRIEVAL_SUMMARY_KEYS

log = logging.getLogger(__name__)


def _mean_std(values: list[float]) -> dict:
    return {
        "mean": float(statistics.fmean(values)),
        "std": float(statistics.stdev(values)) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def _stopped_before_a_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a fold's training run claimed by dmlkit that ended before its first checkpoint."""
    try:
        claim = read_json(run_dir / layout.CLAIM_FILE)
    except (OSError, RecordError):
        return False
    return isinstance(claim, dict) and claim.get("kind") == "train" and not (run_dir / layout.LAST_CHECKPOINT).exists()


def run_crossval(
    cfg: RunConfig,
    out_dir: str | Path,
    *,
    seeds: list[int],
    folds: list[int] | None = None,
    echo: Callable[[str], None] | None = None,
) -> dict:
    """Train every (seed, fold) model into ``out_dir/seed<S>/fold<F>`` and summarise; resumable."""
    from dmlkit.evaluation import ensemble_retrieval_metrics
    from dmlkit.launch import launch

    out_dir, echo = Path(out_dir), messages(echo, log)
    folds = list(range(cfg.protocol.num_folds)) if folds is None else folds
    per_model: dict[str, list[float]] = {k: [] for k in REPORTED}
    per_ensemble: dict[str, list[float]] = {k: [] for k in REPORTED}
    runs = []
    for seed in seeds:
        parts, labels, gallery_parts, gallery_labels = [], None, [], None
        for fold in folds:
            run_dir = out_dir / f"seed{seed}" / f"fold{fold}"
            fold_cfg = replace(cfg, seed=seed, name=f"{cfg.name}-s{seed}-f{fold}",
                               protocol=replace(cfg.protocol, fold=fold, seed=seed),
                               eval=replace(cfg.eval, save_embeddings=True))
            metrics_path = run_dir / layout.METRICS_FILE
            if not metrics_path.exists():
                resume = (run_dir / layout.LAST_CHECKPOINT).exists()
                echo(f"{'resuming' if resume else 'training'} seed {seed} fold {fold} -> {run_dir}")
                if not resume and _stopped_before_a_checkpoint(run_dir):
                    shutil.rmtree(run_dir)  # nothing to keep; any other folder is left to launch's claim to refuse
                with launch(fold_cfg, run_dir, resume=resume, report=False) as trainer:  # claimed; its train.log
                    trainer.fit()
            metrics = read_json(metrics_path)
            runs.append({"seed": seed, "fold": fold, "run_dir": str(run_dir), **{k: metrics[k] for k in REPORTED}})
            for k in REPORTED:
                per_model[k].append(float(metrics[k]))
            with np.load(run_dir / layout.TEST_EMBEDDINGS_FILE) as z:
                parts.append(torch.from_numpy(z["embeddings"]))
                these = torch.from_numpy(z["labels"])
            if labels is not None and not torch.equal(labels, these):
                raise RuntimeError(f"fold models of seed {seed} embedded different test sets")
            labels = these
            gallery_file = run_dir / layout.embeddings_file("gallery")
            if gallery_file.exists():  # query -> gallery data sets (In-Shop)
                with np.load(gallery_file) as z:
                    gallery_parts.append(torch.from_numpy(z["embeddings"]))
                    gallery_labels = torch.from_numpy(z["labels"])
        if gallery_parts:
            ensemble = ensemble_retrieval_metrics(
                parts, labels, reference_parts=gallery_parts, reference_labels=gallery_labels
            )
        else:
            ensemble = ensemble_retrieval_metrics(parts, labels)
        for k in REPORTED:
            per_ensemble[k].append(float(ensemble[k]))
    width = int(parts[0].shape[1])  # the fold models' embedding size (the recipe fills it in when the config leaves it)
    summary = {
        "name": cfg.name,
        "seeds": seeds,
        "folds": folds,
        "embedding_size": width,
        "ensemble_size": width * len(folds),
        "average": {k: _mean_std(v) for k, v in per_model.items()},
        "ensemble": {k: _mean_std(v) for k, v in per_ensemble.items()},
        "runs": runs,
    }
    atomic_write_json(out_dir / layout.CROSSVAL_SUMMARY_FILE, summary)
    return summary


def format_crossval(summary: dict) -> str:
    """ASAP Table 1 layout: ``metric  average (D) mean ± std  ensemble (kD) mean ± std``."""
    d, e = summary["embedding_size"], summary["ensemble_size"]
    lines = [f"{'metric':<16}{f'{d}-D average':>22}{f'{e}-D ensemble':>22}"]
    for k in REPORTED:
        a, b = summary["average"][k], summary["ensemble"][k]
        lines.append(f"{k:<16}{a['mean']:>14.4f} ± {a['std']:.4f}{b['mean']:>14.4f} ± {b['std']:.4f}")
    return "\n".join(lines)
