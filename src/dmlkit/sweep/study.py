"""Run a resumable Optuna study whose objective is validation MAP@R of a training run.

Layout of a sweep directory::

    DIR/study.db           the Optuna study (SQLite); re-running the same command resumes it
    DIR/base_config.yaml   the resolved config every trial starts from
    DIR/trials/<number>/   one dmlkit run directory per trial
    DIR/sweep.json         best parameters and value, every trial (rewritten atomically after each trial)
    DIR/report.html        score against each parameter, best-trials table

Only one process may run a given sweep directory at a time: on start, trials the database still
shows as running are from a process that died; they are marked failed (``interrupted``) and their
parameters are queued again, continuing from the interrupted run's last checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import yaml

from dmlkit.config import RunConfig, config_from_dict, config_to_dict, field_paths, load_config
from dmlkit.core.extras import require
from dmlkit.core.json_files import read_json
from dmlkit.core.messages import messages
from dmlkit.engine.callbacks import Callback
from dmlkit.engine.checkpoint_files import atomic_write_json, atomic_write_text
from dmlkit.engine.run_layout import (
    CLAIM_FILE,
    LAST_CHECKPOINT,
    MESSAGES_FILE,
    SWEEP_BASE_CONFIG_FILE,
    SWEEP_STUDY_FILE,
    SWEEP_SUMMARY_FILE,
    TRIAL_FILE,
)
from dmlkit.engine.trainer import Trainer
from dmlkit.evaluation.metrics import SELECTION_METRIC
from dmlkit.exceptions import CheckpointError, ConfigError, DmlkitError
from dmlkit.sweep.space import ParamSpec, apply_params, check_space, check_validation_split, render_value

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "gp", "random")
STUDY_NAME = "dmlkit-sweep"
SWEEP_FORMAT = "dmlkit-sweep-1"
OBJECTIVE = SELECTION_METRIC
#: Config fields that may differ between invocations of the same sweep.
VOLATILE_FIELDS = (("train", "progress"),)


@dataclass(frozen=True)
class SweepResult:
    """What :func:`run_sweep` returns: where the sweep lives and its best trial so far."""

    sweep_dir: Path
    best_value: float | None
    best_params: dict[str, Any] | None
    trials_run: int
    trials_done: int


def _optuna():
    """Optuna, which ``dmlkit sweep`` needs (the ``sweep`` extra)."""
    return require("optuna", "sweep", "dmlkit sweep (hyperparameter search)")


def make_sampler(name: str, seed: int, startup_trials: int):
    """Optuna sampler ``tpe`` (TPESampler), ``gp`` (GPSampler) or ``random`` (RandomSampler), seeded."""
    optuna = _optuna()

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"--sampler must be one of {', '.join(SAMPLERS)}. Got {name!r}.")


def storage_url(sweep_dir: Path) -> str:
    """``sqlite:///<absolute DIR>/study.db``."""
    return f"sqlite:///{(sweep_dir / SWEEP_STUDY_FILE).resolve()}"


def _identity(base: dict, specs: Sequence[ParamSpec]) -> dict:
    base = json.loads(json.dumps(base))
    for section, key in VOLATILE_FIELDS:
        base.get(section, {}).pop(key, None)
    return {"base_config": base, "space": [s.text() for s in specs]}


def open_study(sweep_dir: Path, base: dict, specs: Sequence[ParamSpec], sampler, pruner):
    """Create the study in ``DIR/study.db`` or load it; refuse one made for another config or space."""
    optuna = _optuna()

    sweep_dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        storage=storage_url(sweep_dir), study_name=STUDY_NAME, direction="maximize",
        sampler=sampler, pruner=pruner, load_if_exists=True,
    )
    identity = _identity(base, specs)
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
        atomic_write_text(sweep_dir / SWEEP_BASE_CONFIG_FILE, yaml.safe_dump(base, sort_keys=False))
    elif stored != identity:
        what = "search space (--param)" if stored["space"] != identity["space"] else "base config (--preset/--config/--set)"
        raise ConfigError(
            f"{sweep_dir} holds a sweep with another {what}; rerun it with the same options to resume, "
            f"or choose another --out. Its space: {' '.join(stored['space'])}."
        )
    return study


