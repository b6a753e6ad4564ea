"""train.time_budget counts from the process's start: the interpreter and the imports use the budget too."""

from __future__ import annotations

import subprocess
import sys
import time

from dmlkit.engine.timing import process_started


def test_the_start_is_before_now_in_this_process():
    assert process_started() <= time.perf_counter()


def test_a_process_that_slept_before_asking_counts_the_sleep():
    code = ("import time; time.sleep(1.0); from dmlkit.engine.timing import process_started; "
            "print(time.perf_counter() - process_started())")
    age = float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert 1.0 <= age < 120.0
