"""What one training step of the engine costs a launch-bound card, measured on the CPU, before and after.

Run:  python benchmarks/bench_step_overhead.py                 # before = the merge base with main, after = this tree
      python benchmarks/bench_step_overhead.py --before 1c69248 --steps 60 --json-out step.json

On a GPU the MNIST default's step (small CNN, batch 64, Proxy-Anchor) is host-bound: the card waits while
the host queues kernels and, at every host synchronisation, the host waits for the card. What decides it is
visible on the CPU, per step of ``Trainer.fit``'s own loop (batch, augmentation, step, logging, callbacks):

* ``ops``: ATen operators dispatched per step, backward and optimiser included (each is a kernel launch or
  at least a pass through the dispatcher on a card);
* ``syncs``: host synchronisations per step, counted by ``tests/unit/losses/_host_syncs.py`` with every
  tensor treated as device memory (checks of data take the card's branch, as in ``bench_launches.py``);
* ``ms``: host milliseconds per step at one thread (median of the steps between two ``on_step_end`` calls;
  the median of ``--rounds`` processes per side, run alternately).

Rows: the default job as the CPU runs it (AdamW over parameter lists), and as a card runs it (fused AdamW,
which this script forces on the CPU, as ``build_optimizer`` picks it for parameters on CUDA). Each side
runs in its own process: ``before`` imports the ``src/`` of ``--before`` (extracted with ``git archive``),
``after`` this checkout's; the ratio columns are before / after (> 1: fewer, or faster, after). Timings
on a shared machine move with its load; the operator and sync counts are exact.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The default job, with evaluation, checkpoints and the end of training pushed past the measured window.
OVERRIDES = ["train.device=cpu", "train.progress=false", "train.max_steps=100000", "train.eval_every=100000",
             "train.checkpoint_every=100000"]
#: Row name -> (fused AdamW as on a card, extra overrides). "tiny": a 4-channel CNN at batch 16, where the
#: arithmetic is negligible and ``ms`` is the host's own time per step.
TINY = ["model.args.width=4", "sampler.batch_size=16", "sampler.m=4"]
ROWS = {"mnist default, CPU optimiser": (False, []), "mnist default, card optimiser (fused AdamW)": (True, []),
        "tiny, card optimiser (fused AdamW)": (True, TINY)}


def measure_row(fused: bool, overrides: list[str], warmup: int, steps: int, counted: int) -> dict:
    """Operators, syncs and host ms per step of the default job's loop (run in the measuring process)."""
    import torch

    import dmlkit.core.validation as validation
    from dmlkit.config import load_config
    from dmlkit.engine import optim
    from dmlkit.engine.callbacks import Callback
    from dmlkit.recipe import Trainer

    sys.path.insert(0, str(ROOT / "tests" / "unit" / "losses"))
    from _host_syncs import OperatorCounter, count_host_syncs

    torch.set_num_threads(1)
    if fused:  # what build_optimizer picks for parameters on a card
        optim._all_on_cuda = lambda groups: True
    validation.reads_on_host = lambda tensor: False  # checks of data take the card's branch

    class Window(Callback):
        """Times steps warmup..warmup+steps, then counts operators and syncs over ``counted`` steps."""

        def __init__(self):
            self.times, self.ops, self.syncs, self.last = [], None, None, None
            self.counters = []

        def on_step_end(self, trainer, step, metrics):
            now = time.perf_counter()
            if warmup < step <= warmup + steps:
                self.times.append(now - self.last)
            elif step == warmup + steps + 1:
                syncs = count_host_syncs()
                self.syncs = syncs.__enter__()
                ops = OperatorCounter()
                ops.__enter__()
                self.counters = [ops, syncs]
            elif step == warmup + steps + 1 + counted:
                ops, syncs = self.counters
                ops.__exit__(None, None, None)
                syncs.__exit__(None, None, None)
                self.ops = ops.counts
                trainer.should_stop = True
            self.last = time.perf_counter()

    window = Window()
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = load_config(preset="mnist-proxy-anchor", overrides=[*OVERRIDES, *overrides])
        trainer = Trainer(cfg, run_dir, echo=lambda _message: None, callbacks=[window])
        trainer.finish = lambda has_val: None  # the test split's evaluation is not a step
        trainer.fit()
    return {"ops": sum(window.ops.values()) / counted, "syncs": sum(window.syncs.values()) / counted,
            "ms": statistics.median(window.times) * 1e3, "sync_kinds": dict(window.syncs),
            "op_kinds": {name: count / counted for name, count in window.ops.most_common()},
            "optimizer": type(trainer.optimizer).__name__ + (" fused" if fused else "")}


def extract_source(rev: str, into: Path) -> Path:
    """``src/`` of ``rev`` under ``into`` (``git archive``)."""
    archive = into / "src.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), rev, "src"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_side(src: Path, args: argparse.Namespace) -> dict:
    """Every row measured in a fresh process importing dmlkit from ``src``."""
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, __file__, "--measure", "--warmup", str(args.warmup), "--steps", str(args.steps),
               "--counted", str(args.counted)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        sys.exit(f"measuring with {src} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=None, help="git revision of the 'before' column (default: merge base with main)")
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per row")
    parser.add_argument("--counted", type=int, default=20, help="steps whose operators and syncs are counted")
    parser.add_argument("--rounds", type=int, default=3, help="processes per side, alternating; ms is their median")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps({name: measure_row(fused, overrides, args.warmup, args.steps, args.counted)
                          for name, (fused, overrides) in ROWS.items()}))
        return
    before = args.before or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], check=True,
                                           capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        sources = {"before": extract_source(before, Path(scratch)), "after": ROOT / "src"}
        rounds = {side: [] for side in sources}
        for turn in range(args.rounds):  # the sides alternate (and swap who goes first): drifting load hits both
            for side in (("before", "after") if turn % 2 == 0 else ("after", "before")):
                rounds[side].append(run_side(sources[side], args))
    sides = {side: {name: dict(runs[0][name], ms=statistics.median(run[name]["ms"] for run in runs))
                    for name in ROWS} for side, runs in rounds.items()}
    load = os.getloadavg()[0]
    print(f"before: {before[:12]}, after: this checkout; 1 thread; medians of {args.rounds} alternating processes "
          f"per side; load average {load:.2f}")
    print(f"{'row':46} {'ops before':>10} {'after':>7} {'ratio':>6} {'syncs before':>12} {'after':>6} "
          f"{'ms before':>9} {'after':>7} {'ratio':>6}")
    for name in ROWS:
        b, a = sides["before"][name], sides["after"][name]
        print(f"{name:46} {b['ops']:10.1f} {a['ops']:7.1f} {b['ops'] / a['ops']:5.2f}x {b['syncs']:12.2f} "
              f"{a['syncs']:6.2f} {b['ms']:9.2f} {a['ms']:7.2f} {b['ms'] / a['ms']:5.2f}x")
    for side in ("before", "after"):
        for name in ROWS:
            print(f"  {side} syncs of {name}: {sides[side][name]['sync_kinds']}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"before": before, "load": load, **sides}, indent=1))


if __name__ == "__main__":
    main()
