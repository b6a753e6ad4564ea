"""Retrieval grids: random and worst test queries with their nearest test neighbours (similarity, tick or
cross), and the true matches the worst queries missed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dmlkit.report.html import esc
from dmlkit.report.run_reader import TestEmbeddings

DISTANCES = ("cosine", "euclidean")
CORRECT_COLOR = "#1a7f37"
WRONG_COLOR = "#d1242f"
QUERY_COLOR = "#0969da"
THUMBNAIL_SIZE = 96


def choose_queries(labels: np.ndarray, num_queries: int, seed: int) -> np.ndarray:
    """Indices of up to ``num_queries`` queries from distinct classes having >= 2 samples, by ``seed``.

    Classes are drawn without replacement, then one member of each; when there are fewer
    such classes than ``num_queries`` the remaining queries are further members.
    """
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    eligible = classes[counts >= 2]
    if eligible.size == 0:
        return np.empty(0, dtype=np.int64)
    order = rng.permutation(eligible.size)
    candidates = np.flatnonzero(np.isin(labels, eligible))
    shuffled = candidates[rng.permutation(candidates.size)]
    chosen: list[int] = []
    for cls in eligible[order][:num_queries]:
        chosen.append(int(shuffled[labels[shuffled] == cls][0]))
    for idx in shuffled:  # more queries than classes: add further members
        if len(chosen) >= num_queries:
            break
        if int(idx) not in chosen:
            chosen.append(int(idx))
    return np.asarray(chosen, dtype=np.int64)


def nearest_neighbours(
    embeddings: np.ndarray, query_index: np.ndarray, k: int, distance: str = "cosine"
) -> np.ndarray:
    """Top-``k`` neighbours [Q, k] of rows ``query_index`` among all rows of ``embeddings`` [N, D], self excluded.

    The exact k-NN of :mod:`dmlkit.evaluation.knn` (memory O(N k), float64 ranking keys):
    ``cosine`` ranks by similarity of L2-normalised rows, ``euclidean`` by squared distance.
    Ties go to the lower index.
    """
    return all_neighbours(embeddings, k, distance)[np.asarray(query_index, dtype=np.int64)]


def all_neighbours(embeddings: np.ndarray, k: int, distance: str = "cosine") -> np.ndarray:
    """Top-``k`` neighbours [N, k] of every row among the others (leave-one-out), as :func:`nearest_neighbours`."""
    import torch

    from dmlkit.evaluation.knn import knn

    x = torch.from_numpy(np.ascontiguousarray(embeddings, dtype=np.float64))
    return knn(x, x, k, exclude_self=True, metric=distance)[1].numpy()


def worst_queries(labels: np.ndarray, neighbours: np.ndarray, num_queries: int) -> np.ndarray:
    """Up to ``num_queries`` queries whose first neighbours are wrong, worst first, one per class.

    ``neighbours [N, k]`` are every row's nearest neighbours. A query qualifies when its class has
    another member and its first neighbour is from another class. Queries are ordered by their
    row of right (1) / wrong (0) neighbours read as a binary number with the first neighbour most
    significant (all wrong first, then wrong up to a later rank), ties by index; then the first
    query of each class is kept.
    """
    classes, counts = np.unique(labels, return_counts=True)
    eligible = np.isin(labels, classes[counts >= 2])
    hits = labels[neighbours] == labels[:, None]  # [N, k]
    weights = 2.0 ** np.arange(hits.shape[1] - 1, -1, -1)
    candidates = np.flatnonzero(eligible & ~hits[:, 0])
    order = candidates[np.lexsort((candidates, hits[candidates] @ weights))]
    _, first_of_class = np.unique(labels[order], return_index=True)
    return order[np.sort(first_of_class)][:num_queries]


def _load_path_image(path_text: str, run_dir: Path | None) -> np.ndarray | None:
    from dmlkit.data.base import load_image
    from dmlkit.exceptions import DataError

    candidates = [Path(path_text)]
    if run_dir is not None and not Path(path_text).is_absolute():
        candidates.append(run_dir / path_text)
    for path in candidates:
        if path.is_file():
            try:  # decoded as training decodes it: EXIF orientation, 16-bit scaled, size budget
                image = load_image(str(path)).convert("RGB")
                image.thumbnail((THUMBNAIL_SIZE, THUMBNAIL_SIZE))
                return np.asarray(image)
            except (OSError, DataError):
                return None
    return None


def load_images(data: TestEmbeddings, indices: np.ndarray, run_dir: Path | None) -> list[np.ndarray | None]:
    """Images of rows ``indices``: from ``thumbnails`` if saved, else from ``paths`` via PIL, else None."""
    if data.thumbnails is not None:
        return [data.thumbnails[i] for i in indices]
    if data.paths is not None:
        return [_load_path_image(str(data.paths[i]), run_dir) for i in indices]
    return [None for _ in indices]


def image_png(image: np.ndarray | None) -> tuple[str, int, int]:
    """Base64 PNG of ``image`` ([H, W] or [H, W, 1|3|4]) at its own pixels, with its width and height;
    a small grey dash when there is no image. Never enlarged: the page shows it at most 1x."""
    import base64
    import io

    from PIL import Image

    if image is None:
        array = np.full((24, 24), 255, dtype=np.uint8)
        array[11:13, 6:18] = 170  # a grey dash: no image
    else:
        array = np.asarray(image)
        if array.dtype != np.uint8:
            array = np.clip(array, 0, 255).astype(np.uint8)
        if array.ndim == 3 and array.shape[2] == 1:
            array = array[:, :, 0]
        if array.ndim == 3:
            array = array[:, :, :3]
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii"), int(array.shape[1]), int(array.shape[0])


def cosine_similarities(embeddings: np.ndarray, query_index: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Cosine similarity [Q, k] of each query row and its ``others [Q, k]`` rows (float64)."""
    x = embeddings.astype(np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return np.einsum("qd,qkd->qk", x[query_index], x[others])


def missed_matches(embeddings: np.ndarray, labels: np.ndarray, query: int, neighbours: np.ndarray,
                   count: int, distance: str = "cosine") -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` nearest same-class samples of ``query`` that are not among its ``neighbours``, and
    their 1-based ranks among all other test samples (by ``distance``)."""
    x = embeddings.astype(np.float64)
    if distance == "cosine":
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        key = -(x @ x[query])
    else:
        key = ((x - x[query]) ** 2).sum(axis=1)
    key[query] = np.inf
    order = np.lexsort((np.arange(len(key)), key))[:-1]  # self (inf) last, dropped
    ranks = np.empty(len(key), dtype=np.int64)
    ranks[order] = np.arange(1, len(order) + 1)
    true = order[(labels[order] == labels[query]) & ~np.isin(order, neighbours)][:count]
    return true, ranks[true]


def _cell(data: TestEmbeddings, index: int, image, head: str, mark: str, color: str, note: str) -> str:
    """One grid cell: the thumbnail at <= 1x in a coloured frame, the rank with a tick/cross glyph,
    the similarity and class name; file name and full text in the ``title`` tooltip."""
    png, width, height = image_png(image)
    name = data.label_name(int(data.labels[index]))
    file_name = Path(str(data.paths[index])).name if data.paths is not None else None
    tooltip = f"{head} · {name} (test sample {index}" + (f", {file_name}" if file_name else "") + ")"
    if note:
        tooltip += f" · {note}"
    label = f"{mark} {head}".strip()
    return (
        f'<figure title="{esc(tooltip)}"><div class="tile" style="border-color:{color}">'
        f'<img src="data:image/png;base64,{png}" width="{width}" height="{height}" alt="{esc(label)}: {esc(name)}">'
        f'</div><figcaption style="color:{color}"><b>{esc(label)}</b> {esc(note)}<br>{esc(name)}</figcaption></figure>'
    )


def retrieval_grid_html(
    data: TestEmbeddings,
    query_index: np.ndarray,
    neighbours: np.ndarray,
    images: dict[int, np.ndarray | None],
    title: str,
    missed: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
) -> str:
    """An HTML grid: one row per query (blue frame), then its neighbours framed green with a tick (same
    class) or red with a cross, each with its cosine similarity to the query. ``missed`` maps a query to
    same-class samples ranked below the grid and their ranks, shown in an extra row under it.

    Thumbnails are shown at their own pixels (at most 80 CSS px, never enlarged); captions are cut to the
    cell's width with an ellipsis, the full text and the file name in the ``title`` tooltip.
    """
    columns = 1 + neighbours.shape[1]
    similarity = cosine_similarities(data.embeddings, query_index, neighbours)
    cells = []
    for q, row, sims in zip(query_index, neighbours, similarity):
        q = int(q)
        cells.append(_cell(data, q, images.get(q), "query", "", QUERY_COLOR, ""))
        for j, (n, sim) in enumerate(zip(row, sims)):
            right = data.labels[n] == data.labels[q]
            cells.append(_cell(data, int(n), images.get(int(n)), f"#{j + 1}", "\u2713" if right else "\u2717",
                               CORRECT_COLOR if right else WRONG_COLOR, f"cos {sim:.2f}"))
        if missed and q in missed and len(missed[q][0]):
            true, ranks = missed[q]
            sims = cosine_similarities(data.embeddings, np.array([q]), true[None, :])[0]
            cells.append('<div class="row-label">true matches the query missed &#8594;</div>')
            cells += [_cell(data, int(t), images.get(int(t)), f"rank {int(r)}", "\u2713", CORRECT_COLOR,
                            f"cos {sim:.2f}") for t, r, sim in zip(true, ranks, sims)]
            cells += ["<div></div>"] * (columns - 1 - len(true))
    return (
        f'<div class="scroll"><h3>{esc(title)}</h3><div class="grid" style="grid-template-columns:repeat({columns}, 88px)">'
        + "".join(cells) + "</div></div>"
    )
