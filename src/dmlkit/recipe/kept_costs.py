"""The least work each timed piece of a plan has cost on this machine, kept across runs.

A plan's costs are the process's CPU time of the work (:func:`dmlkit.engine.timing.timings`), which other
processes should not change. On a virtual machine they do: beside one competing process the same one-thread
probe cost 10-50 % more CPU time, and idle it moved by up to 2x from one stretch of tens of seconds to the next
(docs/recipes.md), so a plan made from fresh timings alone flipped at its thresholds (frozen stages, cached
views) with the load. Interference only ever adds time to a piece of work, never removes it, so the least cost
a machine has shown for a workload is its idle cost; every fresh timing is compared with it:

* each cost a plan times is looked up by its measurement's name (the workload: model, sizes, batch, precision,
  device) in ``<cache>/costs/<machine>.json`` (:class:`KeptCosts`, the machine as the kept plans name it:
  processor, cores, threads, torch and dmlkit versions);
* the plan reads, for each number, the smaller of the fresh timing and the kept one (``lower(fresh, kept)``, given
  by the measurement: its fields matched, a cost the smaller of the two), and the file keeps that;
* so once this machine has timed a workload idle, every later plan of it reads the idle cost, whatever else runs.

A machine that has only been timed under load plans from loaded costs until it runs idle once; the plan's
line says how many of its costs the kept ones lowered. ``DMLKIT_COST_STORE=off`` keeps and reads nothing (the
test suite sets it); a folder there keeps them there instead of ``<cache>/costs``.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Any, Callable

from dmlkit.core.json_files import read_json
from dmlkit.core.paths import cache_folder
from dmlkit.core.validation import short_repr
from dmlkit.engine.plan_records import value_problem
from dmlkit.exceptions import RecordError

_log = logging.getLogger(__name__)

#: The format of a kept-costs file.
COSTS_FORMAT = "dmlkit-kept-costs-1"

#: ``DMLKIT_COST_STORE``: ``off`` (keep and read nothing) or a folder (default ``<cache>/costs``).
COST_STORE_VARIABLE = "DMLKIT_COST_STORE"


class KeptCosts:
    """One machine's least costs, by measurement name, in one JSON file (``path``); writes are atomic.

    :meth:`lower` combines a fresh measurement with the kept one; a file that does not read is said once and
    replaced by what this run measures (nothing else is at stake: only costs are kept here).
    """

    def __init__(self, path: str | Path, machine: dict):
        self.path = Path(path)
        self.machine = dict(machine)
        self._costs: dict[str, Any] | None = None
        self.lowered: list[str] = []  # the measurements this run read lower than it timed them

    @classmethod
    def default(cls, machine: dict, key: str) -> KeptCosts | None:
        """The costs of ``machine`` (its file named ``key``) in the folder ``DMLKIT_COST_STORE`` names, else
        ``<cache>/costs``; None for ``off``."""
        root = cache_folder(COST_STORE_VARIABLE, "costs")
        return None if root is None else cls(root / f"{key}.json", machine)

    def _read(self) -> dict[str, Any]:
        if self._costs is None:
            self._costs = {}
            if self.path.exists():
                try:
                    record = read_json(self.path)
                    if not (isinstance(record, dict) and record.get("format") == COSTS_FORMAT
                            and isinstance(record.get("costs"), dict)):
                        raise RecordError(f"not a {COSTS_FORMAT} file")
                    for name, value in record["costs"].items():  # numbers a plan could divide by, or none
                        problem = value_problem(value)
                        if problem is not None:
                            raise RecordError(f"{short_repr(name)}: {problem}")
                    self._costs = dict(record["costs"])
                except (OSError, RecordError, ValueError) as err:
                    _log.warning("kept costs %s do not read (%s); this run's costs replace them", self.path, err)
        return self._costs

    def lower(self, name: str, fresh: Any, lower: Callable[[Any, Any], Any], *, encode: Callable[[Any], Any],
              decode: Callable[[Any], Any]) -> Any:
        """``fresh`` (a measurement named ``name``) with each cost the smaller of it and the kept one
        (``lower(fresh, kept)``); the result is kept. A kept value that does not decode or match (``lower`` raises
        TypeError, ValueError or KeyError) is replaced by ``fresh``."""
        costs = self._read()
        kept = costs.get(name)
        value = fresh
        if kept is not None:
            try:
                value = lower(fresh, decode(kept))
            except (TypeError, ValueError, KeyError):
                value = fresh
        encoded = encode(value)
        if encoded != encode(fresh):
            self.lowered.append(name)
        if encoded != kept:
            costs[name] = encoded
            self._write()
        return value

    def _write(self) -> None:
        from dmlkit.engine.checkpoint_files import atomic_write_json

        record = {"format": COSTS_FORMAT, "machine": self.machine, "costs": self._costs,
                  "kept_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, record)
        except OSError as err:  # the run itself is not at stake: said, never fatal
            _log.warning("could not keep this machine's costs in %s (%s)", self.path, err)

    def said(self) -> str | None:
        """One phrase for the plan's line when kept costs lowered some of this run's timings, else None."""
        if not self.lowered:
            return None
        return (f"{len(self.lowered)} cost(s) read at this machine's least kept timing of the same work "
                f"({self.path})")


def smaller_seconds(fresh: float, kept: float) -> float:
    """The smaller of two timings of one piece of work (a plain number of seconds)."""
    return min(float(fresh), float(kept))


__all__ = ["COSTS_FORMAT", "COST_STORE_VARIABLE", "KeptCosts", "smaller_seconds"]
