"""Launching a training run: the one sequence ``dmlkit train`` and :func:`dmlkit.fit` share.

:func:`launch` claims the run folder, adds the report callback, plans and resolves the run, builds its
:class:`~dmlkit.engine.trainer.Trainer` (releasing the claim when that fails, so the folder is as it
was), and keeps every message of the dmlkit loggers in ``RUN/train.log`` while the run trains
(:mod:`dmlkit.engine.run_log`; docs/cli/train.md). :func:`dry_run` plans and builds the same run without a folder.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from dmlkit.config.schema import RunConfig
from dmlkit.engine.callbacks import Callback
from dmlkit.engine.given import NOTHING_GIVEN, GivenObjects
from dmlkit.engine.resolve import ResolvedRun
from dmlkit.engine.run_dir import claim_directory
from dmlkit.engine.run_log import LOG_FILE, run_log
from dmlkit.engine.trainer import Trainer
from dmlkit.recipe.run import prepare


@contextmanager
def launch(cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, option: str = "--out", report: bool = True,
           callbacks: Iterable[Callback] = (), echo: Callable[[str], None] | None = None, started: float | None = None,
           evaluate_test: bool = True, given: GivenObjects = NOTHING_GIVEN, **options) -> Iterator[Trainer]:
    """The :class:`Trainer` of ``cfg`` in ``run_dir``, with ``RUN/train.log`` written while inside.

    ``run_dir`` is claimed for a training run (new, or this run being resumed: ``resume``; ``option``
    names the setting in errors: ``--out`` or ``out``); ``report`` puts the ``report.html`` callback
    before ``callbacks``; ``given`` (:class:`~dmlkit.engine.given.GivenObjects`) replaces the config's objects;
    ``options`` go to :func:`~dmlkit.recipe.run.prepare` (as to :func:`~dmlkit.recipe.prepare_run`): ``measurements``,
    ``replan``; ``started`` is when the run began (the time budget counts from it). ``echo`` takes every message
    instead of the loggers. ``evaluate_test=False``: the run ends after training and selection (a sweep's trial).
    """
    run_dir = Path(run_dir)
    first: list[Callback] = []
    if report:  # before the config's trackers, which store the report as an artifact
        from dmlkit.report import WriteReport

        first.append(WriteReport(echo))
    with run_log() as log:
        claim = claim_directory(run_dir, "train", resume=resume, option=option)
        try:
            resolved = prepare(cfg, given, echo=echo, started=started, **options)
            trainer = Trainer(resolved, run_dir, resume=resume, echo=echo, callbacks=[*first, *callbacks],
                              evaluate_test=evaluate_test)
        except BaseException:
            claim.release()  # nothing was written: the folder is as it was
            raise
        if trainer.dist.is_main:
            log.open(run_dir / LOG_FILE)
        yield trainer


def dry_run(cfg: RunConfig, *, echo: Callable[[str], None] | None = None, **options) -> ResolvedRun:
    """The run ``cfg`` would train, planned and built, without a run folder or a step (``dmlkit train --dry-run``);
    ``options`` go to :func:`~dmlkit.recipe.run.prepare` (``measurements``, ``replan``)."""
    return prepare(cfg, echo=echo, **options)


__all__ = ["dry_run", "launch"]
