"""Launch-free training steps: the step's forward, loss and backward compiled and, on a card, replayed as CUDA graphs.

On a card a small model's step is host work: hundreds of kernel launches the card finishes faster than
Python queues them. ``train.step_capture=compile`` compiles the step's forward and objective with
``torch.compile`` (``mode="reduce-overhead"`` on CUDA: the compiled forward and its backward are
captured as CUDA graphs and replayed with one launch each; the default mode on the CPU, where there are
no graphs and the point is only to run the same path in tests). The optimiser stays eager: the fused
AdamW a card gets is a few launches, and its state, the schedule's learning rate and the device-side
finite check (:mod:`~dmlkit.engine.training.step_checks`) need no capture to stay off the host.

What cannot be captured trains eagerly, with the reason recorded in the run's choices
(``resolved.json``): several processes (the all-gather's autograd function), a method's hooks (they
read the batch's embeddings on the host), cross-batch memory (its queue is state rewritten every step),
a model already compiled by ``train.compile``. ``auto`` (the default) also leaves eager what a capture
would not speed up: the CPU, a miner (its index lists are sized by the data: the graph breaks there),
a finite check read on the host every step (no fused optimiser, or fp16's loss read), and runs too
short to pay the compilation: after the budget's calibration steps it compares the steps left times
the measured step time against :data:`COMPILE_SECONDS`. Shapes are fixed: dmlkit's samplers give every
batch the same size; a batch of another shape takes the eager path.

Checkpoints and resume are unchanged: the compiled function shares the model's and the objective's
parameters and buffers, so their ``state_dict`` is the eager run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

CAPTURE_MODES = ("auto", "off", "compile")

#: Seconds a card spends compiling and capturing a small model's step the first time (inductor + CUDA graphs):
#: an estimate, to be replaced by a measurement on a card (``scripts/gpu_check.sh``'s ``step-capture`` stage).
COMPILE_SECONDS = 45.0
#: The share of an eager step a capture removes on a launch-bound card (the host's launches; the kernels remain).
SAVED_FRACTION = 0.5
#: ``auto`` captures only when the steps left save this many times the compilation.
PAYBACK = 2.0
#: The most host time a capture could save per step (a large model's launches): a run planned for fewer than
#: ``PAYBACK * COMPILE_SECONDS / MAX_SAVED_PER_STEP`` steps stays eager without being timed.
MAX_SAVED_PER_STEP = 0.02


@dataclass
class CaptureDecision:
    """``mode``: ``compile`` (capture), ``off`` (eager) or ``pending`` (``auto``: decided from the measured step time)."""

    mode: str
    reason: str

    def describe(self) -> str:
        """The outcome first, then why (the run's choices record it beside ``train.step_capture``'s value)."""
        outcome = {"compile": "captured", "off": "eager"}.get(self.mode, "decided after the first steps")
        return f"{outcome}: {self.reason}"


def plan_step_capture(request: str, *, device: torch.device, distributed: bool, method: bool, memory: bool,
                      compiled_model: bool, miner: bool, host_checks: bool, planned_steps: int | None = None
                      ) -> CaptureDecision:
    """The decision before training: ``request`` (``train.step_capture``) against what the run trains with.

    ``host_checks``: the step's finite check is read on the host every step (no fused optimiser on the device, or
    the fp16 scaler's loss read). Only ``auto`` is turned down by the CPU, a miner, ``host_checks`` or
    ``planned_steps`` (the most steps the run may train) too few to pay :data:`COMPILE_SECONDS` back.
    """
    if request == "off":
        return CaptureDecision("off", "train.step_capture=off")
    blockers = [why for blocked, why in (
        (distributed, "several processes: the embeddings' all-gather is not captured"),
        (method, "the method's hooks read each batch's embeddings on the host"),
        (memory, "cross-batch memory rewrites its queue every step"),
        (compiled_model, "train.compile already compiles the model's forward"),
    ) if blocked]
    if request == "auto":
        blockers += [why for blocked, why in (
            (device.type != "cuda", f"{device.type}: no CUDA graphs, and kernel launches are not what a step costs"),
            (miner, "the miner's index lists are sized by the data (the graph would break there)"),
            (host_checks, "the finite check is read on the host every step (no fused optimiser, or fp16)"),
        ) if blocked]
        least = PAYBACK * COMPILE_SECONDS / MAX_SAVED_PER_STEP
        if not blockers and planned_steps is not None and planned_steps < least:
            blockers.append(f"{planned_steps} steps at most: a capture pays its about {COMPILE_SECONDS:.0f} s of "
                            f"compilation back from about {least:.0f} steps on")
    if blockers:
        return CaptureDecision("off", "; ".join(blockers))
    if request == "compile":
        graphs = "as CUDA graphs (reduce-overhead)" if device.type == "cuda" else "without graphs (not a card)"
        return CaptureDecision("compile", f"forward, loss and backward compiled {graphs}")
    return CaptureDecision("pending", "their measured time and the steps left against the compilation's cost")


def worth_capturing(steps_left: int, step_seconds: float, compile_seconds: float = COMPILE_SECONDS) -> CaptureDecision:
    """``auto``'s decision after the calibration steps: capture when the steps left save ``PAYBACK`` x its cost."""
    saved = steps_left * step_seconds * SAVED_FRACTION
    numbers = (f"{steps_left} steps left at {step_seconds * 1e3:.1f} ms would save about {saved:.0f} s against "
               f"about {compile_seconds:.0f} s of compilation")
    if saved > PAYBACK * compile_seconds:
        return CaptureDecision("compile", f"{numbers}: forward, loss and backward as CUDA graphs")
    return CaptureDecision("off", numbers)


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


__all__ = ["CAPTURE_MODES", "COMPILE_SECONDS", "CaptureDecision", "CapturedStep", "plan_step_capture",
           "worth_capturing"]
