"""Checkpointing and resume: what ``checkpoints/last.pt`` and ``best.pt`` hold, and continuing from one.

The format is ``dmlkit-checkpoint-1`` (weights_only-loadable); a checkpoint carries the config's
fingerprint (:func:`~dmlkit.engine.checkpoint_files.config_fingerprint`) and is refused by a run of
another configuration. Writes are atomic (:func:`~dmlkit.engine.checkpoint_files.save_checkpoint`).
"""

from __future__ import annotations

import copy

from dmlkit.config.schema import config_to_dict
from dmlkit.engine.batches import BatchPosition
from dmlkit.engine.checkpoint_files import load_checkpoint, save_checkpoint
from dmlkit.engine.rng_state import rng_state, set_rng_state
from dmlkit.exceptions import CheckpointError


class CheckpointingMixin:
    """The trainer's state as a checkpoint, and back (:class:`~dmlkit.engine.trainer.Trainer`)."""

    def _checkpoint_header(self) -> dict:
        """What every checkpoint file starts with: its format, the run's fingerprint and config, the step."""
        return {"format": "dmlkit-checkpoint-1", "fingerprint": self.fingerprint,
                "config": config_to_dict(self.cfg), "step": self.step}

    def state_dict(self) -> dict:
        """Everything needed to continue exactly (weights_only-loadable)."""
        return {
            **self._checkpoint_header(),
            "epoch": self.position.epoch,
            "batch_in_epoch": self.position.batch_in_epoch,
            "model": self.model.state_dict(),
            "objective": self.objective.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "best_score": self.best_score,
            "best_step": self.best_step,
            "evals_since_best": self.evals_since_best,
            "elapsed": self.elapsed,
            "hooks": self.hooks.state_dict(),
            "callbacks": self.callbacks.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else {},
            "pretrained_val_ap": self.pretrained_val_ap,
            "reference_val_ap": self.reference_val_ap,
            "planned": {**self.schedule.state_dict(),
                        "cache_views": self.cache_views, "cache_deferred": self.cache_deferred},
        }

    def load_state_dict(self, state: dict, source: str = "checkpoint") -> None:
        """Restore :meth:`state_dict`; refuses a checkpoint of another configuration."""
        if state.get("fingerprint") != self.fingerprint:
            raise CheckpointError(
                f"{source} was written by a different configuration (data, model, loss or optimiser differ); "
                "it cannot be resumed with this config."
            )
        try:
            self.model.load_state_dict(state["model"])
            self.objective.load_state_dict(state["objective"])
        except RuntimeError as exc:
            raise CheckpointError(f"{source} does not fit this model: {exc}") from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.position = BatchPosition(int(state["epoch"]), int(state["batch_in_epoch"]))
        self.best_score = float(state["best_score"])
        self.best_step = int(state["best_step"])
        self.evals_since_best = int(state["evals_since_best"])
        self.elapsed = float(state["elapsed"])
        self.hooks.load_state_dict(state["hooks"])
        self.callbacks.load_state_dict(state.get("callbacks", {}))
        if self.scaler is not None and state.get("scaler"):  # the loss scale and its growth counter
            self.scaler.load_state_dict(state["scaler"])
        self.pretrained_val_ap = state.get("pretrained_val_ap")
        self.reference_val_ap = state.get("reference_val_ap")
        planned = state.get("planned")
        if planned:  # a resumed run keeps the steps its time budget planned (in its schedule; the config stays)
            self.schedule.load_state_dict(planned)
            self.cache_views = planned.get("cache_views", self.cache_views)
            self.cache_deferred = planned.get("cache_deferred", self.cache_deferred)

    def weights_state(self) -> dict:
        """Model and objective weights only (the best checkpoint, export, evaluation)."""
        return {
            **self._checkpoint_header(),
            "model": copy.deepcopy(self.model.state_dict()),
            "objective": copy.deepcopy(self.objective.state_dict()),
        }

    def save(self) -> None:
        """Write ``checkpoints/last.pt`` atomically (then ``on_checkpoint``: TensorBoard flushes up to this step)."""
        save_checkpoint(self.run_dir.last_checkpoint, self.state_dict())
        self.callbacks.call("on_checkpoint", self, self.step)
    def restore_last(self) -> None:
        """Continue from ``checkpoints/last.pt``: load it, cut the log after its step, drop writes a crash cut short."""
        state = load_checkpoint(self.run_dir.last_checkpoint)
        self.load_state_dict(state, source=str(self.run_dir.last_checkpoint))
        if self.dist.is_main:
            self.run_dir.truncate_log_after(self.step)
        for stale in self.run_dir.last_checkpoint.parent.glob(".*.pt.*.tmp"):  # writes cut short by a crash
            stale.unlink(missing_ok=True)
        self.echo(f"resumed from step {self.step} ({self.run_dir.last_checkpoint})")
