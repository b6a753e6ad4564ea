"""Self-contained HTML report of one run: metrics, curves, embedding map, retrieval grid, config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dmlkit._validation import Interval, Options, validate_params
from dmlkit.evaluation.metrics import LABELS
from dmlkit.report import html
from dmlkit.report.embedding_map import EMBEDDING_METHODS, embedding_map_png
from dmlkit.report.figures import projections_png, run_curves_png
from dmlkit.report.retrieval_grid import (
    CORRECT_COLOR,
    DISTANCES,
    WRONG_COLOR,
    all_neighbours,
    choose_queries,
    load_images,
    retrieval_grid_html,
    worst_queries,
)
from dmlkit.report.run_dir import (
    EMBEDDINGS_FILE,
    ENV_FILE,
    RunData,
    flatten_mapping,
    load_run,
)

REPORT_FILE = "report.html"

METRIC_NAMES = LABELS

REPORT_CONSTRAINTS = {
    "embedding_method": [Options(EMBEDDING_METHODS)],
    "max_points": [Interval(int, 1, None)],
    "num_queries": [Interval(int, 1, 64)],
    "num_neighbours": [Interval(int, 1, 16)],
    "distance": [Options(DISTANCES)],
    "seed": [Interval(int, 0, None)],
    "dpi": [Interval(int, 20, 300)],
}


def ordered_metric_keys(keys: list[str] | set[str]) -> list[str]:
    """The standard metrics in the papers' order, then any extra keys alphabetically."""
    known = [k for k in METRIC_NAMES if k in keys]
    return known + sorted(k for k in keys if k not in METRIC_NAMES)


def metric_label(key: str) -> str:
    """Display name of a metric key (``map_at_r`` -> ``MAP@R``); unknown keys unchanged."""
    return METRIC_NAMES.get(key, key)


def describe_run(run: RunData) -> str:
    """One line naming data set, loss, model and embedding size from the config."""
    flat = flatten_mapping(run.config)
    parts = []
    for key, label in (("data.name", "data"), ("loss.name", "loss"), ("model.name", "model"),
                       ("model.embedding_size", "embedding size")):
        if key in flat and flat[key] not in (None, ""):
            parts.append(f"{label}: {flat[key]}")
    if "selected_on" in run.metrics:
        parts.append(f"selected on: {run.metrics['selected_on']}")
    return " · ".join(parts) if parts else str(run.run_dir)


def metrics_section(run: RunData) -> str:
    """Table of the final test metrics (every numeric key of metrics.json)."""
    values = run.metric_values()
    if not values:
        return html.note("metrics.json has no numeric metrics.")
    rows = [(metric_label(k), k, values[k]) for k in ordered_metric_keys(set(values))]
    body = html.table(("metric", "key", "value"), rows, numeric_columns=(2,))
    non_numeric = {k: v for k, v in run.metrics.items() if k not in values and k != "per_category"}
    body += per_category_table(run.metrics.get("per_category"))
    if non_numeric:
        body += "<p>" + "; ".join(f"{html.esc(k)}: <code>{html.esc(html.format_value(v))}</code>"
                                  for k, v in non_numeric.items()) + "</p>"
    return body


def per_category_table(per_category: Any) -> str:
    """Table of the per-category retrieval metrics of ``metrics.json`` (a CSV ``category`` column); "" if none."""
    if not isinstance(per_category, dict) or not per_category:
        return ""
    keys = ordered_metric_keys({k for v in per_category.values() if isinstance(v, dict) for k in v})
    rows = [(name, *[values.get(k) if isinstance(values, dict) else None for k in keys])
            for name, values in per_category.items()]
    return "<h3>Per category</h3>" + html.table(("category", *[metric_label(k) for k in keys]), rows,
                                                numeric_columns=range(1, len(keys) + 1))


