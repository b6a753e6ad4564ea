"""The machine's measurements a run plans from, kept so that one command and seed give one run on one machine.

A run with a time budget reads the machine: the recipe times candidate backbones, frozen-stage counts and
a glyph model's step, counts the seconds spent before each plan, and the trainer fits its steps to the
speeds of its first steps. Read twice, a clock never says the same: the same command planned 737, 992
and 742 steps on three calls. So every number a plan reads goes through one :class:`Measurements`
object, in the order the run reads them (a tape):

* the first run of a request (its config as asked, before the recipe) on a machine measures, and keeps
  what it measured in ``<cache>/plans/<machine>/<request>.json`` (:class:`PlanStore`) unless the machine
  looked shared while it measured (:data:`SHARED_BELOW`: the process got less than that share of its threads'
  time, or other processes held more than the rest of the cores; repeated timings that disagree; or a load
  average above its cores). The costs are work, not wall time
  (:func:`dmlkit.engine.timing.timings`: CPU time per thread, or CUDA event time), so a shared machine plans as an
  idle one would; it only keeps no tape;
* a later run of the same request on the same machine (same CPU or GPU, threads, torch and dmlkit
  versions) replays the kept numbers instead of measuring: the same backbone, steps, members and
  validations, and no measuring time; if its own training steps run much slower or faster than the kept ones
  (:data:`SLOWER`: a busy or changed machine now, or a tape measured under load), it says so and plans from then on
  from what it measures;
* every run records its tape in ``resolved.json``; ``dmlkit train --plan RUN`` replays that tape
  anywhere, without the speed check (the same steps and choices, whatever the budget says).

``dmlkit train --replan`` measures again and replaces the kept numbers; ``DMLKIT_PLAN_STORE=off`` keeps
nothing and replays nothing (the test suite sets it).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import platform
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import torch

from dmlkit.core.paths import cache_folder
from dmlkit.engine import plan_records, timing
from dmlkit.engine.timing import usable_cpus
from dmlkit.recipe.kept_costs import KeptCosts, smaller_seconds

_log = logging.getLogger(__name__)

T = TypeVar("T")

#: The format of a kept plan file and of ``resolved.json``'s ``measurements``.
TAPE_FORMAT = "dmlkit-measurements-1"

#: Repeated timings of the same work further apart than this (upper over lower quartile, or the two fastest of
#: three or fewer) mean other work shared the machine: the measurements are not kept.
BUSY_SPREAD = 1.5

#: A replayed run whose measured training steps take this many times the kept step time, or this many times less,
#: stops replaying.
SLOWER = 1.3

#: A load share (the measuring passes' CPU time over their wall time x threads) below this means other work took
#: the cores while this process measured: the machine is shared (said, and nothing kept).
SHARED_BELOW = 0.8

#: ``train`` settings that change what a run shows, not what it plans: the same request with or without them.
OUTPUT_ONLY = ("progress", "loggers", "log_every", "checkpoint_every")

#: ``DMLKIT_PLAN_STORE``: ``off`` (keep and replay nothing) or a folder for the kept plans (default:
#: ``$DMLKIT_CACHE/plans``, ``$DMLKIT_CACHE`` defaulting to ``$XDG_CACHE_HOME/dmlkit`` or ``~/.cache/dmlkit``).
STORE_VARIABLE = "DMLKIT_PLAN_STORE"


def spread_of(timings: Sequence[float]) -> float:
    """How far repeated timings of one piece of work disagree: upper over lower quartile (for three or fewer, the
    second fastest over the fastest: one slow pass, a cold cache, is not a busy machine); 1.0 for fewer than two."""
    times = sorted(float(t) for t in timings)
    if len(times) < 2 or times[0] <= 0:
        return 1.0
    if len(times) <= 3:
        return times[1] / times[0]
    return times[(3 * len(times)) // 4] / max(times[len(times) // 4], 1e-12)


def load_problem() -> str | None:
    """Why the machine looks busy by its load average (above its usable cores), or None."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = usable_cpus()
    return f"load average {load:.1f} on {cores} core(s)" if load > cores else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    extensions = [name for name in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if name in flags]
    return f"{model} ({' '.join(extensions)})" if extensions else model


