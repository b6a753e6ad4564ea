"""OpenMP threads that sleep while they wait: a run beside other busy processes keeps its speed.

PyTorch computes on the CPU with OpenMP threads, and by default a thread that finished its share of a
parallel region spins waiting for the others. Beside another busy process one of the run's threads is often
descheduled, and every region then waits for it while its sibling burns the core the descheduled one needs
(docs/recipes.md, "The plan under load", has the figures, idle ones too).
``OMP_WAIT_POLICY=PASSIVE`` makes waiting threads sleep instead. OpenMP reads it once, when torch loads, so it
must be set before ``import torch``.

``dmlkit``'s command line sets it at start-up (a user's own setting stands); library users set the variable
themselves before importing torch (it changes the whole process, so the library never does it on import).
"""

from __future__ import annotations

import os
import sys

#: The environment variable OpenMP reads for how waiting threads behave.
WAIT_POLICY = "OMP_WAIT_POLICY"


def wait_passively() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process (and the processes it starts) unless the variable is set
    already; ``True`` when it takes effect here: torch not loaded yet (OpenMP reads it then)."""
    if WAIT_POLICY in os.environ:
        return False
    os.environ[WAIT_POLICY] = "PASSIVE"
    return "torch" not in sys.modules
