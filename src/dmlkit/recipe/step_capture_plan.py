"""Whether a run's training step is captured (``train.step_capture``): decided before training
(:func:`plan_step_capture`), and for ``auto`` on a card after the first steps were timed (:class:`StepCaptureChoice`,
a callback the recipe attaches).

The capture itself (the compiled step, replayed as CUDA graphs) is the engine's
(:mod:`dmlkit.engine.training.step_capture`). What cannot be captured trains eagerly: several processes (the
all-gather's autograd function), a method's hooks (they read the batch's embeddings on the host), cross-batch memory
(its queue is state rewritten every step), a model already compiled by ``train.compile``. ``auto`` (the default) also
leaves eager what a capture would not speed up: the CPU, a miner (its index lists are sized by the data: the graph
breaks there), a finite check read on the host every step (no fused optimiser, or fp16's loss read), and runs too
short to pay the compilation: after the first timed steps it compares the steps left times the measured step time
against :data:`COMPILE_SECONDS`.
"""

from __future__ import annotations

import torch

from dmlkit.engine.callbacks import Callback
from dmlkit.engine.resolve import ResolvedRun
from dmlkit.engine.training.step_capture import CaptureDecision
from dmlkit.engine.training.step_checks import checks_stay_on_device
from dmlkit.methods.hooks import MethodHooks

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


def resolved_step_capture(resolved: ResolvedRun) -> CaptureDecision:
    """``train.step_capture`` resolved from what the run's step holds (:func:`plan_step_capture`)."""
    cfg, device, objective = resolved.cfg, resolved.device, resolved.objective
    return plan_step_capture(
        cfg.train.step_capture, device=device, distributed=resolved.dist.enabled,
        method=resolved.method is not MethodHooks, memory=getattr(objective, "memory", None) is not None,
        compiled_model=cfg.train.compile, miner=getattr(objective, "miner", None) is not None,
        host_checks=resolved.scaler is not None or not checks_stay_on_device(resolved.optimizer, device),
        planned_steps=cfg.train.max_steps)


class StepCaptureChoice(Callback):
    """``train.step_capture=auto``: once the first steps were timed, capture when the steps left at the measured
    speed pay the compilation back (:func:`worth_capturing`); the steps are then timed again."""

    def __init__(self):
        self.resumed_with_plan = False

    def on_train_start(self, trainer) -> None:
        # a resumed run whose schedule was already planned times no first steps for a plan: it stays as resolved
        self.resumed_with_plan = trainer.schedule.plan is not None

    def on_steps_timed(self, trainer, step: int, step_seconds: float | None) -> None:
        if self.resumed_with_plan or trainer.step_capture.mode != "pending" or step_seconds is None:
            return
        if not trainer.timing.calibrated(trainer.step):  # a feature cache was just built: its steps are timed first
            return
        trainer.capture_from_here(worth_capturing(trainer.cfg.train.max_steps - trainer.step, step_seconds))
        trainer.echo(f"step capture: {trainer.step_capture.describe()}")
        if trainer.dist.is_main:  # the decision is recorded beside the resolved choices, which stay as resolved
            trainer.write_training_record()
        if trainer.captured_step is not None:
            trainer.time_steps_again()  # the captured steps run faster: time them again and re-plan


__all__ = ["COMPILE_SECONDS", "MAX_SAVED_PER_STEP", "PAYBACK", "SAVED_FRACTION", "StepCaptureChoice",
           "plan_step_capture", "resolved_step_capture", "worth_capturing"]
