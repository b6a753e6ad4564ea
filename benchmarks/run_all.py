"""Run every benchmark script in this folder one after another (each prints its own table).

Run: .venv/bin/python benchmarks/run_all.py [NAME ...]   (e.g. `run_all.py pair_losses evaluation`)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        wanted = {f"bench_{a.removeprefix('bench_').removesuffix('.py')}.py" for a in argv}
        scripts = [s for s in scripts if s.name in wanted]
    status = 0
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        status |= subprocess.run([sys.executable, str(script)], check=False).returncode
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