def curves_section(run: RunData, dpi: int) -> str:
    """Training loss and eval MAP@R / R@1 against steps and wall-clock time."""
    png, notes = run_curves_png(run, dpi)
    body = "".join(html.note(n) for n in notes)
    if png is not None:
        body += html.figure(png, "training curves",
                            "Left: training loss by step. Middle and right: MAP@R and R@1 of the "
                            "periodic evaluations by step and by wall-clock time (as Proxy-Anchor Fig. 1).")
    return body


def embedding_section(run: RunData, method: str, max_points: int, seed: int, dpi: int) -> str:
    """2-D picture of the test embeddings, or a note why there is none."""
    if run.embeddings is None:
        reason = run.problems.get(EMBEDDINGS_FILE, f"{EMBEDDINGS_FILE} is missing")
        return html.note(f"No embedding map: {reason}.")
    png, caption = embedding_map_png(run.embeddings, method=method, max_points=max_points, seed=seed, dpi=dpi)
    return html.figure(png, "2-D map of the test embeddings coloured by class", caption)


def retrieval_section(run: RunData, num_queries: int, k: int, distance: str, seed: int, dpi: int) -> str:
    """Random queries and the worst queries (first neighbours wrong) with their top-k test neighbours,
    side by side; a label table when no images were saved."""
    data = run.embeddings
    if data is None:
        reason = run.problems.get(EMBEDDINGS_FILE, f"{EMBEDDINGS_FILE} is missing")
        return html.note(f"No retrieval grid: {reason}.")
    k = min(k, data.labels.shape[0] - 1)
    queries = choose_queries(data.labels, num_queries, seed)
    if k < 1 or queries.size == 0:
        return html.note("No retrieval grid: no test class has two or more samples.")
    everyone = all_neighbours(data.embeddings, k, distance)
    worst = worst_queries(data.labels, everyone, num_queries)
    neighbours = everyone[queries]
    wanted = np.unique(np.concatenate([queries, worst, neighbours.ravel(), everyone[worst].ravel()]))
    images = dict(zip(wanted.tolist(), load_images(data, wanted, run.run_dir)))
    wrong = int((data.labels[neighbours] != data.labels[queries][:, None]).sum())
    first_wrong = int((data.labels[everyone[:, 0]] != data.labels).sum())
    summary = (f"Left: {queries.size} queries (one per randomly drawn class, seed {seed}), top {k} neighbours by "
               f"{distance} distance among all {data.labels.shape[0]} test samples; {wrong} of "
               f"{neighbours.size} neighbours are from another class. Right: the worst queries, one per class: "
               f"first neighbour from another class, most wrong neighbours first ({first_wrong} test samples "
               "have a wrong first neighbour). Blue: query; green: same class; red: wrong class.")
    if any(image is not None for image in images.values()):
        grids = retrieval_grid_html(data, queries, neighbours, images, "Random queries")
        if worst.size:
            grids += retrieval_grid_html(data, worst, everyone[worst], images, "Worst queries")
        else:
            grids += html.note("No worst queries: every first neighbour is from the query's class.")
        return f'<div class="grids">{grids}</div><p class="note">{html.esc(summary)}</p>'
    return html.note("test.npz has no thumbnails and no loadable image paths; showing class labels only.") + \
        _label_grid(data.labels, queries, neighbours) + f"<p>{html.esc(summary)}</p>"


def _label_grid(labels: np.ndarray, queries: np.ndarray, neighbours: np.ndarray) -> str:
    header = "".join(f"<th>#{j + 1}</th>" for j in range(neighbours.shape[1]))
    rows = []
    for q, row in zip(queries, neighbours):
        cells = "".join(
            f'<td style="color:{CORRECT_COLOR if labels[n] == labels[q] else WRONG_COLOR}">'
            f"class {int(labels[n])} (#{int(n)})</td>"
            for n in row
        )
        rows.append(f"<tr><th>class {int(labels[q])} (#{int(q)})</th>{cells}</tr>")
    return f"<table><thead><tr><th>query</th>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def projections_section(records: list[dict[str, Any]], dpi: int) -> str:
    """ASAP per-projection table and plot: covering radius before/after, proxy spread, best MAP@R.

    ASAP Sec. 4.3 (Algorithm 1): each projection ends by re-selecting proxies by k-Center.
    """
    keys = ["projection", "steps", "best_map_at_r", "covering_radius_before", "covering_radius_after", "proxy_spread"]
    rows = [[r.get(key, "") for key in keys] for r in records]
    return (
        html.figure(projections_png(records, dpi), "covering radius per ASAP projection",
                    "Covering radius before and after each projection's proxy re-selection; ASAP Sec. 4.3 "
                    "picks the next proxies to reduce it (Prop. 4.2).")
        + html.table(keys, rows, numeric_columns=range(1, len(keys)), row_header=False)
    )


