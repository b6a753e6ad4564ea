"""The trainer's rooms, one module each (``Trainer`` in ``engine/trainer.py`` is the loop that uses them).

* :mod:`.checkpointing` -- what a checkpoint holds, writing it, and continuing from one (resume),
* :mod:`.selection` -- validation, checkpoint selection (the significance rule) and the final test,
* :mod:`.time_budget` -- the run fitted to ``train.time_budget`` and the feature cache it decides on.

Each is a mixin of :class:`~dmlkit.engine.trainer.Trainer`: it reads the attributes the trainer
takes from its :class:`~dmlkit.engine.resolve.ResolvedRun` and builds nothing.
"""
