"""The trainer's rooms, one module each (``Trainer`` in ``engine/trainer.py`` is the loop that uses them).

* :mod:`.checkpointing` -- what a checkpoint holds, writing it, and continuing from one (resume),
* :mod:`.selection` -- validation, checkpoint selection (the significance rule) and the final test,
* :mod:`.schedule` -- the steps and validation interval while the run trains (the config keeps what was asked),
* :mod:`.step_timing` -- the steps the trainer timed (what the recipe's time budget plans from),
* :mod:`.step_capture` and :mod:`.step_checks` -- the captured step and the finite checks that stay on the device.

Checkpointing and selection are mixins of :class:`~dmlkit.engine.trainer.Trainer`:
it reads the attributes the trainer takes from its :class:`~dmlkit.engine.resolve.ResolvedRun` and builds
nothing.
"""