def recover_interrupted(study) -> list[int]:
    """Mark trials left running by a dead process as failed and queue their parameters again."""
    TrialState = _optuna().trial.TrialState

    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    requeued = {t.user_attrs.get("resume_from") for t in trials}
    queued = []
    for t in trials:
        if t.state == TrialState.FAIL and t.user_attrs.get("interrupted") and t.number not in requeued:
            study.enqueue_trial(dict(t.params), user_attrs={"resume_from": t.number})
            queued.append(t.number)
    return queued


def trials_done(study) -> int:
    """Trials that count towards ``--trials``: complete, pruned, or failed for a reason other than an interruption."""
    TrialState = _optuna().trial.TrialState

    done = 0
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            done += 1
        elif t.state == TrialState.FAIL and not t.user_attrs.get("interrupted"):
            done += 1
    return done


class TrialReport(Callback):
    """A sweep trial's part in a run: each validation score reported to the Optuna trial, a pruned trial stopped,
    and ``DIR/trials/<number>/trial.json`` written at the end.

    The trial's trainer is made with ``evaluate_test=False``: the objective must not see test metrics, and
    skipping them halves the cost of a short trial. ``trial.json`` records the selected step, its validation
    MAP@R and the steps taken; ``checkpoints/best.pt`` holds the selected weights as in any run.
    """

    def __init__(self, trial, prune: bool):
        self.trial, self.prune, self.pruned = trial, prune, False

    def on_evaluation_end(self, trainer, step, metrics):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a step reported twice after a resume is ignored by Optuna
            self.trial.report(float(metrics[OBJECTIVE]), int(step))
        if self.prune and self.trial.should_prune():
            self.pruned = True
            trainer.should_stop = True

    def on_fit_end(self, trainer, result):
        record = {"selected_on": "val", "best_step": result.best_step, "steps": result.steps,
                  f"val_{OBJECTIVE}": trainer.best_score if math.isfinite(trainer.best_score) else None,
                  "train_seconds": round(trainer.elapsed, 3), "schedule": trainer.schedule.record(result.steps)}
        atomic_write_json(trainer.run_dir.path / TRIAL_FILE, record)


def trial_config(base: dict, params: dict[str, Any], number: int) -> RunConfig:
    """The validated config of one trial: ``base`` with the trial's parameters, progress bar off."""
    cfg = config_from_dict(apply_params(base, params))
    return dataclasses.replace(cfg, name=f"{cfg.name}-trial{number}",
                               train=dataclasses.replace(cfg.train, progress=False))


def make_objective(sweep_dir: Path, base: dict, specs: Sequence[ParamSpec], prune: bool, echo: Callable[[str], None]):
    """The Optuna objective: train one trial into ``DIR/trials/<number>``, return its best validation MAP@R."""
    optuna = _optuna()

    def objective(trial) -> float:
        params = {s.path: s.suggest(trial) for s in specs}
        run_dir = sweep_dir / "trials" / str(trial.number)
        trial.set_user_attr("run_dir", str(run_dir.relative_to(sweep_dir)))
        try:
            cfg = trial_config(base, params, trial.number)
            report = TrialReport(trial, prune)
            with _trial_run(cfg, run_dir, sweep_dir, trial, report, echo) as trainer:
                result = trainer.fit()
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            raise
        except DmlkitError as exc:
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
            echo(f"trial {trial.number}: failed: {exc}")
            raise
        score = float(trainer.best_score)
        trial.set_user_attr("best_step", int(result.best_step))
        trial.set_user_attr("steps", int(result.steps))
        if report.pruned:
            echo(f"trial {trial.number}: pruned at step {trainer.step} (val MAP@R {score:.4f})")
            raise optuna.TrialPruned()
        if not math.isfinite(score):
            trial.set_user_attr("error", "no finite validation score")
            raise ConfigError(f"trial {trial.number} produced no finite validation MAP@R ({score}).")
        return score

    return objective


