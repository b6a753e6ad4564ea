"""PML's collected statistics: objects built with ``collect_stats`` record a few numbers per call.

As in pytorch-metric-learning, the statistics exist as attributes only when ``collect_stats`` is
on; its default follows PML's global switch (``common_functions.COLLECT_STATS``) when PML is
loaded, so PML code that turns statistics on gets them from dmlkit's objects too.
"""

from __future__ import annotations

import sys


def pml_collect_stats() -> bool:
    """PML's global ``COLLECT_STATS`` if PML is imported, else False."""
    module = sys.modules.get("pytorch_metric_learning.utils.common_functions")
    return bool(getattr(module, "COLLECT_STATS", False))


def init_stats(owner: object, collect_stats: bool | None, names: tuple[str, ...]) -> None:
    """Set ``owner.collect_stats`` and, when on, each statistic in ``names`` to 0."""
    owner.collect_stats = pml_collect_stats() if collect_stats is None else bool(collect_stats)
    if owner.collect_stats:
        for name in names:
            setattr(owner, name, 0)
