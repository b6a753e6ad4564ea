"""Ensemble members that each hold out their own fold of the training classes (``protocol.member_folds``).

Musgrave et al.'s protocol (ASAP App. A.2) trains one model per fold of the training classes, each selected on
its own held-out fold, and reports their concatenated embeddings as the ensemble. With ``protocol.member_folds``
an ensemble of ``N`` members (:class:`~dmlkit.models.EmbedderEnsemble`) is trained that way in one run:

- the training classes fall into ``K = round(1 / protocol.val_class_fraction)`` seeded folds, fold 0 being the
  validation classes the run held out anyway (:func:`fold_classes`); member ``i`` holds out fold ``i``;
- every step draws one batch per member from its own training classes (:class:`MemberBatchSampler`, the
  sampler's ``m``-per-class batches), the batches side by side: member ``i`` embeds the ``i``-th block of rows
  (``EmbedderEnsemble.member_batches``) and learns from it with its own loss over its own classes
  (:class:`~dmlkit.engine.objective.EnsembleObjective` with ``member_labels``);
- a validation scores member ``i`` on its own fold (:func:`score_member_folds`); the pooled per-query MAP@R
  selects the checkpoint (one step for the whole ensemble).

So the ensemble has seen every training class (each member ``(K - 1) / K`` of them), where members sharing one
validation fold all miss the same classes. The test split is embedded by the whole ensemble, as any ensemble.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dmlkit.core.seeds import derive_generator
from dmlkit.data.splits import member_fold_count as fold_count


@dataclass
class MemberFolds:
    """Each member's held-out classes (``classes[i]``, names), the rows of the training split it trains on
    (``train_rows[i]``), the rows of the validation split it is scored on (``val_rows[i]``), and the lookup from the
    run's labels (``0..C-1``) to its own (``label_maps[i]``, ``-1`` for its held-out classes)."""

    classes: list[list[str]]
    train_rows: list[torch.Tensor]
    val_rows: list[torch.Tensor]
    label_maps: list[torch.Tensor]

    @property
    def members(self) -> int:
        return len(self.classes)

    def class_counts(self) -> list[int]:
        """The number of training classes of each member (its proxies)."""
        return [int((m >= 0).sum()) for m in self.label_maps]


def fold_classes(held: list[str], rest: list[str], members: int, folds: int, seed: int) -> list[list[str]]:
    """``members`` disjoint folds of classes: ``held`` (the run's validation classes) first, then parts of ``rest``
    dealt round-robin in a seeded order into ``folds - 1`` parts of about the size of ``held``."""
    if not 1 <= members <= folds:
        raise ValueError(f"member folds need 1 <= members <= folds. Got members={members}, folds={folds}.")
    names = sorted(rest)
    order = torch.randperm(len(names), generator=derive_generator(seed, "member folds")).tolist()
    parts = [sorted(names[j] for j in order[k::folds - 1]) for k in range(folds - 1)]
    return [sorted(held), *parts][:members]


def apply_member_folds(splits, label_map, members: int, fraction: float, seed: int) -> MemberFolds:
    """Give each of ``members`` members its own fold: ``splits.train`` becomes the training split before the
    validation classes were held out (``splits.before_holdout``), ``splits.val`` the images of every member's
    fold (evaluation transform); ``label_map`` is the run's (:class:`~dmlkit.engine.batches.LabelMap` of the new
    ``splits.train``)."""
    full, val = splits.before_holdout, splits.val
    if full is None or val is None:
        raise ValueError("member folds need the validation classes held out of the training split "
                         "(protocol.val_class_fraction > 0).")
    held = sorted(set(val.class_names))
    names = list(full.class_names)
    rest = sorted(set(names) - set(held))
    folds = fold_classes(held, rest, members, fold_count(fraction), seed)
    index = {name: i for i, name in enumerate(names)}
    in_fold = [torch.isin(full.labels, torch.tensor([index[c] for c in fold], dtype=full.labels.dtype))
               for fold in folds]
    val_rows_full = torch.nonzero(torch.stack(in_fold).any(0)).flatten()
    evaluation = full.subset(val_rows_full, relabel=False)
    evaluation.transform, evaluation.augmentation_seed = val.transform, None
    position = torch.full((len(full.labels),), -1, dtype=torch.int64)
    position[val_rows_full] = torch.arange(len(val_rows_full))
    run_labels = label_map(full.labels)
    label_maps = []
    for mask in in_fold:
        own = torch.unique(run_labels[~mask])  # the member's training classes, as run labels
        lookup = torch.full((len(label_map),), -1, dtype=torch.int64)
        lookup[own] = torch.arange(len(own))
        label_maps.append(lookup)
    splits.train, splits.val = full, evaluation
    splits.info["member_val_classes"] = folds
    return MemberFolds(folds, [torch.nonzero(~m).flatten() for m in in_fold],
                       [position[torch.nonzero(m).flatten()] for m in in_fold], label_maps)


class MemberBatchSampler:
    """One batch per member each step, side by side: ``batches(epoch)`` is ``[num_batches, members x batch]``,
    block ``i`` drawn by ``samplers[i]`` (over member ``i``'s training rows ``rows[i]``, given as rows of the
    whole split). An epoch is as many steps as the member with the fewest batches has."""

    def __init__(self, samplers: list, rows: list[torch.Tensor]):
        if len(samplers) != len(rows) or not samplers:
            raise ValueError(f"MemberBatchSampler needs one sampler per member's rows. Got {len(samplers)} samplers "
                             f"and {len(rows)} row sets.")
        self.samplers, self.rows = samplers, rows

    @property
    def num_batches(self) -> int:
        return min(len(s.batches(0)) for s in self.samplers)

    def batches(self, epoch: int) -> torch.Tensor:
        parts = [rows[s.batches(epoch)] for s, rows in zip(self.samplers, self.rows)]
        count = min(len(p) for p in parts)
        return torch.cat([p[:count] for p in parts], dim=1)


def score_member_folds(model, val, folds: MemberFolds, embed, score) -> tuple[dict, torch.Tensor | None]:
    """Validation metrics of a member-fold ensemble: member ``i`` embeds its fold's rows of ``val`` (``embed(module,
    dataset) -> (embeddings, labels)``) and ``score(embeddings, labels) -> (metrics, per-query AP@R or None)`` scores
    them; the metrics are means over all folds' queries (each fold weighted by its images), the per-query AP@R
    concatenated (None when ``score`` gives none). Also ``map_at_r_member_<i>`` for each member."""
    sums: dict[str, float] = {}
    members: dict[str, float] = {}
    per_query = []
    for i, (member, rows) in enumerate(zip(model.members, folds.val_rows)):
        fold_metrics, ap = score(*embed(member, val.subset(rows, relabel=False)))
        for key, value in fold_metrics.items():
            if isinstance(value, (int, float)):
                sums[key] = sums.get(key, 0.0) + float(value) * len(rows)
        members[f"map_at_r_member_{i}"] = float(fold_metrics["map_at_r"])
        if ap is not None:
            per_query.append(ap)
    total = float(sum(len(rows) for rows in folds.val_rows))
    pooled = {key: value / total for key, value in sums.items()}
    return {**pooled, **members}, torch.cat(per_query) if per_query else None


__all__ = ["MemberBatchSampler", "MemberFolds", "apply_member_folds", "fold_classes", "fold_count",
           "score_member_folds"]