@contextmanager
def _trial_run(cfg: RunConfig, run_dir: Path, sweep_dir: Path, trial, report: TrialReport, echo) -> Iterator[Trainer]:
    """A trial's trainer, started as every run is (:func:`~dmlkit.launch.launch`: the folder claimed, ``train.log``
    kept), with no test split and ``report`` among its callbacks: fresh, or continuing the interrupted trial this
    one replaces (its folder is moved here)."""
    from dmlkit.engine.checkpoint_files import load_checkpoint
    from dmlkit.launch import launch

    quiet = lambda text: None  # noqa: E731 - trial runs are summarised by the sweep
    source = trial.user_attrs.get("resume_from")
    if source is not None:
        old = sweep_dir / "trials" / str(source)
        if (old / LAST_CHECKPOINT).is_file() and not run_dir.exists():
            old.rename(run_dir)
    resumable = (run_dir / LAST_CHECKPOINT).is_file() and source is not None
    if not resumable and run_dir.exists():
        shutil.rmtree(run_dir)  # leftovers without a result in the database
    with launch(cfg, run_dir, resume=resumable, report=False, callbacks=[report], echo=quiet,
                evaluate_test=False) as trainer:
        if resumable:
            try:
                state = load_checkpoint(trainer.run_dir.last_checkpoint)
                if state.get("fingerprint") != trainer.fingerprint:
                    raise CheckpointError("it was written by another configuration")
                echo(f"trial {trial.number}: continuing interrupted trial {source} from step {int(state['step'])}")
            except CheckpointError as exc:
                echo(f"trial {trial.number}: cannot continue trial {source} ({exc}); training from scratch")
                trainer.resume = False
                _clear_run_files(run_dir)
        yield trainer


def _clear_run_files(run_dir: Path) -> None:
    """Remove what an earlier run wrote into ``run_dir``, keeping its claim and the messages being logged."""
    for entry in run_dir.iterdir():
        if entry.name in (CLAIM_FILE, MESSAGES_FILE):
            continue
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def run_sweep(
    base_cfg: RunConfig,
    specs: Sequence[ParamSpec],
    sweep_dir: str | Path,
    *,
    trials: int,
    sampler: str = "tpe",
    seed: int | None = None,
    startup_trials: int = 10,
    prune: bool = False,
    echo: Callable[[str], None] | None = None,
) -> SweepResult:
    """Search ``specs`` until ``trials`` trials are done in ``sweep_dir`` (resuming what is there).

    Every trial trains ``base_cfg`` with its parameters into ``DIR/trials/<number>`` and is scored by
    its best validation MAP@R (``Trainer.best_score``); test metrics are never used. The sampler is
    seeded by ``seed`` (default ``base_cfg.seed``) plus the number of trials already in the study,
    so a resumed sweep does not replay the first run's draws. ``prune=True`` stops trials whose
    intermediate validation scores fall below the median of earlier trials (Optuna MedianPruner).
    """
    optuna = _optuna()

    if sampler not in SAMPLERS:
        raise ConfigError(f"--sampler must be one of {', '.join(SAMPLERS)}. Got {sampler!r}.")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ConfigError(f"--trials must be an int >= 1. Got {trials!r}.")
    if not specs:
        raise ConfigError("A sweep needs at least one --param to search.")
    check_validation_split(base_cfg)
    base = config_to_dict(base_cfg)
    check_space(base, specs)
    sweep_dir, echo = Path(sweep_dir), messages(echo, log)
    seed = base_cfg.seed if seed is None else int(seed)
    old_level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            probe = open_study(sweep_dir, base, specs, None, None)
            offset = len(probe.get_trials(deepcopy=False))
            pruner = optuna.pruners.MedianPruner(n_startup_trials=max(1, min(5, startup_trials))) if prune \
                else optuna.pruners.NopPruner()
            study = open_study(sweep_dir, base, specs, make_sampler(sampler, seed + offset, startup_trials), pruner)
            requeued = recover_interrupted(study)
            for number in requeued:
                echo(f"trial {number} was interrupted; it will be continued")
            done = trials_done(study)
            remaining = max(0, trials - done)
            echo(f"sweep {sweep_dir}: {done} trial(s) done, running {remaining} more ({sampler} sampler)")

            def after_trial(study, trial) -> None:
                write_sweep_json(sweep_dir, study, sampler=sampler, trials_requested=trials)
                if trial.state.name == "COMPLETE":
                    best = study.best_trial
                    shown = " ".join(f"{k}={render_value(v)}" for k, v in trial.params.items())
                    echo(f"trial {trial.number}: val MAP@R {trial.value:.4f}  {shown}  "
                         f"(best {best.value:.4f}, trial {best.number})")

            if remaining:
                study.optimize(
                    make_objective(sweep_dir, base, specs, prune, echo), n_trials=remaining,
                    catch=(DmlkitError,), callbacks=[after_trial], gc_after_trial=True,
                )
            summary = write_sweep_json(sweep_dir, study, sampler=sampler, trials_requested=trials)
    finally:
        optuna.logging.set_verbosity(old_level)
    best = summary["best"]
    return SweepResult(
        sweep_dir, best["value"] if best else None, best["params"] if best else None, remaining, trials_done(study)
    )


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (str, int, bool)) or value is None else float(value)


