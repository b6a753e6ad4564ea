"""Launch-free training steps: the step's forward, loss and backward compiled and, on a card, replayed as CUDA graphs.

On a card a small model's step is host work: hundreds of kernel launches the card finishes faster than
Python queues them. ``train.step_capture=compile`` compiles the step's forward and objective with
``torch.compile`` (``mode="reduce-overhead"`` on CUDA: the compiled forward and its backward are
captured as CUDA graphs and replayed with one launch each; the default mode on the CPU, where there are
no graphs and the point is only to run the same path in tests). The optimiser stays eager: the fused
AdamW a card gets is a few launches, and its state, the schedule's learning rate and the device-side
finite check (:mod:`~dmlkit.engine.training.step_checks`) need no capture to stay off the host.

What cannot be captured trains eagerly, with the reason recorded in the run's choices
(``resolved.json``); which runs are captured (``auto``: after the first steps were timed, against
the compilation's cost) is the recipe's decision (:mod:`dmlkit.recipe.step_capture_plan`), handed over
as a :class:`CaptureDecision`. Shapes are fixed: dmlkit's samplers give every
batch the same size; a batch of another shape takes the eager path.

Checkpoints and resume are unchanged: the compiled function shares the model's and the objective's
parameters and buffers, so their ``state_dict`` is the eager run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

CAPTURE_MODES = ("auto", "off", "compile")

@dataclass
class CaptureDecision:
    """``mode``: ``compile`` (capture), ``off`` (eager) or ``pending`` (``auto``: decided from the measured step time)."""

    mode: str
    reason: str

    def describe(self) -> str:
        """The outcome first, then why (the run's choices record it beside ``train.step_capture``'s value)."""
        outcome = {"compile": "captured", "off": "eager"}.get(self.mode, "decided after the first steps")
        return f"{outcome}: {self.reason}"


class CapturedStep:
    """``forward_loss(images, labels)`` compiled; batches of another shape than the first run it eagerly.

    ``__call__`` returns the loss (graph output: backward through it as usual). On CUDA each call marks a new
    iteration for the CUDA graph trees, so the previous step's outputs may be overwritten: the trainer keeps a
    copy of the loss (:meth:`detached`), never the graph's own output.
    """

    def __init__(self, forward_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device):
        from dmlkit.engine import lazy_dynamo

        lazy_dynamo.restore()  # the optimisers' own dynamo wrappers, before anything compiles
        self.eager = forward_loss
        self.cuda = device.type == "cuda"
        self.compiled = torch.compile(forward_loss, mode="reduce-overhead" if self.cuda else None, dynamic=False)
        self.shape: tuple | None = None
        self.eager_batches = 0  # batches whose shape differed from the captured one

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        shape = (tuple(images.shape), images.dtype, tuple(labels.shape))
        if self.shape is None:
            self.shape = shape
        elif shape != self.shape:
            self.eager_batches += 1
            return self.eager(images, labels)
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(images, labels)

    @staticmethod
    def detached(loss: torch.Tensor) -> torch.Tensor:
        """The loss as the loop keeps it: a copy, which a later replay does not overwrite."""
        return loss.detach().clone()


__all__ = ["CAPTURE_MODES", "CaptureDecision", "CapturedStep"]
