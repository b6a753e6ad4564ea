"""What a photo run of the claims costs and whether every photo arm learns, at the default budget.

Run: .venv/bin/python benchmarks/bench_photo_claims.py [--out runs/bench-photo-claims] [--seeds 0 1] [--size 128]

Builds (or reads) the frozen-stage store of the grocery photos under ``OUT/data`` and prints its CPU
seconds, then trains every photo arm of ``dmlkit.claims`` at its middle grid point on each seed (the
claims' ``train_run``: 1 torch thread, records under ``OUT/runs``, so a second call reads them back)
and prints one row a run: its CPU seconds (``time.process_time``: the work, not the wall time of a shared
machine), steps and selected step, start -> selected validation MAP@R, start -> test MAP@R.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from dmlkit.claims.catalogue import ARMS, PHOTO_SETTINGS, learning_rates_for
from dmlkit.claims.photos import photo_store
from dmlkit.claims.runner import FULL, grid_axes, train_run

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-photo-claims", help="store and records (a second call reads them)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--size", type=int, default=FULL.photo_size)
    parser.add_argument("--data-root", default=str(DATA))
    args = parser.parse_args()
    budget = dataclasses.replace(FULL, photo_size=args.size, threads=1)
    torch.set_num_threads(1)
    out = Path(args.out)
    start = time.process_time()
    stored = photo_store(Path(args.data_root), out, budget)
    print(f"store: {tuple(stored.storage.shape)} in {time.process_time() - start:.0f} CPU-s (built, or read back)")
    print("| arm | seed | CPU-s | steps (selected) | val MAP@R start -> selected | test MAP@R start -> final |")
    print("|---|---|---|---|---|---|")
    seconds = []
    for seed in args.seeds:
        for name, arm in ARMS.items():
            if arm.setting not in PHOTO_SETTINGS:
                continue
            point = {k: v[0] for k, v in grid_axes(arm, learning_rates_for(arm.setting), narrow=True).items()}
            r = train_run(arm, seed, point, budget, out, args.data_root, None, lambda s: None)
            key = "fine_map_at_r" if "fine_map_at_r" in r["test"] else "map_at_r"
            seconds.append(r["cpu_seconds"])
            print(f"| {name} | {seed} | {r['cpu_seconds']:.1f} | {r['steps']} ({r['best_step']}) | "
                  f"{r['start']['val']['map_at_r']:.3f} -> {r['selected_val_map_at_r']:.3f} | "
                  f"{r['start']['test'][key]:.3f} -> {r['test'][key]:.3f} |", flush=True)
    print(f"{len(seconds)} runs: mean {statistics.fmean(seconds):.1f} CPU-s, {min(seconds):.1f}-{max(seconds):.1f}")


if __name__ == "__main__":
    main()
