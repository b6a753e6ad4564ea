"""RUN/train.log takes every dmlkit message while the loggers' other handlers keep showing what they showed."""

from __future__ import annotations

import logging

from dmlkit.core.messages import LOGGER_NAME, Messages, messages
from dmlkit.engine.run_log import run_log


class Kept(logging.Handler):
    def __init__(self, level=logging.NOTSET):
        super().__init__(level)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def test_the_log_takes_debug_records_that_the_console_does_not_show(tmp_path):
    dmlkit, root = logging.getLogger(LOGGER_NAME), logging.getLogger()
    console, application = Kept(), Kept()
    dmlkit.addHandler(console)
    root.addHandler(application)
    level = dmlkit.level
    dmlkit.setLevel(logging.INFO)
    say = messages(None, logging.getLogger("dmlkit.engine.probe"))
    try:
        with run_log() as log:
            say("held before the folder exists")
            log.open(tmp_path / "train.log")
            say.detail("recipe:   sampler.m = 4  (a reason)")
            say.warning("a problem")
        assert dmlkit.level == logging.INFO and dmlkit.propagate and dmlkit.handlers == [console]  # as they were
    finally:
        dmlkit.removeHandler(console)
        root.removeHandler(application)
        dmlkit.setLevel(level)
    assert console.lines == application.lines == ["INFO held before the folder exists", "WARNING a problem"]
    written = (tmp_path / "train.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in written] == [
        "INFO dmlkit.engine.probe: held before the folder exists",
        "DEBUG dmlkit.engine.probe: recipe:   sampler.m = 4  (a reason)",
        "WARNING dmlkit.engine.probe: a problem",
    ]


def test_an_echo_callable_takes_every_message_as_before():
    lines: list[str] = []
    say = messages(lines.append, logging.getLogger("dmlkit.engine.probe"))
    say("key")
    say.detail("a\nb")
    say.warning("w")
    assert lines == ["key", "a\nb", "w"] and messages(say, logging.getLogger()) is say
    assert isinstance(say, Messages)