def machine_description(device: torch.device | str) -> dict[str, str]:
    """What makes one machine's measurements another's: its processor (or GPU), cores, threads, versions."""
    from dmlkit import __version__

    device = torch.device(device)
    described = {"cpu": _cpu_model(), "cores": str(usable_cpus()), "threads": str(torch.get_num_threads()),
                 "torch": torch.__version__, "dmlkit": __version__, "device": device.type}
    if device.type == "cuda":
        described["gpu"] = torch.cuda.get_device_name(device)
    return described


def _key(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


class PlanStore:
    """Kept measurements, one JSON file per (machine, request) under ``root`` (writes are atomic)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @classmethod
    def default(cls) -> PlanStore | None:
        """The store ``DMLKIT_PLAN_STORE`` names (None for ``off``), else ``<cache>/plans``."""
        root = cache_folder(STORE_VARIABLE, "plans")
        return None if root is None else cls(root)

    def path(self, machine: dict, request: dict) -> Path:
        return self.root / _key(machine) / f"{_key(request)}.json"

    def load(self, machine: dict, request: dict) -> list[dict] | None:
        """The kept tape of ``request`` on ``machine``, or None (none kept, or a file that does not read)."""
        return plan_records.kept_tape(self.path(machine, request), machine, request, TAPE_FORMAT)

    def keep(self, machine: dict, request: dict, tape: list[dict]) -> Path | None:
        """Write ``tape`` for ``request`` on ``machine``; the path, or None when the folder cannot be written
        (said, never fatal: the run itself is not at stake)."""
        from dmlkit.engine.checkpoint_files import atomic_write_json

        path = self.path(machine, request)
        record = {"format": TAPE_FORMAT, "machine": machine, "kept_at": _now(), "measurements": tape,
                  "seal": plan_records.seal(request, tape)}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, record)
        except OSError as err:
            _log.warning("could not keep this run's measurements in %s (%s); the next run measures again", path, err)
            return None
        return path


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Measurements:
    """The numbers a run plans from, measured or replayed in the order the run reads them.

    ``kept``: a tape to replay (``[{"name": ..., "value": ...}, ...]``), else everything is measured.
    ``check_speed``: a replay leaves off when the run's own steps are :data:`SLOWER` than the kept ones
    (off for ``--plan``, which replays whatever the clock says). ``source``: where the tape came from, said in
    the run's messages. :attr:`tape` is what this run read, replayed or measured (``resolved.json``).
    """

    def __init__(self, kept: list[dict] | None = None, *, source: str = "", check_speed: bool = True,
                 store: PlanStore | None = None, machine: dict | None = None, request: dict | None = None,
                 costs: KeptCosts | None = None):
        self._queue: dict[str, deque] = defaultdict(deque)
        for entry in kept or []:
            self._queue[str(entry["name"])].append(entry["value"])
        self.replaying = kept is not None
        self.replayed = 0
        self.source = source
        self.check_speed = check_speed
        self.store, self.machine, self.request = store, machine, request
        self.costs = costs  # this machine's least costs of the work timed live (kept_costs.py), or None
        self.request_key = _key(request) if request is not None else None  # whose seconds spent the costs keep
        self.tape: list[dict] = []
        self.busy: list[str] = []
        self.notes: list[str] = []
        self._load_checked = False
        self._load = [0.0, 0.0]  # CPU seconds, wall seconds x threads of the timed passes measured through this tape
        self._others = timing.OtherWork()  # cores other processes held while this run planned (from start())
        self._others_cores: float | None = None  # read once, when the plan is made
        self.progress: Callable[[str], None] | None = None  # told before each measurement taken live
        # Bounded in work (CPU seconds per thread of the run), not wall seconds: which measurements fit must not
        # follow the load, or the plan would (a loaded machine spends more wall time on the same measurements).
        self.allowance: float | None = None  # seconds of work the live measurements may take (None: no bound)
        self.measuring = 0.0  # seconds of work the live measurements took so far
        self.left_out: list[str] = []  # what the allowance left unmeasured, said with the plan
        self.unkept = "a run given objects" if store is None else ""  # why nothing is kept, when so

    # -- construction ---------------------------------------------------------------------------------------------

    @classmethod
    def live(cls) -> Measurements:
        """Measure everything, keep nothing (a run given objects, or no store)."""
        return cls()

    @classmethod
    def for_request(cls, request: dict, device: torch.device, *, replan: bool = False) -> Measurements:
        """Replay what this machine kept for ``request`` (the config as asked), else measure and keep it;
        ``replan``: measure again and replace what was kept."""
        store, machine = PlanStore.default(), machine_description(device)
        costs = KeptCosts.default(machine, _key(machine))
        train = {k: v for k, v in request.get("train", {}).items() if k not in OUTPUT_ONLY}
        request = {**request, "train": train}
        if store is None:
            return cls(request=request, costs=costs).forgo(f"{STORE_VARIABLE}=off")
        kept = None if replan else store.load(machine, request)
        source = f"kept on this machine ({store.path(machine, request)})" if kept is not None else ""
        return cls(kept, source=source, store=store, machine=machine, request=request, costs=costs)

    @classmethod
    def from_run(cls, path: str | Path) -> tuple[dict, Measurements]:
        """The request (config as asked) and a replay of the measurements of a run's ``resolved.json``
        (``path``: the file or its run folder), for ``dmlkit train --plan``."""
        request, tape, file = plan_records.replay_record(path, TAPE_FORMAT)  # checked whole, before any replay
        replay = cls(list(tape), source=f"replayed from {file}", check_speed=False)
        return request, replay.forgo("a replay of --plan keeps nothing")

    # -- reading numbers --------------------------------------------------------------------------------------------

    def _next(self, name: str) -> tuple[bool, Any]:
        if self.replaying:
            queue = self._queue.get(name)
            if queue:
                self.replayed += 1
                return True, queue.popleft()
            self.stop_replaying(f"the kept plan has no {name!r} (kept by a dry run, or another dmlkit)", quietly=True)
        return False, None

    def measure(self, name: str, measure: Callable[[], T], *, encode: Callable[[T], Any] = lambda v: v,
                decode: Callable[[Any], T] = lambda v: v, timings: Callable[[T], Sequence[Sequence[float]]] | None
                = None, announce: bool = True, lower: Callable[[T, T], T] | None = None,
                kept_as: str | None = None) -> T:
        """``measure()`` the first time; the kept value when replaying. ``encode``/``decode`` turn the value
        into JSON and back; ``timings(value)``: its repeated timings, whose spread tells a busy machine;
        ``announce``: tell :attr:`progress` before measuring (a reading of the clock is not announced);
        ``lower(fresh, kept)``: a cost measured live is read no higher than this machine's kept least cost of the
        same work (:mod:`dmlkit.recipe.kept_costs`), each number the smaller of the two; ``kept_as``: its name
        there, when the work is not the name alone (default ``name``)."""
        replayed, kept = self._next(name)
        if replayed:
            value = plan_records.decoded(decode, kept, name, self.source)
        else:
            if self.progress is not None and announce:  # a timing or an embedding: seconds to wait, said first
                self.progress(f"plan: measuring {name} ...")
            cpu, thread_wall = timing.LOAD.snapshot()
            value = self.counted(measure)
            self._load[0] += timing.LOAD.cpu - cpu
            self._load[1] += timing.LOAD.thread_wall - thread_wall
            if lower is not None and self.costs is not None:
                value = self.costs.lower(kept_as or name, value, lower, encode=encode, decode=decode)
        if not replayed and timings is not None:
            for repeated in timings(value):
                spread = spread_of(repeated)
                if spread > BUSY_SPREAD:
                    self.busy.append(f"{name}: repeated timings {spread:.2f}x apart")
        self.tape.append({"name": name, "value": kept if replayed else encode(value)})
        return value

    def counted(self, measure: Callable[[], T], device: Any = "cpu") -> T:
        """``measure()`` (a measurement kept elsewhere than the tape, e.g. the view size's embeddings) with its cost
        added to :attr:`measuring` as the tape's are: work on the CPU (CPU seconds per thread), so other processes
        do not spend the allowance sooner; wall time on a card."""
        on_cpu = str(device).split(":")[0] == "cpu"
        wall, cpu = time.perf_counter(), time.process_time()
        value = measure()
        self.measuring += (timing.work_seconds(time.process_time() - cpu) if on_cpu
                           else time.perf_counter() - wall)
        return value

    def allowance_spent(self) -> bool:
        """Whether the live measurements have taken the whole :attr:`allowance`."""
        return self.allowance is not None and self.measuring >= self.allowance

    def affords(self, what: str, seconds: float, *, share: float = 1.0) -> bool:
        """Whether what is left of ``share`` of :attr:`allowance` pays for measuring ``what`` in about ``seconds``
        of work; when it does not, ``what`` is noted in :attr:`left_out`. The answer is kept on the tape, so a replay
        takes the same measurements."""
        def fits() -> bool:
            if self.allowance is None:
                return True
            bound = share * self.allowance
            return self.measuring < bound and self.measuring + max(0.0, seconds) <= bound

        fits_now = bool(self.measure(f"the measuring allowance affords {what}", fits, announce=False))
        if not fits_now:
            self.left_out.append(f"{what} (about {seconds:.0f} s)")
        return fits_now

    def bounded(self) -> str | None:
        """One line when the allowance left measurements out: the allowance, what it took, and what was left out."""
        if self.allowance is None or not self.left_out:
            return None
        return (f"plan: measuring took {self.measuring:.0f} s of work of its {self.allowance:.0f}-s allowance; not measured, "
                "the recipe's rule instead: " + "; ".join(self.left_out))

    def seconds(self, name: str, live: float) -> float:
        """A number the run read itself (seconds spent so far): ``live`` when measuring, the kept one replayed."""
        return float(self.measure(name, lambda: float(live), announce=False))

    def spent(self, name: str, live: float) -> float:
        """Seconds of work this run spent before a plan (``live``: the wall time, or the process's CPU time when
        less), read no higher than the least this machine spent there on the same request (kept with its costs,
        :mod:`dmlkit.recipe.kept_costs`): beside other work the same reading and decoding cost more CPU time, and
        a plan at a threshold would follow it. Replayed like :meth:`seconds`."""
        if self.costs is None or self.request_key is None:
            return self.seconds(name, live)
        return float(self.measure(name, lambda: float(live), announce=False, lower=smaller_seconds,
                                  kept_as=f"{name} (request {self.request_key})"))

    def speeds(self, name: str, live: T, step_seconds: Callable[[T], float], encode: Callable[[T], Any],
               decode: Callable[[Any], T]) -> T:
        """The trainer's measured speeds: ``live`` when measuring; replayed, the kept ones unless this run's
        steps take :data:`SLOWER` times the kept ones (then the replay ends here, said)."""
        replayed, kept = self._next(name)
        if replayed:
            value = plan_records.decoded(decode, kept, name, self.source)
            now, then = step_seconds(live), step_seconds(value)
            if self.check_speed and then > 0 and now > SLOWER * then:
                self.stop_replaying(f"this run's steps take {now * 1000:.1f} ms, {now / then:.1f}x the kept "
                                    f"{then * 1000:.1f} ms (a busy or changed machine)")
            elif self.check_speed and now > 0 and then > SLOWER * now:  # the tape was measured under load
                self.stop_replaying(f"this run's steps take {now * 1000:.1f} ms, {then / now:.1f}x faster than the "
                                    f"kept {then * 1000:.1f} ms (kept from a loaded machine)", busy=False)
            else:
                self.tape.append({"name": name, "value": kept})
                return value
        if not self._load_checked:  # the trainer's speeds are measured while other work may share the machine
            self._load_checked = True
            problem = load_problem()
            if problem and problem not in self.busy:
                self.busy.append(problem)
        self.tape.append({"name": name, "value": encode(live)})
        return live

    def stop_replaying(self, why: str, *, quietly: bool = False, busy: bool | None = None) -> None:
        """Measure from here on (what was replayed so far stays), and say why (a warning unless ``quietly``).
        ``busy`` (default: not ``quietly``): what this run measures now is not kept either (a slower machine)."""
        if self.replaying:
            self.replaying = False
            note = f"plan replay ended after {self.replayed} kept number(s): {why}; planning from measurements now"
            self.notes.append(note)
            if (not quietly) if busy is None else busy:
                self.busy.append(why)
            _log.log(logging.INFO if quietly else logging.WARNING, note)

    @property
    def load_share(self) -> float | None:
        """The share of its threads' time this process got while it measured (None: nothing timed live)."""
        return timing.load_share(*self._load)

    @property
    def other_cores(self) -> float | None:
        """Cores other processes (at normal priority or above) kept busy from :meth:`start` to the first reading
        (the plan's end); None when nothing was measured live or the machine does not say."""
        if self._others_cores is None and self._others.busy is not None:
            self._others_cores = self._others.cores()
        return self._others_cores

    def shared(self) -> str | None:
        """One line when the machine was shared while measuring, else None; the first call marks the measurements
        busy (not kept). Shared: this process got less than :data:`SHARED_BELOW` of its timed threads' time, or
        other processes held more than ``1 - SHARED_BELOW`` of the usable cores (a one-thread probe beside one
        competitor on two cores gets a whole core: only the second reading sees that competitor)."""
        share, others, cores = self.load_share, self.other_cores, usable_cpus()
        starved = share is not None and share < SHARED_BELOW
        crowded = others is not None and others > (1.0 - SHARED_BELOW) * cores
        if not (starved or crowded):
            return None
        said = [f"other processes held {others:.1f} of the {cores} core(s)"] if crowded else []
        if share is not None:
            said.append(f"this process got {share:.0%} of its {timing.threads_used()} thread(s)' time (CPU share "
                        f"{share:.2f}{f' < {SHARED_BELOW}' if starved else ''})")
        why = "machine is shared while measuring: " + "; ".join(said)
        if why not in self.busy:
            self.busy.append(why)
        return (f"plan: {why}; the plan reads CPU-time costs, as on an idle machine; its measurements are not kept")

    def forgo(self, why: str) -> Measurements:
        """Keep nothing of this run (``why`` is said at the end); returns ``self``."""
        self.store, self.unkept = None, why
        return self

    # -- keeping ----------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Before the first measurement: a machine already loaded by other work is said busy."""
        if not self.replaying:
            self._others.start()
            self._load_checked = True
            problem = load_problem()
            if problem:
                self.busy.append(problem)

    def keep(self) -> str:
        """Keep this run's tape for its request (when it measured something, on a machine that was not busy);
        a line saying what happened (with the load share while measuring, when something was timed)."""
        self.shared()  # a shared machine keeps nothing
        share = self.load_share
        line, others = self._kept(), self.other_cores
        lowered = self.costs.said() if self.costs is not None else None
        seen = ([f"CPU share while measuring: {share:.2f}"] if share is not None else []) + (
            [f"other processes' cores: {others:.1f}"] if others is not None else []) + ([lowered] if lowered else [])
        return f"{line} ({'; '.join(seen)})" if seen else line

    def _kept(self) -> str:
        if self.replaying and not self.busy:
            return f"measurements: replayed ({self.replayed} number(s) {self.source})"
        if self.store is None or self.request is None or self.machine is None:
            return f"measurements: not kept ({self.unkept or 'no store'})"
        if not self.tape:
            return "measurements: none taken"
        if self.busy:
            return ("measurements: NOT kept, the machine looked busy while measuring (" + "; ".join(self.busy[:3])
                    + "); run again on an idle machine for a plan that is kept and replayed")
        path = self.store.keep(self.machine, self.request, self.tape)
        return f"measurements: kept in {path}; the same command plans the same run here" if path else \
            "measurements: not kept (the store could not be written)"

    def record(self) -> dict:
        """What ``resolved.json`` holds: the tape, where it came from, and whether the machine looked busy."""
        return {"format": TAPE_FORMAT, "source": self.source or "measured", "replayed": self.replayed,
                "busy": list(self.busy), "notes": list(self.notes), "tape": list(self.tape)}


__all__ = ["BUSY_SPREAD", "Measurements", "PlanStore", "SHARED_BELOW", "SLOWER", "STORE_VARIABLE", "TAPE_FORMAT",
           "load_problem", "machine_description", "spread_of", "usable_cpus"]
