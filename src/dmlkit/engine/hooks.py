"""The training loop's extension points: a method (ASAP) is a set of hooks the engine calls.

The engine never names a method: :func:`dmlkit.methods.build_method_hooks` picks the registered
method the config enables and the :class:`~dmlkit.engine.trainer.Trainer` calls its hooks at the
points below. Hook state is part of every checkpoint (``state_dict``), so resume is exact.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dmlkit.engine.trainer import Trainer


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

    def on_train_start(self, trainer: "Trainer") -> None:
        """Called once before the first step (also after a resume)."""

    def on_batch_embeddings(self, trainer: "Trainer", indices: list[int], embeddings: torch.Tensor) -> None:
        """Called with each training batch's dataset rows and (detached) embeddings."""

    def after_backward(self, trainer: "Trainer") -> None:
        """Called after ``loss.backward()``, before clipping and the optimiser step."""

    def on_evaluation(self, trainer: "Trainer", score: float, improved: bool) -> bool:
        """Called after each validation; return True to stop training."""
        return trainer.evals_since_best >= (trainer.cfg.train.patience or math.inf)

    def on_train_end(self, trainer: "Trainer") -> None:
        """Called once after the last step, before the selected weights are tested."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


def overrides_hook(hooks: MethodHooks, name: str) -> bool:
    """Whether ``hooks`` replaces the do-nothing ``MethodHooks.<name>`` (else the loop skips preparing its input)."""
    method = getattr(hooks, name)
    return getattr(method, "__func__", method) is not getattr(MethodHooks, name)
