"""Timing work: its cost (what the load does not change) and the wall time it took.

Two kinds of seconds are read here:

* **work** (:func:`timings`, what plans are made from): on the CPU the process's CPU time of the work run on
  one thread, divided by the threads the run computes with (:func:`threads_used`): the wall time the same work
  takes with those threads on idle cores (a little less: the plan errs towards more steps, and the trainer's
  live budget cuts them). Other processes do not lengthen it: they take wall time from this one, not CPU
  time. One thread, because on several threads a loaded machine inflates CPU time too: a thread that finished
  its share spins waiting for one that was descheduled (beside 15 other processes on 2 cores, an
  EfficientNet-Lite0 image cost 35 ms of CPU time on one thread and 160 ms on two). On a GPU: the device
  time between two CUDA events around the work. A plan made from work is the plan of an idle machine,
  whatever else runs.
* **wall** (:func:`device_clock`, what the live time budget follows): CUDA kernels are queued, so a host clock
  read right after a call measures the queueing, not the work; the clock is read after :func:`synchronize`,
  which waits for the device's queued work and does nothing on the CPU.

Every timed pass on the CPU also adds its CPU and wall seconds to a process-wide :class:`LoadMeter`
(:data:`LOAD`): their ratio per thread, the *load share*, says how much of its threads' time this process got
while it measured (about 1 on an idle machine, 0.5 beside one process as busy on 2 cores).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait until ``device``'s queued work is done (CUDA); a no-op for the CPU (and None)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def device_clock(device: torch.device | str | None, clock: Callable[[], float] = time.perf_counter
                 ) -> Callable[[], float]:
    """``clock`` read after :func:`synchronize` of ``device``: on a GPU the time when the queued work ends."""

    def read() -> float:
        synchronize(device)
        return clock()

    return read


def usable_cpus() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: The run's threads while :func:`one_thread` holds torch to one (what :func:`threads_used` reports then).
_HELD_THREADS: list[int] = []


def threads_used() -> int:
    """Threads this process computes with on the CPU: torch's intra-op threads, at most the usable cores (the run's,
    inside :func:`one_thread`)."""
    if _HELD_THREADS:
        return _HELD_THREADS[-1]
    return max(1, min(torch.get_num_threads(), usable_cpus()))


@dataclass
class LoadMeter:
    """CPU seconds and wall seconds x threads of the timed CPU passes so far (:func:`timings` adds to it)."""

    cpu: float = 0.0
    thread_wall: float = 0.0

    def add(self, cpu: float, wall: float, threads: int) -> None:
        self.cpu += max(0.0, cpu)
        self.thread_wall += max(0.0, wall) * threads

    def snapshot(self) -> tuple[float, float]:
        return self.cpu, self.thread_wall


#: The process's timed CPU passes (a plan's measurements read the share of their own stretch of it).
LOAD = LoadMeter()


def load_share(cpu: float, thread_wall: float) -> float | None:
    """CPU time over wall time x threads (1: the threads ran all the time; None: too little timed to say)."""
    return min(1.0, cpu / thread_wall) if thread_wall > 0.05 else None


@contextlib.contextmanager
def one_thread(device: torch.device | str | None = None):
    """Torch computes on one thread inside (on the CPU): a probe's untimed warm-up too, since on two threads beside
    other work a thread spins waiting for a descheduled one (seconds of CPU and wall for one warm-up step)."""
    if device is not None and torch.device(device).type == "cuda":
        yield
        return
    own = torch.get_num_threads()
    _HELD_THREADS.append(threads_used())
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(own)
        _HELD_THREADS.pop()


def timings(fn: Callable[[], Any], device: torch.device | str | None, repeats: int = 2,
            clock: Callable[[], float] | None = None) -> list[float]:
    """Seconds of work of each of ``repeats`` calls of ``fn``, sorted: on the CPU the process's CPU time of
    ``fn`` on one thread over the threads the run uses (:func:`threads_used`), on a GPU the device time between
    CUDA events (module docstring).

    ``clock`` (a test's, or ``time.perf_counter`` for wall seconds): each call timed on it instead, from an idle to
    an idle ``device``. On the CPU each pass's CPU and wall seconds go to :data:`LOAD`.
    """
    if clock is not None:
        read = device_clock(device, clock)
        out = []
        for _ in range(repeats):
            start = read()
            fn()
            out.append(read() - start)
        return sorted(out)
    if device is not None and torch.device(device).type == "cuda":
        return sorted(_event_seconds(fn, torch.device(device)) for _ in range(repeats))
    threads, own = threads_used(), torch.get_num_threads()  # what the run computes with; the work is timed on one
    out = []
    torch.set_num_threads(1)
    try:
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            LOAD.add(cpu, wall, 1)
            out.append(cpu / threads)
    finally:
        torch.set_num_threads(own)
    return sorted(out)


def _event_seconds(fn: Callable[[], Any], device: torch.device) -> float:
    """Device seconds of ``fn``'s work on ``device`` (CUDA events recorded around it on the current stream)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    synchronize(device)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


def fastest_of(fn: Callable[[], Any], device: torch.device | str | None, repeats: int = 2) -> float:
    """Work seconds of the fastest of ``repeats`` calls of ``fn`` (:func:`timings`)."""
    return timings(fn, device, repeats)[0]


def work_seconds(cpu: float) -> float:
    """Seconds of work in ``cpu`` CPU seconds of this process: the wall time they take on the run's threads on
    idle cores (:func:`threads_used`), the unit plans are made in whatever else runs (a measurement's own cost;
    :func:`work_since` is the run's elapsed work)."""
    return cpu / threads_used()


def work_since(started: float) -> float:
    """Seconds of the run's own work since ``started`` (a ``time.perf_counter`` reading): the wall time, or the
    process's CPU time when that is less (other processes held the cores meanwhile). What a plan counts as spent
    before it, so that its choices are those of an idle machine; the live budget counts the wall clock."""
    return max(0.0, min(time.perf_counter() - started, time.process_time()))


def cpu_seconds_with_children() -> float:
    """CPU seconds of this process and of its child processes that have ended (worker pools): the work of a command
    that trains on several processes, whatever else held the cores meanwhile."""
    try:
        import resource
    except ImportError:  # not on POSIX: this process only
        return time.process_time()
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


#: ``/proc/stat``'s aggregate CPU line: its columns (Linux, in clock ticks of every core together).
_STAT_COLUMNS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def busy_cpu_seconds(stat: str = "/proc/stat") -> float | None:
    """CPU seconds every process of the machine has run at normal priority or above since boot, the hypervisor's
    steal included (Linux ``/proc/stat``; None elsewhere). Niced work (``nice``) is left out: it yields to this
    process, unless this process is niced itself, whose own seconds then count there."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
        ticks = dict(zip(_STAT_COLUMNS, (int(v) for v in fields[1:1 + len(_STAT_COLUMNS)])))
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if fields[:1] != ["cpu"] or len(ticks) < len(_STAT_COLUMNS):
        return None
    busy = ("user", "system", "irq", "softirq", "steal") + (("nice",) if _niced() else ())
    return sum(ticks[k] for k in busy) / hz


def _niced() -> bool:
    try:
        return os.getpriority(os.PRIO_PROCESS, 0) > 0
    except (AttributeError, OSError):
        return False


@dataclass
class OtherWork:
    """Cores that other processes kept busy between :meth:`start` and :meth:`cores` (the machine's busy CPU time
    less this process's own, over the wall time): a load the plan sees even when its probes run on one thread
    and so get a free core to themselves."""

    busy: float | None = None
    own: float = 0.0
    wall: float = 0.0

    def start(self) -> OtherWork:
        self.busy, self.own, self.wall = busy_cpu_seconds(), time.process_time(), time.perf_counter()
        return self

    def cores(self) -> float | None:
        """Cores held by other processes since :meth:`start` (None: not started, not Linux, or under a second)."""
        now = busy_cpu_seconds()
        wall = time.perf_counter() - self.wall
        if self.busy is None or now is None or wall < 1.0:
            return None
        own = time.process_time() - self.own
        return max(0.0, (now - self.busy) - own) / wall


def process_started(clock: Callable[[], float] = time.perf_counter) -> float:
    """The reading of ``clock`` at which this process started (Linux: ``/proc/self/stat``), so a time budget
    counts the interpreter's start and the imports too; elsewhere, the reading now."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return clock()
    return clock() - max(0.0, age)
