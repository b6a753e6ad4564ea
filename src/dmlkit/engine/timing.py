"""Wall-clock timing of work that may run asynchronously on a GPU.

CUDA kernels are queued: a host clock read right after a call measures the queueing, not the work.
Every timing the engine decides on (the time budget's step and validation speeds, backbone-by-budget's
costs) reads the clock after :func:`synchronize`, which waits for the device's queued work and
does nothing on the CPU.
"""

from __future__ import annotations

import os
import time
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


def timings(fn: Callable[[], Any], device: torch.device | str | None, repeats: int = 2,
            clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn``, sorted, each timed from an idle to an idle ``device``."""
    read = device_clock(device, clock)
    out = []
    for _ in range(repeats):
        start = read()
        fn()
        out.append(read() - start)
    return sorted(out)


def fastest_of(fn: Callable[[], Any], device: torch.device | str | None, repeats: int = 2) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn`` (a shared machine's interruptions only ever add time)."""
    return timings(fn, device, repeats)[0]


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