def mapping_section(mapping: dict[str, Any] | None, missing_text: str) -> str:
    """A flattened key/value table of a config-like mapping plus its YAML in a collapsible block."""
    if mapping is None:
        return html.note(missing_text)
    flat = flatten_mapping(mapping)
    if not flat:
        return html.note("(empty)")
    text = yaml.safe_dump(mapping, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return (
        html.table(("key", "value"), sorted(flat.items()))
        + f"<details><summary>as YAML</summary><pre>{html.esc(text)}</pre></details>"
    )


def build_report_html(
    run: RunData,
    *,
    embedding_method: str = "pca",
    max_points: int = 2000,
    num_queries: int = 8,
    num_neighbours: int = 4,
    distance: str = "cosine",
    seed: int = 0,
    dpi: int = 80,
) -> str:
    """The report page of ``run`` as an HTML string (see :func:`write_report`)."""
    sections = [
        ("metrics", "Test metrics", metrics_section(run)),
        ("curves", "Training curves", curves_section(run, dpi)),
        ("embedding-map", "Embedding map", embedding_section(run, embedding_method, max_points, seed, dpi)),
        ("retrieval-grid", "Retrieval examples", retrieval_section(run, num_queries, num_neighbours,
                                                                   distance, seed, dpi)),
    ]
    projections = run.records_of("projection")
    if projections:
        sections.append(("projections", "ASAP projections", projections_section(projections, dpi)))
    env_missing = run.problems.get(ENV_FILE, f"{ENV_FILE} is missing") + "; no environment record."
    sections += [
        ("config", "Configuration", mapping_section(run.config, "config.yaml is empty.")),
        ("environment", "Environment", mapping_section(run.env, env_missing)),
    ]
    return html.page(f"dmlkit run: {run.name}", describe_run(run), sections)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (never a half-written page); see :mod:`dmlkit.engine.checkpoint`."""
    from dmlkit.engine.checkpoint import atomic_write_text

    atomic_write_text(path, text)


def write_report(
    run_dir: str | Path,
    *,
    out_path: str | Path | None = None,
    embedding_method: str = "pca",
    max_points: int = 2000,
    num_queries: int = 8,
    num_neighbours: int = 4,
    distance: str = "cosine",
    seed: int = 0,
    dpi: int = 80,
) -> Path:
    """Write a self-contained HTML report of a run (default ``run_dir/report.html``); returns its path.

    Sections (by ``id``): ``metrics``, ``curves``, ``embedding-map``, ``retrieval-grid``,
    ``projections`` (ASAP runs only), ``config``, ``environment``. Figures are embedded as
    base64 PNG. A missing required file (config.yaml, metrics.json, log.jsonl) raises
    :class:`~dmlkit.report.run_dir.MissingRunFileError`; missing optional pieces become notes.
    """
    params = dict(embedding_method=embedding_method, max_points=max_points, num_queries=num_queries,
                  num_neighbours=num_neighbours, distance=distance, seed=seed, dpi=dpi)
    validate_params("write_report", params, REPORT_CONSTRAINTS)
    run = load_run(run_dir)
    target = Path(out_path) if out_path is not None else run.run_dir / REPORT_FILE
    write_text_atomic(target, build_report_html(run, **params))
    return target
