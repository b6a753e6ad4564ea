"""The engine tests' own fixtures (``tiny_config`` is shared: ``tests/unit/conftest.py``)."""

import pytest


@pytest.fixture(scope="session")
def crash_in_step():
    """``crash_in_step(trainer, n)``: ``trainer.fit()`` raises KeyboardInterrupt as step ``n`` begins."""

    def arm(trainer, step: int) -> None:
        original = trainer.training_step

        def crashing(*args):
            if trainer.step == step - 1:
                raise KeyboardInterrupt
            return original(*args)

        trainer.training_step = crashing

    return arm
