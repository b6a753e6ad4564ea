"""Run every benchmark script here in turn, or (--summary) every loss and miner shared with PML against PML.

Without ``--summary`` each script prints its own table. ``--summary`` is the catalogue: every loss
and miner dmlkit shares with pytorch-metric-learning, against PML.

Run: .venv/bin/python benchmarks/run_all.py [NAME ...]   (e.g. `run_all.py pair_losses evaluation`)
     .venv/bin/python benchmarks/run_all.py --summary [--repeats 5] [--threads 2]

``--summary`` runs the five catalogue scripts (pair, proxy, classification at 10,000 classes, the rest
of the losses, miners), each in its own process with its own settings and ``--json``, and prints one
table of every row's PML / dmlkit speed-up (medians of interleaved calls, forward + backward for
losses, the miner call for miners), the median over the whole catalogue, the rows below 1.0x, and
any concrete PML loss or miner class that no row measures. A few minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: The catalogue scripts and their arguments in the summary (B=256 where the script has a batch
#: option; the proxy rows are at SOP scale, B=128 and 11,318 classes; XBM at B=32, 44,800 entries).
CATALOGUE = {
    "bench_pair_losses.py": ["--batch", "256"],
    "bench_proxy_losses.py": ["--pml-only"],
    "bench_classification_losses.py": ["--skip-large"],
    "bench_more_losses.py": [],
    "bench_miners.py": [],
}
ROWS_PREFIX = "CATALOGUE_ROWS "


def run_scripts(argv: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        wanted = {f"bench_{a.removeprefix('bench_').removesuffix('.py')}.py" for a in argv}
        scripts = [s for s in scripts if s.name in wanted]
    status = 0
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        status |= subprocess.run([sys.executable, str(script)], check=False).returncode
    return status


def catalogue_rows(script: str, extra: list[str], repeats: int, threads: int) -> list[dict]:
    """The rows one catalogue script measured (its ``CATALOGUE_ROWS`` line); its table is echoed."""
    cmd = [sys.executable, str(HERE / script), "--repeats", str(repeats), "--threads", str(threads), "--json", *extra]
    print(f"\n=== {' '.join(cmd[1:]).replace(str(HERE) + '/', '')} ===", flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = out.stdout.splitlines()
    print("\n".join(line for line in lines if not line.startswith(ROWS_PREFIX)), flush=True)
    rows = [json.loads(line[len(ROWS_PREFIX):]) for line in lines if line.startswith(ROWS_PREFIX)]
    if out.returncode != 0 or not rows:
        print(f"{script} failed (exit {out.returncode}): {out.stderr.strip()[-500:]}", flush=True)
        return []
    return [dict(row, script=script) for row in rows[0]]


def pml_catalogue() -> set[str]:
    """PML's concrete loss and miner classes (bases, mixins and wrappers' parents left out)."""
    from pytorch_metric_learning import losses, miners

    names = set()
    for module in (losses, miners):
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and not name.startswith(("Base", "Generic")) and not name.endswith("Mixin"):
                names.add(name)
    return names


def summary(repeats: int, threads: int) -> int:
    rows = []
    for script, extra in CATALOGUE.items():
        rows += catalogue_rows(script, extra, repeats, threads)
    print(f"\n=== catalogue summary: PML / dmlkit, median of {repeats} interleaved calls, {threads} threads ===")
    print(f"| {'row':<44} | {'dmlkit ms':>10} | {'PML ms':>10} | {'speed-up':>8} |")
    print(f"|{'-' * 46}|{'-' * 12}|{'-' * 12}|{'-' * 10}|")
    for row in rows:
        row["speedup"] = row["pml_ms"] / row["dmlkit_ms"]
        print(f"| {row['name']:<44} | {row['dmlkit_ms']:>10.3f} | {row['pml_ms']:>10.3f} | {row['speedup']:>7.2f}x |")
    if not rows:
        print("no rows measured")
        return 1
    speedups = [row["speedup"] for row in rows]
    slower = [row["name"] for row in rows if row["speedup"] < 1.0]
    missing = sorted(pml_catalogue() - {row["pml_class"] for row in rows})
    print(f"\ncatalogue median: {statistics.median(speedups):.2f}x over {len(rows)} rows "
          f"(losses {statistics.median(r['speedup'] for r in rows if r['script'] != 'bench_miners.py'):.2f}x, "
          f"miners {statistics.median(r['speedup'] for r in rows if r['script'] == 'bench_miners.py'):.2f}x); "
          f"slowest {min(speedups):.2f}x")
    print(f"rows slower than PML (< 1.0x): {', '.join(slower) if slower else 'none'}")
    print(f"PML losses and miners without a row: {', '.join(missing) if missing else 'none'}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="scripts to run (bench_NAME.py), default all")
    parser.add_argument("--summary", action="store_true", help="the catalogue table against PML with its median")
    parser.add_argument("--repeats", type=int, default=5, help="--summary: timed calls per row and library")
    parser.add_argument("--threads", type=int, default=2, help="--summary: torch threads for both libraries")
    args = parser.parse_args(argv)
    if args.summary:
        return summary(args.repeats, args.threads)
    return run_scripts(args.names)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
