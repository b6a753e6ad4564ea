"""Where a run's messages go: the ``dmlkit`` loggers at each message's level, or one callable given instead.

Library code never prints. A message is said through :class:`Messages`: by default to a
``logging.getLogger(__name__)`` logger under ``dmlkit`` (the key lines at INFO, each recipe
choice with its reason at DEBUG, problems at WARNING), so an application decides what it shows
(``dmlkit train`` shows INFO, ``-v`` DEBUG, ``--quiet`` WARNING; docs/python-api.md). An ``echo``
callable passed instead (``echo=print``, ``echo=lines.append``) takes every message, whatever
its level, as it did before the loggers.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable, Iterator

#: The parent of every dmlkit logger (``dmlkit.engine.resolve``, ``dmlkit.engine.trainer``...).
LOGGER_NAME = "dmlkit"


class Messages:
    """Say a message at its level: ``say(text)`` (INFO: the run's key lines), ``say.detail(text)`` (DEBUG: a
    recipe choice and its reason), ``say.warning(text)``; to ``logger``, or all of them to ``echo`` when given."""

    def __init__(self, logger: logging.Logger, echo: Callable[[str], object] | None = None):
        self.logger, self.echo = logger, echo

    def log(self, level: int, message: str) -> None:
        if self.echo is not None:
            self.echo(message)
        else:  # a record a line: each stamped in a log file
            for line in message.splitlines():
                self.logger.log(level, line)

    def __call__(self, message: str) -> None:
        self.log(logging.INFO, message)

    def detail(self, message: str) -> None:
        self.log(logging.DEBUG, message)

    def warning(self, message: str) -> None:
        self.log(logging.WARNING, message)


def messages(echo: Callable[[str], object] | Messages | None, logger: logging.Logger) -> Messages:
    """``echo`` as :class:`Messages`: itself when it is one, else ``logger``'s levels (``None``) or the callable."""
    return echo if isinstance(echo, Messages) else Messages(logger, echo)


#: Says nothing (a process other than rank 0, a sweep's trials).
SILENT = Messages(logging.getLogger(LOGGER_NAME), lambda _message: None)


class Console(logging.StreamHandler):
    """Messages on stderr, written between a progress bar's redraws (``tqdm.write``), so the bar stays whole."""

    def __init__(self, level: int):
        super().__init__()  # sys.stderr as it is now (a test's capture too)
        self.setLevel(level)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging's contract: a failing handler reports, never raises
            self.handleError(record)


@contextmanager
def console(level: int) -> Iterator[None]:
    """Show the dmlkit loggers' messages from ``level`` up on stderr while inside (``dmlkit``'s commands; ``fit``
    where the application configured no logging), then leave the loggers as they were."""
    logger = logging.getLogger(LOGGER_NAME)
    handler, saved = Console(level), logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
