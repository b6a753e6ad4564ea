"""The finite checks of training steps, kept on the device and read with the log record.

A step's loss and gradient norm decide whether its update is applied; reading them on the host every
step would make the host wait for the card every step. PyTorch's fused optimisers (Adam, AdamW, SGD
with ``fused=True``, what :func:`dmlkit.engine.optim.build_optimizer` picks on CUDA and the CPU) take
a ``found_inf`` tensor and skip the update on the device when it is non-zero, the mechanism
``torch.amp.GradScaler`` uses; the trainer relies on it on an accelerator only
(:func:`checks_stay_on_device`). :class:`DeviceStepChecks` builds that flag from the loss and the
gradient norm and counts what it skipped; the trainer reads the counts (one host synchronisation)
only where it needs them: the log record, before a validation, a checkpoint or the end of training.

``train.on_nonfinite``:

* ``skip``: a non-finite step's update is skipped on the device (weights and optimiser state
  untouched, the schedule advances as for any step); the read reports how many were skipped;
* ``stop``: from the first non-finite step on every update is skipped, so the weights stay those
  before it; the read raises :class:`~dmlkit.exceptions.NonFiniteError` naming that step.
"""

from __future__ import annotations

import torch

from dmlkit.core import validation as _validation


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` honours a ``found_inf`` attribute (PyTorch's fused optimisers)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def checks_stay_on_device(optimizer: torch.optim.Optimizer, device: torch.device) -> bool:
    """Whether a step's finite checks are queued on ``device`` (:class:`DeviceStepChecks`): the optimiser skips
    updates there, and a read on the host would wait for the device. On the CPU (fused AdamW too) a read is free, so
    the trainer reads loss and gradient norm each step and a non-finite step is reported the moment it happens."""
    return skips_on_device(optimizer) and not _validation.reads_on_host(torch.empty(0, device=device))


class DeviceStepChecks:
    """Per-step finite checks queued on ``device``; ``read()`` brings the pending counts to the host.

    ``stop=True`` (``train.on_nonfinite=stop``): the skip flag latches at the first non-finite step.
    """

    def __init__(self, device: torch.device, *, stop: bool):
        self.stop = stop
        self.latched = torch.zeros((), dtype=torch.float32, device=device)  # stop: 1.0 from the first bad step on
        self.skipped = torch.zeros((), dtype=torch.float32, device=device)  # steps skipped since the last read
        self.queued = 0  # steps queued since the last read (host count)

    def queue(self, loss: torch.Tensor, gradient_norm: torch.Tensor) -> torch.Tensor:
        """The step's ``found_inf``: 1.0 to skip its update, 0.0 to apply it (float32, on the device).

        ``loss + norm`` is finite exactly when both are; ``x - x`` is 0 for a finite ``x`` and NaN
        otherwise, so the flag costs three operators and no comparison kernel.
        """
        total = loss.detach().float() + gradient_norm
        flag = torch.sub(total, total).nan_to_num_(nan=1.0)
        if self.stop:
            flag = torch.maximum(self.latched, flag, out=self.latched)
        self.skipped.add_(flag)
        self.queued += 1
        return flag

    def read(self, loss: torch.Tensor) -> tuple[float, int]:
        """``loss``'s value and the steps skipped since the last read, in one host synchronisation."""
        if not self.queued:
            return float(loss), 0
        value, skipped = torch.stack([loss.detach().float(), self.skipped]).tolist()
        self.skipped.zero_()
        self.queued = 0
        return value, round(skipped)
