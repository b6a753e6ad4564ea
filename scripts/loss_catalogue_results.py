"""Train every named loss with the real CLI on one data setting and tabulate test MAP@R and P@1.

Usage::

    .venv/bin/python scripts/loss_catalogue_results.py [--losses arcface cosface ...]
        [--set data.name=folder --set data.root=DIR ...] [--out runs/catalogue] [--table FILE]

Each loss runs ``python -m dmlkit train --set loss.name=X [--set loss.args.K=V ...] --seed S
--quiet --no-progress --no-report --out OUT/X`` (the default recipe, nothing else changed), one after the
other; the script reads ``OUT/X/metrics.json`` and prints a markdown table (loss, MAP@R, P@1,
which weights the recipe kept where ``metrics.json`` records ``kept_pretrained``, wall seconds of
the whole process, exit status). A run that fails is a row with the last line of its error, never
a stop of the script. A loss whose folder already holds ``metrics.json`` is not trained again (its
wall time is then the one saved in ``OUT/X/wall.json``), so an interrupted sweep can be repeated.

The default list is every loss name registered for configs plus ``proxy_anchor`` (the default
recipe's loss) as the reference. Losses with required constructor arguments get the values in
:data:`REQUIRED_ARGS`; the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The loss names registered for configs, then the default recipe's loss as the reference.
ISSUE30_LOSSES = (
    "arcface", "subcenter_arcface", "cosface", "sphereface", "large_margin_softmax", "normalized_softmax",
    "p2sgrad", "ntxent", "supcon", "circle", "ranked_list", "fastap", "smooth_ap", "pnp", "histogram",
    "angular", "tuplet_margin", "tcm", "instance", "manifold", "snr_contrastive", "intra_pair_variance",
    "dynamic_soft_margin", "nca",
)
DEFAULT_LOSSES = (*ISSUE30_LOSSES, "proxy_anchor")

#: Arguments the constructor requires (PML gives them no default), with the reason for each value.
#: ``"{embedding_size}"`` is replaced by ``--embedding-size``.
REQUIRED_ARGS: dict[str, tuple[dict[str, object], str]] = {
    "ranked_list": ({"margin": 0.4, "Tn": 10.0},
                    "Ranked List Loss paper's setting (Wang et al. 2019: m = 0.4, T_n = 10; alpha left at "
                    "PML's 1 + m/2 = 1.2, the paper's value)"),
    "manifold": ({"l": "{embedding_size}", "K": 50},
                 "PML: l is the embedding size; K = 50 proxies is PML's default"),
}


def loss_overrides(name: str, embedding_size: int) -> list[str]:
    """``--set loss.name=...`` plus the required arguments of :data:`REQUIRED_ARGS`."""
    sets = [f"loss.name={name}"]
    args, _ = REQUIRED_ARGS.get(name, ({}, ""))
    for key, value in args.items():
        if value == "{embedding_size}":
            value = embedding_size
        sets.append(f"loss.args.{key}={value}")
    return sets


def last_error_line(stderr: str) -> str:
    """The last non-empty line of a failed run's stderr (the exception), shortened for a table cell."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    text = lines[-1] if lines else "no output"
    return text.replace("|", "/")[:300]


