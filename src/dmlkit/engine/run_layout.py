"""The run directory's layout: the one table of the names of a run's files.

The engine writes them (``run_dir.py``, ``training/selection.py``, ``trainer.py``); the report,
inference, sharing, cross-validation, sweeps and the CLI read them. Every name is relative to the
run directory (``run_dir / LAST_CHECKPOINT``). This module imports nothing of dmlkit, so any
package may read it.

Layout::

    RUN_DIR/config.yaml            resolved config
    RUN_DIR/resolved.json          what the recipe chose and why (ResolvedRun.summary), written once before training
    RUN_DIR/training.json          what the run did while training that was not resolved before it: the step-capture
                                   decision taken after timing, and every measurement the plans read (the time
                                   budget's included) with the request they answer (a replayable plan: --plan RUN)
    RUN_DIR/fit_request.json       what a dmlkit.fit call asked for (its config and objects): a later call resumes
                                   only the same request
    RUN_DIR/env.json               versions, git commit, seed, command line, device
    RUN_DIR/manifest.json          paths and labels per split (audit which data was used), unreadable files
                                   skipped, eval_input (how evaluation reads an image: inference does the same),
                                   pretrained_weights (tag, source, file and SHA-256 of the starting weights)
    RUN_DIR/log.jsonl              one JSON object per line: kind = train | eval | projection | data (files skipped)
    RUN_DIR/tensorboard/           the same scalars as TensorBoard event files (train.tensorboard=true)
    RUN_DIR/mlruns/, RUN_DIR/wandb/  experiment trackers' local stores (train.loggers=[mlflow, wandb])
    RUN_DIR/metrics.json           final test metrics (selected_on says which split chose the weights;
                                   schedule: the steps taken and the steps and interval the run ended with)
    RUN_DIR/embeddings/test.npz    test embeddings, labels, proxies, thumbnails (gallery.npz: a separate gallery)
    RUN_DIR/checkpoints/last.pt    full training state (resume)
    RUN_DIR/checkpoints/best.pt    selected weights
    RUN_DIR/report.html            the run's report
    RUN_DIR/evaluations/           one JSON file per `dmlkit evaluate`

A cross-validation folder holds ``crossval.json`` beside its runs; a sweep folder ``study.db``, ``base_config.yaml``,
``sweep.json`` and ``report.html`` beside its trials' runs (each with ``trial.json``).
"""

from __future__ import annotations

CONFIG_FILE = "config.yaml"
RESOLVED_FILE = "resolved.json"
TRAINING_RECORD_FILE = "training.json"
REQUEST_FILE = "fit_request.json"
ENV_FILE = "env.json"
MANIFEST_FILE = "manifest.json"
LOG_FILE = "log.jsonl"
MESSAGES_FILE = "train.log"  # every message of the run (engine/run_log.py); LOG_FILE is the metrics
METRICS_FILE = "metrics.json"
REPORT_FILE = "report.html"
CHECKPOINTS_DIR = "checkpoints"
EMBEDDINGS_DIR = "embeddings"
EVALUATIONS_DIR = "evaluations"
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlruns"

#: The file that marks a folder as claimed by one dmlkit command (``{"kind": "train" | "sweep" | "crossval"}``).
CLAIM_FILE = ".dmlkit-claim.json"
#: A cross-validation folder's summary (``dmlkit crossval``), beside its ``seed<s>/fold<f>`` runs.
CROSSVAL_SUMMARY_FILE = "crossval.json"
#: A sweep folder's Optuna study (``dmlkit sweep``).
SWEEP_STUDY_FILE = "study.db"
#: A sweep folder's base config (the config every trial's parameters are applied to) and its summary.
SWEEP_BASE_CONFIG_FILE = "base_config.yaml"
SWEEP_SUMMARY_FILE = "sweep.json"
#: A sweep trial's run folder: its validation score, selected step and schedule (``dmlkit sweep``).
TRIAL_FILE = "trial.json"


def checkpoint_file(name: str) -> str:
    """``checkpoints/<name>.pt`` (``name``: ``last`` or ``best``)."""
    return f"{CHECKPOINTS_DIR}/{name}.pt"


def embeddings_file(split: str) -> str:
    """``embeddings/<split>.npz`` (``split``: ``test``, or ``gallery`` for a separate gallery)."""
    return f"{EMBEDDINGS_DIR}/{split}.npz"


LAST_CHECKPOINT = checkpoint_file("last")
BEST_CHECKPOINT = checkpoint_file("best")
TEST_EMBEDDINGS_FILE = embeddings_file("test")
