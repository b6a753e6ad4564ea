"""The trainer's rooms, one module each (``Trainer`` in ``engine/trainer.py`` is the loop that uses them).

* :mod:`.checkpointing` -- what a checkpoint holds, writing it, and continuing from one (resume),
* :mod:`.selection` -- validation, checkpoint selection (the significance rule) and the final test,
* :mod:`.schedule` -- the steps and validation interval while the run trains (the config keeps what was asked),
* :mod:`.time_budget` -- the schedule fitted to ``train.time_budget`` and the feature cache it decides on.

Each but the schedule (an object the trainer owns) is a mixin of :class:`~dmlkit.engine.trainer.Trainer`:
it reads the attributes the trainer takes from its :class:`~dmlkit.engine.resolve.ResolvedRun` and builds
nothing.
"""
