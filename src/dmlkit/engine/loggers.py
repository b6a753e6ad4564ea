"""Experiment trackers as callbacks: TensorBoard, MLflow, Weights & Biases (optional extras).

Each logger is a :class:`~dmlkit.engine.callbacks.Callback`: the resolved config as parameters at
train start, every ``log.jsonl`` record as metrics at its step (``train/loss``, ``val/map_at_r``,
``test/map_at_r``: ``<split or kind>/<field>``, as :func:`scalars_of` names them), and at the end
``report.html``, ``metrics.json`` and the best checkpoint as artifacts (where the tracker stores
files). A tracker's run id is callback state, saved in checkpoints: a resumed run continues the
same tracker run. Chosen by name with ``train.loggers=[tensorboard, mlflow, wandb]``
(:func:`build_loggers`), or passed as objects to ``Trainer(..., callbacks=[...])`` / ``dmlkit.fit``.
"""

from __future__ import annotations

import netrc
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dmlkit.core.validation import require_module
from dmlkit.engine.callbacks import Callback
from dmlkit.engine.run_layout import CHECKPOINTS_DIR, CONFIG_FILE, METRICS_FILE, MLFLOW_DIR, REPORT_FILE, TENSORBOARD_DIR

if TYPE_CHECKING:
    from dmlkit.engine.trainer import Trainer, TrainResult


def scalars_of(record: dict) -> dict[str, float]:
    """The numeric fields of a ``log.jsonl`` record as ``{"<split or kind>/<field>": value}``."""
    prefix = record.get("split") or record.get("kind", "log")
    return {f"{prefix}/{key}": float(value) for key, value in record.items()
            if key not in ("kind", "split", "step") and not isinstance(value, bool) and isinstance(value, (int, float))}


