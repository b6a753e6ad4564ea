"""Figures of the claims tests: validation curves from step 0 (the convergence claims)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def convergence_figure(summary: dict, records: dict[str, list[dict]], path: Path) -> Path:
    """Validation MAP@R against steps, from the untrained network at step 0, mean (line) and range (band) over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, arm in enumerate(a["arm"] for a in summary["arms"]):
        runs = records[arm]
        steps = [0] + [p["step"] for p in runs[0]["val_curve"]]
        curves = np.array([[r["start"]["val"]["map_at_r"]] + [p["map_at_r"] for p in r["val_curve"]] for r in runs
                           if len(r["val_curve"]) == len(steps) - 1])
        if not len(curves):
            continue
        ax.plot(steps, curves.mean(0), color=f"C{i}", label=f"{arm} ({len(curves)} seeds)")
        ax.fill_between(steps, curves.min(0), curves.max(0), color=f"C{i}", alpha=0.15)
    if summary.get("threshold") is not None:
        ax.axhline(summary["threshold"], color="k", lw=0.8, ls="--", label=f"threshold {summary['threshold']:g}")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation MAP@R (validation characters)")
    ax.set_title(f"{summary['paper']} {summary['source']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
