"""The plan of `dmlkit train --dry-run` idle and beside a competing CPU-bound process: does it follow the load?

Run:  .venv/bin/python benchmarks/plan_under_load.py [--sets pets mini grocery omniglot] [--loads idle normal nice19]
      .venv/bin/python benchmarks/plan_under_load.py --fresh      (no kept costs: each plan from its own timings)
      .venv/bin/python benchmarks/plan_under_load.py --sets mini --loads idle normal --set train.time_budget=534

For each data set (``--sets``: the Pets, mini-ImageNet 84-px and grocery photo folders with their classes sorted
into halves, and Omniglot at 28 px) and each load (``--loads``: ``idle``, nothing started beside it; ``normal``, one
CPU-bound Python process spinning beside it at normal priority; ``nice19``, the same at nice 19), one
``dmlkit train --dry-run`` in a fresh process with ``DMLKIT_PLAN_STORE=off`` (nothing kept or replayed: every dry run
measures). The dry runs of one invocation share one new, empty folder of kept least costs (``DMLKIT_COST_STORE``,
src/dmlkit/recipe/kept_costs.py): each set's first load times its work alone and the later loads read each cost
no higher than the least timed before, as a user's runs on one machine do; ``--fresh`` switches that off (every
dry run from its own timings only). The table has one row per data set and a column group per load: the
backbone, the frozen stages, the cached views, the steps (the plan's own, or the ceiling where the plan bought all
of it), the ensemble members (Omniglot), the CPU share the plan saw while measuring (CPU time over wall time x
threads), the cores other processes held meanwhile (the machine's busy CPU time less the dry run's own, niced work
left out), how many of its costs the kept ones lowered, and the dry run's wall time. The plan is made from CPU
time and the machine's least costs, so the choices should not move with the load; the wall time does.

The wall times are of one run on whatever machine runs it: on a shared machine (other users' work beside the
script as well as the competitor it starts) "idle" is only "no competitor started here"; the share column says how
shared it was.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"

SETS = {
    "pets": ["data.name=folder", f"data.root={DATA / 'pets' / 'images'}", "data.class_split=sorted"],
    "mini": ["data.name=folder", f"data.root={DATA / 'miniimagenet64' / 'images'}", "data.class_split=sorted"],
    "grocery": ["data.name=folder", f"data.root={DATA / 'grocery' / 'images'}", "data.class_split=sorted"],
    "omniglot": ["data.name=omniglot", f"data.root={DATA / 'omniglot'}", "data.label=character", "data.image_size=28"],
}

LOADS = ("idle", "normal", "nice19")

#: One CPU-bound process: a Python loop that never sleeps.
SPIN = "while True:\n    pass\n"


def competitor(load: str) -> subprocess.Popen | None:
    """The competing process of ``load`` (None for idle), started now."""
    if load == "idle":
        return None
    niceness = 19 if load == "nice19" else 0
    return subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=(lambda: os.nice(niceness)) if niceness else None)


def dry_run(overrides: list[str], costs: str) -> tuple[str, float]:
    """The dry run's stdout and stderr, and its wall time (seconds); ``costs``: its ``DMLKIT_COST_STORE``."""
    env = {**os.environ, "DMLKIT_PLAN_STORE": "off", "DMLKIT_COST_STORE": costs}
    args = [sys.executable, "-m", "dmlkit", "train", "--dry-run"]
    for override in overrides:
        args += ["--set", override]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"dry run failed ({done.returncode}): {' '.join(args)}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr, wall


def choice(text: str, field: str) -> str:
    found = re.search(rf"^  {re.escape(field)} = (\S+)", text, re.M)
    return found.group(1) if found else "-"


def summary(text: str, wall: float) -> dict[str, str]:
    """The plan's choices read from a dry run's output."""
    steps = re.search(r"^  steps\s+(?:about (\d+) steps|no training step)?.*?train\.max_steps=(\d+)", text, re.M)
    planned = "-" if steps is None else (steps.group(1) or ("0" if steps.group(0).find("no training") >= 0
                                                             else steps.group(2)))
    share = re.search(r"CPU share while measuring: ([\d.]+)", text) or re.search(r"CPU share ([\d.]+)", text)
    others = re.search(r"other processes' cores: ([\d.]+)", text) or re.search(r"other processes held ([\d.]+)", text)
    lowered = re.search(r"(\d+) cost\(s\) read at this machine's least kept timing", text)
    backbone = choice(text, "model.name").replace("efficientnet_", "")
    return {"backbone": backbone, "frozen": choice(text, "model.frozen_stages"), "views": choice(text, "train.cache_views"),
            "steps": planned, "members": choice(text, "model.ensemble"), "share": share.group(1) if share else "-",
            "others": others.group(1) if others else "-", "kept": lowered.group(1) if lowered else "0",
            "wall": f"{wall:.0f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", choices=sorted(SETS), default=list(SETS))
    parser.add_argument("--loads", nargs="+", choices=LOADS, default=list(LOADS))
    parser.add_argument("--set", action="append", default=[], dest="extra", metavar="KEY=VALUE",
                        help="an override added to every dry run")
    parser.add_argument("--log", type=Path, help="append every dry run's output to this file")
    parser.add_argument("--fresh", action="store_true",
                        help="DMLKIT_COST_STORE=off: every dry run plans from its own timings alone")
    args = parser.parse_args()
    rows: dict[str, dict[str, dict[str, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="dmlkit-costs-") as kept:
        for name in args.sets:
            for load in args.loads:
                rows.setdefault(name, {})[load] = one_plan(name, load, args, "off" if args.fresh else kept)
    columns = ("backbone", "frozen", "views", "steps", "members", "share", "others", "kept", "wall")
    header = "| set | " + " | ".join(f"{c} ({load})" for load in args.loads for c in columns) + " |"
    print(header)
    print("|" + "---|" * (1 + len(columns) * len(args.loads)))
    for name, by_load in rows.items():
        print(f"| {name} | " + " | ".join(by_load[load][c] for load in args.loads for c in columns) + " |")


def one_plan(name: str, load: str, args: argparse.Namespace, costs: str) -> dict[str, str]:
    """The plan of data set ``name`` under ``load``, summarised (and logged when ``--log`` is given)."""
    spinning = competitor(load)
    try:
        text, wall = dry_run(SETS[name] + args.extra, costs)
    finally:
        if spinning is not None:
            spinning.kill()
            spinning.wait()
    row = summary(text, wall)
    if args.log:
        with args.log.open("a", encoding="utf-8") as f:
            f.write(f"===== {name} {load} ({wall:.0f} s)\n{text}\n")
    print(f"{name} {load}: {row}", file=sys.stderr, flush=True)
    return row


if __name__ == "__main__":
    main()