def flat_params(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted ``{"loss.args.margin": "0.1"}`` strings (trackers' parameters)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name + "."))
        else:
            out[name] = str(value)
    return out


def run_artifacts(trainer: "Trainer") -> list[tuple[Path, str]]:
    """``(file, folder in the tracker)`` of a finished run: report, metrics, config, best checkpoint."""
    run = trainer.run_dir
    files = [(run.path / REPORT_FILE, ""), (run.path / METRICS_FILE, ""), (run.path / CONFIG_FILE, ""),
             (run.best_checkpoint, CHECKPOINTS_DIR)]
    return [(path, folder) for path, folder in files if path.exists()]


class TensorBoardLogger(Callback):
    """The scalars of ``log.jsonl`` as TensorBoard event files in ``RUN_DIR/tensorboard`` (``train.tensorboard``).

    Event files are append-only; after a resume TensorBoard is told to drop what an earlier session
    wrote from the first replayed step on (``purge_step``), as ``log.jsonl`` is truncated there.
    """

    def __init__(self, log_dir: str | Path | None = None):
        self.log_dir = log_dir
        self.writer = None
        require_tensorboard()  # a missing package fails when the logger is made, before anything heavy

    def on_train_start(self, trainer: "Trainer") -> None:
        log_dir = self.log_dir or trainer.run_dir.path / TENSORBOARD_DIR
        purge = trainer.step + 1 if trainer.step > 0 else None
        self.writer = require_tensorboard()(log_dir=str(log_dir), purge_step=purge)

    def on_log(self, trainer: "Trainer", record: dict) -> None:
        if self.writer is not None:
            step = int(record.get("step", 0))
            for tag, value in scalars_of(record).items():
                self.writer.add_scalar(tag, value, global_step=step)

    def on_checkpoint(self, trainer: "Trainer", step: int) -> None:
        if self.writer is not None:  # a resume replays only the steps after this checkpoint
            self.writer.flush()

    def on_fit_end(self, trainer: "Trainer", result: "TrainResult") -> None:
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def require_tensorboard():
    """``torch.utils.tensorboard.SummaryWriter``, or a ConfigError naming the package to install."""
    return require_module("torch.utils.tensorboard", "tensorboard", "train.tensorboard=true", "tensorboard").SummaryWriter


class MLflowLogger(Callback):
    """An MLflow run: config as parameters, records as metrics, report and best checkpoint as artifacts.

    ``tracking_uri=None`` writes MLflow's file store in ``RUN_DIR/mlruns`` (no server, no database:
    ``mlflow ui --backend-store-uri RUN_DIR/mlruns`` shows it). MLflow 3 keeps that store in
    maintenance and wants ``MLFLOW_ALLOW_FILE_STORE=true``, which this logger then sets for the
    process unless it is set already (a SQLite store costs about half a minute of schema
    migrations at first use). Otherwise the given URI (``sqlite:///...``, ``http://...``).
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str = "dmlkit", run_name: str | None = None):
        require_module("mlflow", "mlflow", "the mlflow logger", "mlflow")
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.run_id: str | None = None
        self.client = None

    def on_train_start(self, trainer: "Trainer") -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        from dmlkit.config.schema import config_to_dict

        if self.tracking_uri is None:  # MLflow 3 asks to be told that its file store is wanted
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.tracking_uri or local_store_uri(trainer.run_dir.path))
        if self.run_id is not None:  # a resumed run continues its MLflow run
            self.client.update_run(self.run_id, status="RUNNING")
            return
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(self.experiment)
        run = self.client.create_run(experiment_id, run_name=self.run_name or trainer.cfg.name or trainer.run_dir.path.name)
        self.run_id = run.info.run_id
        params = [Param(key, value[:6000]) for key, value in flat_params(config_to_dict(trainer.cfg)).items()]
        for start in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def on_log(self, trainer: "Trainer", record: dict) -> None:
        from mlflow.entities import Metric

        if self.client is None:
            return
        now, step = int(time.time() * 1000), int(record.get("step", 0))
        metrics = [Metric(key, value, now, step) for key, value in scalars_of(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def on_fit_end(self, trainer: "Trainer", result: "TrainResult") -> None:
        for path, folder in run_artifacts(trainer):
            self.client.log_artifact(self.run_id, str(path), folder or None)
        self.client.set_terminated(self.run_id, "FINISHED")
        self.client = None

    def close(self) -> None:
        """Training failed: mark the MLflow run so (a resume sets it running again)."""
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id, "FAILED")
            self.client = None

    def state_dict(self) -> dict:
        return {"run_id": self.run_id or ""}

    def load_state_dict(self, state: dict) -> None:
        self.run_id = state.get("run_id") or None


def local_store_uri(run_dir: Path) -> str:
    """The URI of the MLflow file store a run keeps in ``RUN_DIR/mlruns``."""
    return (Path(run_dir) / MLFLOW_DIR).resolve().as_uri()


def wandb_logged_in() -> bool:
    """Whether W&B has credentials (``WANDB_API_KEY`` or ``wandb login``'s netrc entry)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbLogger(Callback):
    """A Weights & Biases run in ``RUN_DIR/wandb``: offline unless logged in (or ``WANDB_MODE`` says otherwise).

    An offline run is uploaded later with ``wandb sync RUN_DIR/wandb/offline-run-*``.
    """

    def __init__(self, project: str = "dmlkit", mode: str | None = None, run_name: str | None = None):
        require_module("wandb", "wandb", "the wandb logger", "wandb")
        self.project, self.mode, self.run_name = project, mode, run_name
        self.run_id: str | None = None
        self.run = None

    def on_train_start(self, trainer: "Trainer") -> None:
        import wandb

        from dmlkit.config.schema import config_to_dict

        mode = self.mode or os.environ.get("WANDB_MODE") or ("online" if wandb_logged_in() else "offline")
        self.run = wandb.init(project=self.project, dir=str(trainer.run_dir.path), mode=mode, id=self.run_id,
                              resume="allow" if self.run_id else None, name=self.run_name or trainer.run_dir.path.name,
                              config=flat_params(config_to_dict(trainer.cfg)), settings=wandb.Settings(silent=True))
        self.run_id = self.run.id

    def on_log(self, trainer: "Trainer", record: dict) -> None:
        scalars = scalars_of(record)
        if self.run is not None and scalars:
            self.run.log(scalars, step=int(record.get("step", 0)))

    def on_fit_end(self, trainer: "Trainer", result: "TrainResult") -> None:
        import wandb

        artifact = wandb.Artifact(f"run-{self.run_id}", type="model")
        for path, folder in run_artifacts(trainer):
            artifact.add_file(str(path), name=f"{folder}/{path.name}" if folder else path.name)
        self.run.log_artifact(artifact)
        self.run.finish()
        self.run = None

    def close(self) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1)
            self.run = None

    def state_dict(self) -> dict:
        return {"run_id": self.run_id or ""}

    def load_state_dict(self, state: dict) -> None:
        self.run_id = state.get("run_id") or None


#: ``train.loggers`` names and their classes (the one table the config check and the docs read).
LOGGERS = {"tensorboard": TensorBoardLogger, "mlflow": MLflowLogger, "wandb": WandbLogger}


def build_loggers(cfg) -> list[Callback]:
    """The loggers ``train.loggers`` names (``train.tensorboard=true`` adds TensorBoard);
    ``train.tracking_uri`` goes to MLflow."""
    names = list(dict.fromkeys([*cfg.train.loggers, *(["tensorboard"] if cfg.train.tensorboard else [])]))
    loggers: list[Callback] = []
    for name in names:
        loggers.append(MLflowLogger(cfg.train.tracking_uri) if name == "mlflow" else LOGGERS[name]())
    return loggers
