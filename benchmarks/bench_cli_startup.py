"""How long ``dmlkit --help`` and ``dmlkit VERB --help`` take, against an empty interpreter measured in the same run.

Run: .venv/bin/python benchmarks/bench_cli_startup.py [--repeats 7]

Each row is the median wall time of ``--repeats`` fresh processes (``python -m dmlkit ...``), interleaved
with the reference ``python -c pass`` so that a busy machine slows both alike; the last column is the row
over the reference. Help builds every verb's parser and imports neither torch nor numpy
(tests/unit/cli/test_cli_startup.py checks it); ``import torch`` is shown for scale.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

#: ``(label, python arguments)``; the first is the reference the others are divided by.
COMMANDS = [
    ("python -c pass", ["-c", "pass"]),
    ("dmlkit --help", ["-m", "dmlkit", "--help"]),
    ("dmlkit train --help", ["-m", "dmlkit", "train", "--help"]),
    ("dmlkit index --help", ["-m", "dmlkit", "index", "--help"]),
    ("python -c 'import torch'", ["-c", "import torch"]),
]


def wall_time(python_args: list[str], env: dict[str, str]) -> float:
    """Seconds from starting the process to its exit (its output discarded)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *python_args], env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)}
    times: dict[str, list[float]] = {label: [] for label, _ in COMMANDS}
    for _ in range(args.repeats):
        for label, python_args in COMMANDS:  # interleaved: load on the machine reaches every row alike
            times[label].append(wall_time(python_args, env))
    reference = statistics.median(times[COMMANDS[0][0]])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"median of {args.repeats} processes each; load average at the end {load:.1f} on {os.cpu_count()} cores")
    print(f"{'command':<28} {'median s':>9} {'min s':>7} {'x pass':>7}")
    for label, _ in COMMANDS:
        median = statistics.median(times[label])
        print(f"{label:<28} {median:>9.3f} {min(times[label]):>7.3f} {median / reference:>7.1f}")


if __name__ == "__main__":
    main()
