"""``report.html`` written as the training loop's last callback (before trackers store it as an artifact)."""

from __future__ import annotations

import logging
from pathlib import Path

from dmlkit.core.messages import messages
from dmlkit.engine.callbacks import Callback
from dmlkit.report.run_report import write_report

log = logging.getLogger(__name__)


class WriteReport(Callback):
    """Writes ``RUN_DIR/report.html`` when training ends with test metrics; ``path`` is where it went.

    Put it before the trackers (``Trainer`` adds the config's loggers after the user's callbacks),
    so they find the report among the run's artifacts. Says ``report: PATH`` to this module's logger, or
    to ``echo`` when given.
    """

    def __init__(self, echo=None):
        self.echo = messages(echo, log)
        self.path: Path | None = None

    def on_fit_end(self, trainer, result) -> None:
        if not result.test_metrics:  # no test split: nothing to report on
            return
        self.path = write_report(trainer.run_dir.path)
        self.echo(f"report: {self.path}")
