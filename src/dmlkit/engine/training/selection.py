"""Validation, checkpoint selection and the final test evaluation.

Every ``eval_every`` steps the validation fold is embedded and scored; MAP@R selects ``best.pt``
(for a pretrained backbone only with a gain over the untrained embedding of more than
:data:`SIGNIFICANT_ERRORS` paired standard errors, per query). At the end the selected weights
embed the test split once (:meth:`SelectionMixin.finish`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dmlkit.config.schema import selects_by_significance
from dmlkit.engine import device_data, distributed
from dmlkit.engine.checkpoint_files import atomic_write_json, load_checkpoint, save_checkpoint
from dmlkit.engine.member_folds import score_member_folds
from dmlkit.engine.run_layout import METRICS_FILE
from dmlkit.evaluation.embed import embed_dataset
from dmlkit.evaluation.evaluate import evaluate
from dmlkit.evaluation.metrics import SELECTION_METRIC
from dmlkit.evaluation.retrieval import map_at_r_per_query, paired_gain
from dmlkit.models.embedder import shift_radius


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns."""

    test_metrics: dict
    best_step: int
    steps: int
    selected_on: str
    run_dir: Path
    val_history: list = field(default_factory=list)


class SelectionMixin:
    """Scoring splits, choosing the weights to keep, the test split at the end (:class:`~dmlkit.engine.trainer.Trainer`)."""

    def embed(self, dataset, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings and labels of a whole split with the current weights, under the training autocast
        (as ``dmlkit evaluate`` and ``dmlkit embed`` embed a run's splits, so they reproduce the metrics)."""
        return embed_dataset(self.model, device_data.resident_on(dataset, self.device), self.cfg.eval.batch_size,
                             self.cfg.data.num_workers, self.autocast_dtype, progress=progress)

    def _embed_with(self, module, dataset) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings and labels of a split by ``module`` (one ensemble member), as :meth:`embed` does the model's."""
        return embed_dataset(module, device_data.resident_on(dataset, self.device), self.cfg.eval.batch_size,
                             self.cfg.data.num_workers, self.autocast_dtype)

    def _score_with_queries(self, embeddings: torch.Tensor, labels: torch.Tensor, per_query: bool
                            ) -> tuple[dict, torch.Tensor | None]:
        """Validation metrics of one split's embeddings, and their per-query AP@R when ``per_query`` (the
        significance rule compares them)."""
        ap = (map_at_r_per_query(self._searched(embeddings), labels, backend=self.cfg.eval.backend)
              if per_query else None)
        return self.score(embeddings, labels, clustering=False), ap

    def score(self, embeddings: torch.Tensor, labels: torch.Tensor, *, clustering: bool,
              reference: tuple[torch.Tensor, torch.Tensor] | None = None,
              own_reference: torch.Tensor | None = None) -> dict:
        """Retrieval, verification (and optionally clustering) metrics; ``reference`` is a separate gallery (In-Shop),
        ``own_reference`` the gallery row that is each query itself (-1: none; a CSV row both query and gallery).

        Verification and clustering see every embedding of the split once (queries and gallery together):
        :func:`dmlkit.evaluation.evaluate`, as ``dmlkit evaluate`` scores a run's splits."""
        gallery, gallery_labels = reference if reference is not None else (None, None)
        groups = ("retrieval", "verification", "clustering") if clustering else ("retrieval", "verification")
        return evaluate(embeddings, labels, reference=gallery, reference_labels=gallery_labels,
                        own_reference=own_reference, metrics=groups, ks=self.cfg.eval.ks,
                        backend=self.cfg.eval.backend, over_cluster=self.cfg.eval.over_cluster, ami=True,
                        seed=self.cfg.seed, search_device=self._search_device())

    def _search_device(self) -> torch.device | None:
        """Where the k-NN metrics search: the training GPU (``evaluation.knn_device``), else where the embeddings are."""
        return self.device if self.device.type == "cuda" else None

    def _searched(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Embeddings where the k-NN metrics search them (:meth:`_search_device`)."""
        device = self._search_device()
        return embeddings if device is None else embeddings.to(device)

    def evaluate_split(self, dataset, *, clustering: bool) -> dict:
        """Embed a split and compute retrieval, verification (and optionally clustering) metrics."""
        return self.score(*self.embed(dataset), clustering=clustering)

    def _timed_validation(self) -> bool:
        """:meth:`validate_and_should_stop`, its seconds added to ``eval_seconds``; returns whether to stop."""
        start = self.clock()
        try:
            return self.validate_and_should_stop()
        finally:
            self.eval_seconds.append(self.clock() - start)

    def validate_and_should_stop(self) -> bool:
        """Score the validation fold and track the best weights; returns whether training should stop (the method's
        hooks, or a callback such as early stopping, asked for it)."""
        # Rank 0 scores; every rank does the same bookkeeping and hooks, so ranks stay identical (ASAP).
        compare = selects_by_significance(self.cfg)
        result = None
        with shift_radius(self.model, self.cfg.eval.val_shift_average):  # the validation's shifts, not the test's
            if self.dist.is_main and self.member_folds is not None:  # each member on its own fold (member_folds.py)
                result = score_member_folds(self.model, self.splits.val, self.member_folds, self._embed_with,
                                            lambda e, y: self._score_with_queries(e, y, compare))
            elif self.dist.is_main:
                result = self._score_with_queries(*self.embed(self.splits.val), compare)
        metrics, per_query = distributed.broadcast_object(result)
        score = float(metrics[SELECTION_METRIC])
        improved = score > self.best_score
        progress = improved
        if compare and self.step == 0:
            self.pretrained_val_ap = self.reference_val_ap = per_query  # the untrained embedding: what training must beat
        elif compare and self.pretrained_val_ap is not None:
            gain, error = paired_gain(per_query, self.pretrained_val_ap)
            metrics = {**metrics, "gain_over_pretrained": gain, "gain_standard_error": error}
            improved = improved and gain > SIGNIFICANT_ERRORS * error
            # the stopping rule: progress is a significant gain over the last validation that made one
            step_gain, step_error = paired_gain(per_query, self.reference_val_ap)
            progress = step_gain > SIGNIFICANT_ERRORS * step_error
            if progress:
                self.reference_val_ap = per_query
            metrics = {**metrics, "gain_over_reference": step_gain, "reference_standard_error": step_error}
        self.last_eval_improved = progress
        if improved:
            self.best_score, self.best_step, self.evals_since_best = score, self.step, 0
            if self.dist.is_main:
                save_checkpoint(self.run_dir.best_checkpoint, self.weights_state())
        else:
            self.evals_since_best += 1
        self.run_dir.log({"kind": "eval", "split": "val", "step": self.step, "time": self.elapsed, **_floats(metrics)})
        stop = self.hooks.on_evaluation(self, score, improved)
        self.callbacks.call("on_evaluation_end", self, self.step, metrics)
        return stop or self.should_stop

    def val_history(self) -> list[tuple[int, float]]:
        """``(step, validation MAP@R)`` of every validation evaluation logged so far."""
        return [(int(r["step"]), float(r[SELECTION_METRIC])) for r in self.run_dir.read_log()
                if r.get("kind") == "eval" and r.get("split") == "val" and SELECTION_METRIC in r]

    def finish(self, has_val: bool) -> TrainResult:
        """Load the selected weights, evaluate the test split once, write the results.

        A trainer made with ``evaluate_test=False`` (a sweep's trial: its objective must not see test
        metrics) stops after selection: no test split, no ``metrics.json``; the callbacks' ``on_fit_end``
        still runs, with the selected step and the validation history.
        """
        if not self.evaluate_test:
            result = TrainResult({}, self.best_step, self.step, "val", self.run_dir.path, val_history=self.val_history())
            self.callbacks.call("on_fit_end", self, result)
            return result
        kept_pretrained = None
        if has_val and self.run_dir.best_checkpoint.exists():
            best = load_checkpoint(self.run_dir.best_checkpoint)
            self.model.load_state_dict(best["model"])
            self.objective.load_state_dict(best["objective"])
            selected_on = "val"
            if selects_by_significance(self.cfg):
                kept_pretrained = self.best_step == 0
                self.echo(_selection_message(self.val_history(), self.best_step))
        else:
            save_checkpoint(self.run_dir.best_checkpoint, self.weights_state())
            self.best_step = self.step
            selected_on = "last"
        clustering = self.cfg.eval.clustering
        # In-Shop style (query_gallery): queries retrieve from a separate gallery, saved as "gallery"
        if getattr(self.splits, "eval_mode", "leave_one_out") == "query_gallery":
            embedded = {"test": self.splits.query, "gallery": self.splits.gallery}
        else:
            embedded = {"test": self.splits.test} if self.splits.test is not None else {}  # objects: test optional
        progress = bool(self.cfg.train.progress and self.dist.is_main)  # the test split: a bar with its own ETA
        embedded = {split: (dataset, *self.embed(dataset, progress)) for split, dataset in embedded.items()}
        reference = embedded["gallery"][1:] if "gallery" in embedded else None
        own = own_rows(self.splits) if reference is not None else None
        metrics = self.score(*embedded["test"][1:], clustering=clustering, reference=reference,
                             own_reference=own) if embedded else {}
        metrics = _floats(metrics)
        result = dict(metrics)
        categories = getattr(self.splits, "categories", None)
        if embedded and categories is not None:  # a CSV 'category' column: each category's queries, whole gallery
            result["per_category"] = per_category_metrics(*embedded["test"][1:], categories, reference, own,
                                                          self.cfg.eval.ks, self.cfg.eval.backend)
        result.update(selected_on=selected_on, best_step=self.best_step, steps=self.step,
                      train_seconds=round(self.elapsed, 3), schedule=self.schedule.record(self.step))
        if kept_pretrained is not None:
            result["kept_pretrained"] = kept_pretrained
        if embedded:
            self.run_dir.log({"kind": "eval", "split": "test", "step": self.step, "time": self.elapsed, **metrics})
        # data.skip_bad_images: files found unreadable while reading per item (in this process; see ImageFileDataset)
        skipped = self.run_dir.record_skipped_images(self.splits.skipped_per_item(), self.step)
        if skipped:
            self.echo.warning(f"skipped {len(skipped)} unreadable image(s) read per item; listed in manifest.json and log.jsonl")
        atomic_write_json(self.run_dir.path / METRICS_FILE, result)
        if self.cfg.eval.save_embeddings:  # the embeddings just scored, not a second pass
            for split, (dataset, embeddings, labels) in embedded.items():
                self.run_dir.save_embeddings(split, embeddings, labels, dataset, self.objective, self.cfg)
        result = TrainResult(metrics, self.best_step, self.step, selected_on, self.run_dir.path,
                             val_history=self.val_history())
        self.callbacks.call("on_fit_end", self, result)
        return result


def per_category_metrics(embeddings: torch.Tensor, labels: torch.Tensor, categories: list[str],
                         reference: tuple[torch.Tensor, torch.Tensor] | None, own: torch.Tensor | None,
                         ks, backend: str) -> dict[str, dict]:
    """``metrics.json``'s ``per_category``: retrieval metrics of each category's queries against the whole
    gallery (``reference``; None: leave-one-out over the split)."""
    from dmlkit.evaluation import retrieval_metrics_per_group

    gallery, gallery_labels = reference if reference is not None else (None, None)
    per_group = retrieval_metrics_per_group(embeddings, labels, categories, reference=gallery,
                                            reference_labels=gallery_labels, ks=tuple(ks), backend=backend,
                                            own_reference=own)
    return {name: _floats(values) for name, values in per_group.items()}


def own_rows(splits) -> torch.Tensor | None:
    """The gallery row that is each query itself (same image path; -1: none), for a query/gallery split
    whose rows may be both (a CSV with ``is_query``/``is_gallery``); None when the splits have no paths."""
    from dmlkit.evaluation import own_reference_rows

    query, gallery = splits.query, splits.gallery
    if getattr(query, "paths", None) is None or getattr(gallery, "paths", None) is None:
        return None
    return own_reference_rows(query.paths, gallery.paths)


#: A fine-tuned checkpoint replaces the pretrained embedding only when its validation MAP@R gain, paired
#: per query, exceeds this many standard errors (a one-sided test at about 2 %): with few validation
#: classes a gain of a few thousandths is noise, and keeping it would make the run worse than the backbone.
SIGNIFICANT_ERRORS = 2.0


def _selection_message(history: list[tuple[int, float]], best_step: int) -> str:
    """What the run kept: the pretrained embedding (best at step 0) or a fine-tuned checkpoint."""
    scores = dict(history)
    start, best = scores.get(0), scores.get(best_step)
    if best_step == 0:
        last_step, last = max(history) if history else (0, start)
        return (f"kept the pretrained embedding: no fine-tuned checkpoint beat its validation MAP@R {start:.4f} "
                f"by more than {SIGNIFICANT_ERRORS:g} standard errors (step {last_step}: {last:.4f}); training did "
                "not help on the held-out classes")
    gain = "" if start is None else f", against {start:.4f} for the pretrained embedding at step 0"
    return f"kept the fine-tuned checkpoint of step {best_step}: validation MAP@R {best:.4f}{gain}"


def _floats(metrics: dict) -> dict:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool):
            out[k] = float(v) if not isinstance(v, (int, np.integer)) else int(v)
    return out