def run_one(name: str, out: Path, extra: list[str], seed: int, embedding_size: int,
            timeout: float | None) -> dict[str, object]:
    """Train one loss through the CLI (unless ``out/metrics.json`` exists) and return its row."""
    overrides = loss_overrides(name, embedding_size) + list(extra)
    metrics_file, wall_file = out / "metrics.json", out / "wall.json"
    row: dict[str, object] = {"loss": name, "overrides": overrides}
    if not metrics_file.exists():
        if out.exists():  # a failed or interrupted earlier attempt: start afresh
            shutil.rmtree(out)
        command = [sys.executable, "-m", "dmlkit", "train", *[a for s in overrides for a in ("--set", s)],
                   "--seed", str(seed), "--quiet", "--no-progress", "--no-report", "--out", str(out)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
        start = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
            status, stderr = done.returncode, done.stderr
        except subprocess.TimeoutExpired:
            status, stderr = "timeout", f"no result within {timeout} s"
        wall = time.perf_counter() - start
        if status != 0:
            row.update(status=status, error=last_error_line(stderr), wall=round(wall, 1))
            return row
        out.mkdir(parents=True, exist_ok=True)
        wall_file.write_text(json.dumps({"wall": round(wall, 1)}))
    return collect(row, out)


def collect(row: dict[str, object], out: Path) -> dict[str, object]:
    """Add a finished run's test metrics, wall time and validation path (``out/metrics.json``, ``log.jsonl``)."""
    metrics = json.loads((out / "metrics.json").read_text())
    wall_file = out / "wall.json"
    wall = json.loads(wall_file.read_text())["wall"] if wall_file.exists() else None
    row.update(status=0, wall=wall, map_at_r=metrics.get("map_at_r"), precision_at_1=metrics.get("precision_at_1"),
               kept_pretrained=metrics.get("kept_pretrained"), best_step=metrics.get("best_step"),
               selected_on=metrics.get("selected_on"))
    val = {}  # validation MAP@R per step (runs with validation classes only)
    for line in (out / "log.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "eval" and record.get("split") == "val" and "map_at_r" in record:
            val[record["step"]] = record["map_at_r"]
    if val:
        trained = {step: value for step, value in val.items() if step > 0}
        best = max(trained, key=trained.get) if trained else None
        row.update(val_step0=val.get(0), val_best_trained=trained.get(best), val_best_trained_step=best)
    return row


def _number(value: object) -> str:
    return "-" if value is None else f"{value:.4f}"


def _kept(row: dict[str, object]) -> str:
    if "kept_pretrained" not in row or row["kept_pretrained"] is None:
        return f"{row.get('selected_on', '-')} (step {row.get('best_step', '-')})" if row.get("status") == 0 else "-"
    return "pretrained" if row["kept_pretrained"] else f"fine-tuned (step {row['best_step']})"


def _validation(row: dict[str, object]) -> str:
    if row.get("val_step0") is None and row.get("val_best_trained") is None:
        return "-"
    return (f"{_number(row.get('val_step0'))} -> {_number(row.get('val_best_trained'))} "
            f"({row.get('val_best_trained_step', '-')})")


def markdown(rows: list[dict[str, object]]) -> str:
    """The results table, then one line per loss that ran with required arguments."""
    lines = ["| loss | MAP@R | P@1 | weights kept | validation MAP@R: step 0 -> best trained (step) | wall s "
             "| exit status |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        status = "ok" if row["status"] == 0 else f"{row['status']}: {row.get('error', '')}"
        wall = "-" if row.get("wall") is None else f"{row['wall']:.0f}"
        lines.append(f"| {row['loss']} | {_number(row.get('map_at_r'))} | {_number(row.get('precision_at_1'))} "
                     f"| {_kept(row)} | {_validation(row)} | {wall} | {status} |")
    notes = [f"- `{row['loss']}` ran with required arguments "
             f"{' '.join('`' + s + '`' for s in row['overrides'][1:] if s.startswith('loss.args.'))}: "
             f"{REQUIRED_ARGS[row['loss']][1]}." for row in rows if row["loss"] in REQUIRED_ARGS]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--losses", nargs="+", default=list(DEFAULT_LOSSES), help="registered loss names")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override every run gets (e.g. data.name=folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--embedding-size", type=int, default=64,
                        help="value for losses whose required argument is the embedding size (manifold's l); "
                             "64 is the small CNN's default")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run before it counts as failed")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "loss_catalogue")
    parser.add_argument("--table", type=Path, default=None, help="also write the markdown table here")
    parser.add_argument("--rows", type=Path, nargs="+", default=None,
                        help="train nothing: print one table from these rows.json files of earlier sweeps")
    args = parser.parse_args(argv)

    if args.rows is not None:
        rows = [collect(row, path.parent / row["loss"]) if row["status"] == 0 else row
                for path in args.rows for row in json.loads(path.read_text())]
        return _write(markdown(rows), args.table)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.losses:
        row = run_one(name, args.out / name, args.extra, args.seed, args.embedding_size, args.timeout)
        rows.append(row)
        print(f"{name}: status {row['status']}, MAP@R {_number(row.get('map_at_r'))}, wall {row.get('wall')}",
              file=sys.stderr, flush=True)
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    return _write(markdown(rows), args.table)


def _write(table: str, path: Path | None) -> int:
    print(table, end="")
    if path is not None:
        path.write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
