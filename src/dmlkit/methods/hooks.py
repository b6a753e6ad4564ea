"""The training loop's extension points for a method (ASAP): a set of hooks the engine calls.

The contract lives here, beside the registry of methods (:mod:`dmlkit.methods.registry`), so the
methods package never imports the engine: the engine imports methods, never the reverse (no
import cycle between the two packages). The engine never names a method:
:func:`dmlkit.methods.build_method_hooks` picks the registered method the config enables and the
:class:`~dmlkit.engine.trainer.Trainer` calls its hooks at the points below. Hook state is part of
every checkpoint (``state_dict``), so resume is exact. User code extends the loop with callbacks
(:mod:`dmlkit.engine.callbacks`) instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from torch import nn

    from dmlkit.config.schema import RunConfig
    from dmlkit.data.base import DataSplits
    from dmlkit.engine.batches import LabelMap
    from dmlkit.engine.run_dir import RunDirectory


class TrainingState(Protocol):
    """Everything a method's hooks may read or change on the trainer: the whole interface.

    A method reads the run's ``cfg``, ``splits`` (``train``/``val``), ``label_map`` (dataset
    labels -> 0..C-1) and ``device``; it may change ``model`` and ``objective`` weights (the
    proxies are ``objective.loss.bank``) and ``optimizer`` state; it reads the loop's position
    (``step``, ``elapsed``) and selection (``best_score``, ``evals_since_best``); it logs through
    ``run_dir.log(record)``. Nothing else of the trainer is part of the contract.
    """

    cfg: "RunConfig"
    splits: "DataSplits"
    label_map: "LabelMap"
    device: torch.device
    model: "nn.Module"
    objective: "nn.Module"
    optimizer: torch.optim.Optimizer
    run_dir: "RunDirectory"
    step: int
    elapsed: float
    best_score: float
    evals_since_best: int


class MethodHooks:
    """Extension points of the loop; the default does nothing (plain training)."""

    @classmethod
    def enabled(cls, cfg) -> bool:
        """Whether the run config asks for this method (registered methods override it)."""
        return False

    @classmethod
    def loss_arguments(cls, cfg) -> dict:
        """Loss constructor arguments the method sets (only used where the loss takes them)."""
        return {}

    def on_train_start(self, trainer: TrainingState) -> None:
        """Called once before the first step (also after a resume)."""

    def on_batch_embeddings(self, trainer: TrainingState, indices: list[int], embeddings: torch.Tensor) -> None:
        """Called with each training batch's dataset rows and (detached) embeddings."""

    def after_backward(self, trainer: TrainingState) -> None:
        """Called after ``loss.backward()``, before clipping and the optimiser step."""

    def on_evaluation(self, trainer: TrainingState, score: float, improved: bool) -> bool:
        """Called after each validation; return True to stop training (``train.patience`` is the
        :class:`~dmlkit.engine.callbacks.EarlyStopping` callback of plain training)."""
        return False

    def on_train_end(self, trainer: TrainingState) -> None:
        """Called once after the last step, before the selected weights are tested."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


def overrides_hook(hooks: MethodHooks, name: str) -> bool:
    """Whether ``hooks`` replaces the do-nothing ``MethodHooks.<name>`` (else the loop skips preparing its input)."""
    method = getattr(hooks, name)
    return getattr(method, "__func__", method) is not getattr(MethodHooks, name)
