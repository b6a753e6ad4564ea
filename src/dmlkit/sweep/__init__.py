"""Hyperparameter sweeps with Optuna: objective = validation MAP@R under the protocol, resumable in SQLite."""

from dmlkit.sweep.report import build_sweep_html, write_sweep_report
from dmlkit.sweep.space import ParamSpec, check_space, check_validation_split, parse_param
from dmlkit.sweep.study import (
    SAMPLERS,
    SweepResult,
    best_trial_config,
    best_trial_overrides,
    config_overrides,
    load_sweep,
    run_sweep,
)

__all__ = [
    "ParamSpec",
    "SAMPLERS",
    "SweepResult",
    "best_trial_config",
    "best_trial_overrides",
    "build_sweep_html",
    "check_space",
    "check_validation_split",
    "config_overrides",
    "load_sweep",
    "parse_param",
    "run_sweep",
    "write_sweep_report",
]
