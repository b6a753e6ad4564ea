"""The recipe: every choice read from the data or measured on the machine, made before the engine builds anything.

:func:`plan` turns a config as asked into a finished one with the reason for every value it chose
(:class:`~dmlkit.engine.planned.PlannedRun`); :func:`~dmlkit.engine.resolve.resolve_run` builds the run from it.
:func:`prepare_run` does both, the one line a caller needs; :class:`Trainer` is the engine's trainer that also
takes a config (planned and built first). The rules (``rules.py``) and the measured plans (``backbone_choice``,
``view_size``, ``pooling_choice``, ``learning_plan``, ``glyph_plan``) live here; the engine never imports them.
"""

from dmlkit.recipe.planner import plan
from dmlkit.recipe.run import Trainer, prepare_run

__all__ = ["Trainer", "plan", "prepare_run"]
