"""Costs are work, not wall time: CPU time per thread on the CPU, so other processes do not change them."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from dmlkit.engine import timing


class RunningWallClock:
    """A wall clock that runs ``seconds`` ahead at every reading: other processes hold the cores meanwhile."""

    def __init__(self, seconds: float):
        self.now, self.seconds = time.perf_counter(), seconds

    def __call__(self) -> float:
        self.now += self.seconds
        return self.now


def busy_work() -> None:
    x = torch.ones(200, 200)
    for _ in range(20):
        x = (x @ x).clamp_(max=1.0)


def test_work_seconds_are_cpu_time_per_thread_and_the_share_sees_the_lost_wall_time(monkeypatch):
    monkeypatch.setattr(timing, "LOAD", timing.LoadMeter())
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=RunningWallClock(5.0),
                                                        process_time=time.process_time))
    threads = torch.get_num_threads()
    seconds = timing.timings(busy_work, "cpu", repeats=3)
    assert all(0 < s < 1.0 for s in seconds)  # 5 s of wall time per pass did not count
    assert torch.get_num_threads() == threads  # timed on one thread, the run's threads given back
    cpu, thread_wall = timing.LOAD.snapshot()
    assert thread_wall >= 3 * 5.0  # each pass on one thread
    assert timing.load_share(cpu, thread_wall) < 0.1  # the process got almost none of its threads' time


def test_work_is_one_threads_cpu_time_over_the_runs_threads(monkeypatch):
    """The run computes with 4 threads: the work of one thread's CPU time is a quarter of it in wall time."""
    readings = iter([0.0, 2.0])  # 2 s of CPU time between the two readings
    monkeypatch.setattr(timing, "LOAD", timing.LoadMeter())
    monkeypatch.setattr(timing, "threads_used", lambda: 4)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=time.perf_counter,
                                                        process_time=lambda: next(readings)))
    seen = []
    assert timing.timings(lambda: seen.append(torch.get_num_threads()), "cpu", repeats=1) == [0.5]
    assert seen == [1]


def test_a_test_clock_times_what_it_says():
    ticks = iter(range(100))
    assert timing.timings(lambda: None, "cpu", repeats=2, clock=lambda: float(next(ticks))) == [1.0, 1.0]


def test_load_share_needs_something_timed():
    assert timing.load_share(0.0, 0.0) is None
    assert timing.load_share(3.0, 2.0) == 1.0  # helper threads beyond torch's: capped
    assert timing.load_share(1.0, 2.0) == pytest.approx(0.5)


def test_cpu_seconds_with_children_counts_a_finished_child_process():
    import subprocess
    import sys

    from dmlkit.engine.timing import cpu_seconds_with_children

    before, own = cpu_seconds_with_children(), time.process_time()
    subprocess.run([sys.executable, "-c", "sum(range(20_000_000))"], check=True)  # work in a child only
    assert cpu_seconds_with_children() - before > 0.1 + (time.process_time() - own)