def sweep_summary(sweep_dir: Path, study, *, sampler: str, trials_requested: int) -> dict:
    """Best trial and every trial of ``study`` as a JSON-ready dict (the content of sweep.json)."""
    TrialState = _optuna().trial.TrialState

    identity = study.user_attrs.get("identity", {})
    records = []
    for t in study.get_trials(deepcopy=False):
        duration = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        records.append({
            "number": t.number,
            "state": t.state.name,
            "value": None if t.value is None else float(t.value),
            "params": {k: _jsonable(v) for k, v in t.params.items()},
            "run_dir": t.user_attrs.get("run_dir"),
            "best_step": t.user_attrs.get("best_step"),
            "duration_seconds": duration,
            "intermediate": {str(k): float(v) for k, v in sorted(t.intermediate_values.items())},
            "error": t.user_attrs.get("error"),
            "interrupted": bool(t.user_attrs.get("interrupted", False)),
            "resumed_from": t.user_attrs.get("resume_from"),
        })
    complete = [r for r in records if r["state"] == TrialState.COMPLETE.name and r["value"] is not None]
    best = max(complete, key=lambda r: (r["value"], -r["number"])) if complete else None
    counts: dict[str, int] = {}
    for r in records:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    return {
        "format": SWEEP_FORMAT,
        "objective": f"validation {OBJECTIVE} (maximize)",
        "sampler": sampler,
        "space": identity.get("space", []),
        "trials_requested": trials_requested,
        "trials_done": trials_done(study),
        "counts": counts,
        "best": None if best is None else {
            "number": best["number"], "value": best["value"], "params": best["params"], "run_dir": best["run_dir"],
        },
        "trials": records,
    }


def write_sweep_json(sweep_dir: Path, study, *, sampler: str, trials_requested: int) -> dict:
    """Rewrite ``DIR/sweep.json`` atomically; returns its content."""
    summary = sweep_summary(sweep_dir, study, sampler=sampler, trials_requested=trials_requested)
    atomic_write_json(sweep_dir / SWEEP_SUMMARY_FILE, summary)
    return summary


def load_sweep(sweep_dir: str | Path) -> dict:
    """The content of ``DIR/sweep.json``; ConfigError when ``DIR`` is not a sweep directory."""
    path = Path(sweep_dir) / SWEEP_SUMMARY_FILE
    if not path.is_file():
        raise ConfigError(f"{str(sweep_dir)!r} is not a dmlkit sweep directory (no sweep.json).")
    data = read_json(path)
    if data.get("format") != SWEEP_FORMAT:
        raise ConfigError(f"{path} is not a dmlkit sweep summary (format {data.get('format')!r}).")
    return data


def config_overrides(cfg: RunConfig) -> list[str]:
    """``path=value`` overrides that rebuild ``cfg`` from the defaults (only fields that differ)."""
    values, defaults = config_to_dict(cfg), config_to_dict(RunConfig())
    out = []
    for path in field_paths():
        value, default = values, defaults
        for part in path.split("."):
            value, default = value[part], default[part]
        if value != default:
            out.append(f"{path}={render_value(value)}")
    return out


def best_trial_config(sweep_dir: str | Path) -> RunConfig:
    """The config of the sweep's best complete trial (base config plus its parameters)."""
    sweep_dir = Path(sweep_dir)
    summary = load_sweep(sweep_dir)
    if summary["best"] is None:
        raise ConfigError(f"The sweep in {sweep_dir} has no complete trial yet.")
    base = load_config(path=sweep_dir / SWEEP_BASE_CONFIG_FILE)
    return config_from_dict(apply_params(config_to_dict(base), summary["best"]["params"]))


def best_trial_overrides(sweep_dir: str | Path) -> list[str]:
    """``key=value`` overrides that turn the default config into the sweep's best trial (for ``train --from-sweep``)."""
    return config_overrides(best_trial_config(sweep_dir))


__all__ = [
    "SAMPLERS",
    "SweepResult",
    "best_trial_config",
    "best_trial_overrides",
    "config_overrides",
    "load_sweep",
    "make_sampler",
    "run_sweep",
    "storage_url",
    "sweep_summary",
]
