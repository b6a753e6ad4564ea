"""``RUN/train.log``: every message of the dmlkit loggers while a run trains, whatever the console shows.

The recipe's choices with their reasons are DEBUG records (``dmlkit train -v`` shows them); the
log keeps them in every mode. ``log.jsonl`` stays the metrics log, ``resolved.json`` the choices.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from dmlkit.core.messages import LOGGER_NAME
from dmlkit.engine.checkpoint_files import open_for_append
from dmlkit.engine.run_layout import MESSAGES_FILE

#: The run's messages, beside ``log.jsonl`` (the metrics) in the run directory.
LOG_FILE = MESSAGES_FILE


class RunLog(logging.Handler):
    """Every record of the dmlkit loggers, held in memory until :meth:`open` names the file, then appended there.

    Held first because the run folder is written only once the run is built: a run refused while
    resolving leaves no file behind.
    """

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.held: list[logging.LogRecord] = []
        self.file: logging.StreamHandler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is None:
            self.held.append(record)
        else:
            self.file.handle(record)

    def open(self, path: str | Path) -> None:
        """Write the held records to ``path`` (appended: a resumed run continues its log), then each as it comes.

        Never through a symbolic link, into a folder or into another file's hard link: a
        :class:`~dmlkit.exceptions.RecordError` names the file instead (:func:`open_for_append`).
        """
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.file = logging.StreamHandler(open_for_append(path))
        self.file.setFormatter(self.formatter)
        for record in self.held:
            self.file.handle(record)
        self.held.clear()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file.stream.close()  # a StreamHandler leaves its stream open
        super().close()


class _Forward(logging.Handler):
    """Hands the records of ``level`` and up to ``logger`` (the parent), as propagation would."""

    def __init__(self, logger: logging.Logger, level: int):
        super().__init__(level)
        self.logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        self.logger.handle(record)


@contextmanager
def run_log() -> Iterator[RunLog]:
    """A :class:`RunLog` on the ``dmlkit`` logger while inside; every other handler sees what it saw before.

    The log takes DEBUG records; where the logger showed less (its effective level above DEBUG), it
    is lowered to DEBUG for the run while its own handlers are filtered to the old level and records
    reach the parent loggers only from that level, so consoles and an application's handlers show
    exactly what they did.
    """
    logger, log = logging.getLogger(LOGGER_NAME), RunLog()
    shown, level, propagate = logger.getEffectiveLevel(), logger.level, logger.propagate
    filtered, forward = [], None
    if shown > logging.DEBUG:
        filtered = [h for h in logger.handlers]
        for handler in filtered:
            handler.addFilter(_from(shown))
        if propagate and logger.parent is not None:
            forward = _Forward(logger.parent, shown)
            logger.addHandler(forward)
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
    logger.addHandler(log)
    try:
        yield log
    finally:
        logger.removeHandler(log)
        log.close()
        if forward is not None:
            logger.removeHandler(forward)
        for handler in filtered:
            handler.filters = [f for f in handler.filters if not getattr(f, "_run_log", False)]
        logger.setLevel(level)
        logger.propagate = propagate


def _from(level: int) -> Callable[[logging.LogRecord], bool]:
    def keep(record: logging.LogRecord) -> bool:
        return record.levelno >= level

    keep._run_log = True  # type: ignore[attr-defined] - marks the filter run_log removes
    return keep


__all__ = ["LOG_FILE", "RunLog", "run_log"]
