"""``dmlkit compare RUN_DIR...``: one table and one page (curves overlaid) for several runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from dmlkit.engine.run_layout import METRICS_FILE


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run directories written by `dmlkit train`")
    p.add_argument("--out", default="comparison.html", help="HTML page to write (default: comparison.html)")


def comparison_table(run_dirs: list[str]) -> str:
    """Text table: one row per run, final test metrics as columns."""
    from dmlkit.core.json_files import read_json
    from dmlkit.evaluation.metrics import SUMMARY_KEYS as KEYS
    from dmlkit.exceptions import DataError

    rows = []
    for d in run_dirs:
        path = Path(d) / METRICS_FILE
        if not path.is_file():
            raise DataError(f"{d}: no {METRICS_FILE} (has the run finished?)")
        rows.append((Path(d).name, read_json(path)))
    width = max(len(n) for n, _ in rows)
    head = "run".ljust(width) + "  " + "  ".join(k.rjust(14) for k in KEYS)
    lines = [head, "-" * len(head)]
    for name, m in rows:
        cells = [(f"{m[k]:.4f}" if isinstance(m.get(k), (int, float)) else "-").rjust(14) for k in KEYS]
        lines.append(name.ljust(width) + "  " + "  ".join(cells))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from dmlkit.cli.common import check_output_file

    check_output_file(args.out, "--out", replaceable=lambda p: p.suffix.lower() in (".html", ".htm"),
                      what="an HTML page")
    print(comparison_table(args.run_dirs))
    from dmlkit.report import write_comparison

    print(write_comparison(args.run_dirs, args.out))
    return 0
