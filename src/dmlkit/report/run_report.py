"""Self-contained HTML report of one run: metrics, curves, embedding map, retrieval grid, config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dmlkit.core.validation import Interval, Options, validate_params
from dmlkit.engine.run_layout import ENV_FILE, REPORT_FILE, TEST_EMBEDDINGS_FILE
from dmlkit.evaluation.metrics import LABELS
from dmlkit.report import html
from dmlkit.report.embedding_map import EMBEDDING_METHODS, embedding_map_figure
from dmlkit.report.figures import figure_html, projections_figure, run_curves_figure, selected_step
from dmlkit.report.paths import relative_paths, shown_environment
from dmlkit.report.retrieval_grid import (
    CORRECT_COLOR,
    DISTANCES,
    WRONG_COLOR,
    all_neighbours,
    choose_queries,
    load_images,
    missed_matches,
    retrieval_grid_html,
    worst_queries,
)
from dmlkit.report.run_reader import RunData, flatten_mapping, load_run
from dmlkit.report.summary import answer_html, evaluations_table, metric_label, metrics_tables, ordered_metric_keys
from dmlkit.report.verification import failures_html, verification_figure_html

METRIC_NAMES = LABELS
__all__ = ["REPORT_FILE", "build_report_html", "metric_label", "ordered_metric_keys", "write_report"]

REPORT_CONSTRAINTS = {
    "embedding_method": [Options(EMBEDDING_METHODS)],
    "max_points": [Interval(int, 1, None)],
    "num_queries": [Interval(int, 1, 64)],
    "num_neighbours": [Interval(int, 1, 16)],
    "distance": [Options(DISTANCES)],
    "seed": [Interval(int, 0, None)],
    "dpi": [Interval(int, 20, 400)],
    "proxies": [Options((True, False))],
}


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
    return " · ".join(parts) if parts else run.run_dir.name


def metrics_section(run: RunData) -> str:
    """Display-named test metrics, then the run's counters (steps, pairs, time) and split sizes; per category
    (a CSV ``category`` column) when the run has them."""
    per_category = per_category_table(run.metrics.get("per_category"))
    return metrics_tables(run) + (f'<div class="scroll">{per_category}</div>' if per_category else "")


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
    """MAP@R, R@1, training loss and learning rate on their own axes, the selected step marked;
    then the table of every validation evaluation."""
    fig, notes = run_curves_figure(run)
    body = "".join(html.note(n) for n in notes)
    if fig is not None:
        step = selected_step(run)
        body += figure_html(
            fig, "training curves: MAP@R, R@1, training loss and learning rate by step",
            "Each quantity on its own axes against the training step. The dashed vertical line is the step whose "
            "weights the run kept; the square is the test score of those weights. The loss is drawn raw (faint) "
            "and as a trailing mean.", dpi, data={"selected-step": "" if step is None else step})
    return body + evaluations_table(run)


def embedding_section(run: RunData, method: str, max_points: int, seed: int, dpi: int, proxies: bool = True) -> str:
    """2-D picture of the test embeddings, or a note why there is none."""
    if run.embeddings is None:
        reason = run.problems.get(TEST_EMBEDDINGS_FILE, f"{TEST_EMBEDDINGS_FILE} is missing")
        return html.note(relative_paths(f"No embedding map: {reason}.", run.run_dir))
    fig, caption, data = embedding_map_figure(run.embeddings, method=method, max_points=max_points, seed=seed,
                                              proxies=proxies)
    return figure_html(fig, "2-D map of the test embeddings coloured by test class", caption, dpi, data=data)


def retrieval_section(run: RunData, num_queries: int, k: int, distance: str, seed: int, dpi: int) -> str:
    """Random queries and the worst queries (first neighbours wrong) with their top-k test neighbours and,
    under each worst query, the true matches it missed; a label table when no images were saved."""
    data = run.embeddings
    if data is None:
        reason = run.problems.get(TEST_EMBEDDINGS_FILE, f"{TEST_EMBEDDINGS_FILE} is missing")
        return html.note(relative_paths(f"No retrieval grid: {reason}.", run.run_dir))
    k = min(k, data.labels.shape[0] - 1)
    queries = choose_queries(data.labels, num_queries, seed)
    if k < 1 or queries.size == 0:
        return html.note("No retrieval grid: no test class has two or more samples.")
    everyone = all_neighbours(data.embeddings, k, distance)
    worst = worst_queries(data.labels, everyone, num_queries)
    neighbours = everyone[queries]
    missed = {int(q): missed_matches(data.embeddings, data.labels, int(q), everyone[q], k, distance) for q in worst}
    extra = [m[0] for m in missed.values()]
    wanted = np.unique(np.concatenate([queries, worst, neighbours.ravel(), everyone[worst].ravel(), *extra]))
    images = dict(zip(wanted.tolist(), load_images(data, wanted, run.run_dir)))
    wrong = int((data.labels[neighbours] != data.labels[queries][:, None]).sum())
    first_wrong = int((data.labels[everyone[:, 0]] != data.labels).sum())
    summary = (f"First: {queries.size} queries (one per randomly drawn class, seed {seed}), top {k} neighbours by "
               f"{distance} distance among all {data.labels.shape[0]:,} test samples; {wrong} of "
               f"{neighbours.size} neighbours are from another class. Then the worst queries, one per class: "
               f"first neighbour from another class, most wrong neighbours first ({first_wrong:,} test samples "
               "have a wrong first neighbour); under each, the nearest true matches it missed with their rank. "
               "Blue frame: query; green with \u2713: same class; red with \u2717: another class; cos: cosine "
               "similarity to the query. Thumbnails are shown at their stored pixels; hover for the file name.")
    if any(image is not None for image in images.values()):
        grids = retrieval_grid_html(data, queries, neighbours, images, "Random queries")
        if worst.size:
            grids += retrieval_grid_html(data, worst, everyone[worst], images, "Worst queries", missed=missed)
        else:
            grids += html.note("No worst queries: every first neighbour is from the query's class.")
        return f'<div class="grids">{grids}</div><p class="note">{html.esc(summary)}</p>'
    return html.note("test.npz has no thumbnails and no loadable image paths; showing class labels only.") + \
        _label_grid(data, queries, neighbours) + f"<p>{html.esc(summary)}</p>"


def verification_section(run: RunData, distance: str) -> str:
    """Genuine/impostor histogram and DET curve with the thresholds, then the worst classes and confusions."""
    data = run.embeddings
    if data is None:
        return html.note("No verification plot: embeddings/test.npz is missing.")
    body = verification_figure_html(data, run.metrics)
    if data.labels.shape[0] > 1:
        body += failures_html(data, all_neighbours(data.embeddings, 1, distance)[:, 0], distance)
    return body


def _label_grid(data, queries: np.ndarray, neighbours: np.ndarray) -> str:
    """Class names of the queries and their neighbours (tick or cross) when no images were saved."""
    labels = data.labels
    header = "".join(f"<th>#{j + 1}</th>" for j in range(neighbours.shape[1]))
    rows = []
    for q, row in zip(queries, neighbours):
        cells = "".join(
            f'<td style="color:{CORRECT_COLOR if labels[n] == labels[q] else WRONG_COLOR}">'
            f"{'&#10003;' if labels[n] == labels[q] else '&#10007;'} {html.esc(data.label_name(int(labels[n])))} "
            f"(#{int(n)})</td>"
            for n in row
        )
        rows.append(f"<tr><th>{html.esc(data.label_name(int(labels[q])))} (#{int(q)})</th>{cells}</tr>")
    return f"<table><thead><tr><th>query</th>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def projections_section(records: list[dict[str, Any]], dpi: int) -> str:
    """ASAP per-projection table and plot: covering radius before/after, proxy spread, best MAP@R.

    ASAP Sec. 4.3 (Algorithm 1): each projection ends by re-selecting proxies by k-Center.
    """
    keys = ["projection", "steps", "best_map_at_r", "covering_radius_before", "covering_radius_after", "proxy_spread"]
    rows = [[r.get(key, "") for key in keys] for r in records]
    return (
        figure_html(projections_figure(records), "covering radius per ASAP projection",
                    "Covering radius before and after each projection's proxy re-selection; ASAP Sec. 4.3 "
                    "picks the next proxies to reduce it (Prop. 4.2).", dpi)
        + html.table(keys, rows, numeric_columns=range(1, len(keys)), row_header=False)
    )


def mapping_section(mapping: dict[str, Any] | None, missing_text: str, run_dir: Path) -> str:
    """A mapping (the configuration) once, as YAML folded in a ``<details>``, paths relative to the run."""
    if mapping is None:
        return html.note(relative_paths(missing_text, run_dir))
    if not mapping:
        return html.note("(empty)")
    text = yaml.safe_dump(relative_paths(mapping, run_dir), sort_keys=False, allow_unicode=True,
                          default_flow_style=False)
    return (f"<details><summary>the configuration as YAML ({len(flatten_mapping(mapping))} keys; paths relative "
            f"to the run directory)</summary><pre>{html.esc(text)}</pre></details>")


def environment_section(env: dict[str, Any] | None, missing_text: str, run_dir: Path) -> str:
    """Device, versions, platform, commit, seed and the command line (as typed), paths relative to the run."""
    if env is None:
        return html.note(relative_paths(missing_text, run_dir))
    record = shown_environment(env, run_dir)
    record.setdefault("device", "not recorded (runs before the device was logged)")
    flat = flatten_mapping(record)
    first = [k for k in ("device", "command") if k in flat]
    rows = [(k, flat[k]) for k in first + sorted(k for k in flat if k not in first)]
    return html.table(("what", "value"), rows)


def build_report_html(
    run: RunData,
    *,
    embedding_method: str = "pca",
    max_points: int = 2000,
    num_queries: int = 8,
    num_neighbours: int = 4,
    distance: str = "cosine",
    seed: int = 0,
    dpi: int = 192,
    proxies: bool = True,
) -> str:
    """The report page of ``run`` as an HTML string (see :func:`write_report`).

    Sections are ``(id, title, body)`` in :data:`REPORT_SECTIONS` order; a new table section is one
    more entry in the list below.
    """
    sections = [
        ("metrics", "Test metrics", metrics_section(run)),
        ("curves", "Training curves", curves_section(run, dpi)),
        ("embedding-map", "Embedding map", embedding_section(run, embedding_method, max_points, seed, dpi,
                                                             proxies)),
        ("retrieval-grid", "Retrieval examples", retrieval_section(run, num_queries, num_neighbours,
                                                                   distance, seed, dpi)),
        ("verification", "Verification and failures", verification_section(run, distance)),
    ]
    projections = run.records_of("projection")
    if projections:
        sections.append(("projections", "ASAP projections", projections_section(projections, dpi)))
    env_missing = run.problems.get(ENV_FILE, f"{ENV_FILE} is missing") + "; no environment record."
    sections += [
        ("config", "Configuration", mapping_section(run.config, "config.yaml is empty.", run.run_dir)),
        ("environment", "Environment", environment_section(run.env, env_missing, run.run_dir)),
    ]
    return html.page(f"dmlkit run: {run.name}", describe_run(run), sections, lead=answer_html(run))


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (never a half-written page); see :mod:`dmlkit.engine.checkpoint_files`."""
    from dmlkit.engine.checkpoint_files import atomic_write_text

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
    dpi: int = 192,
    proxies: bool = True,
) -> Path:
    """Write a self-contained HTML report of a run (default ``run_dir/report.html``); returns its path.

    The page opens with the answer (test MAP@R and P@1 of the kept weights against the untrained
    embedding, split sizes, what was kept and why). Sections (by ``id``): ``metrics``, ``curves``,
    ``embedding-map``, ``retrieval-grid``, ``verification``, ``projections`` (ASAP runs only),
    ``config``, ``environment``. Figures are embedded as 2x PNG shown at 96 CSS px per inch
    (``dpi`` pixels per inch); ``embedding_method`` is ``pca``, ``tsne`` or ``umap`` (needs umap-learn);
    ``proxies`` draws the training-class proxies in neutral grey. No absolute path of the machine
    appears in the page: paths are relative to the run directory. A missing required file
    (config.yaml, metrics.json, log.jsonl) raises
    :class:`~dmlkit.report.run_reader.MissingRunFileError`; missing optional pieces become notes.
    """
    params = dict(embedding_method=embedding_method, max_points=max_points, num_queries=num_queries,
                  num_neighbours=num_neighbours, distance=distance, seed=seed, dpi=dpi, proxies=proxies)
    validate_params("write_report", params, REPORT_CONSTRAINTS)
    run = load_run(run_dir)
    target = Path(out_path) if out_path is not None else run.run_dir / REPORT_FILE
    write_text_atomic(target, build_report_html(run, **params))
    return target
