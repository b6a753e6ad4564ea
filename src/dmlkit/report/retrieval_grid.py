"""Retrieval grids: random and worst test queries with their nearest test neighbours, wrong ones framed red."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dmlkit.report.html import esc
from dmlkit.report.run_dir import TestEmbeddings

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


def _to_rgb_tile(image: np.ndarray | None, size: int) -> np.ndarray:
    """``image`` ([H, W] or [H, W, 3|4]) scaled to fit a white ``size`` x ``size`` RGB tile."""
    from PIL import Image

    tile = np.full((size, size, 3), 255, dtype=np.uint8)
    if image is None:
        tile[size // 2 - 1 : size // 2 + 1, size // 4 : 3 * size // 4] = 170  # a grey dash: no image
        return tile
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = np.clip(array, 0, 255).astype(np.uint8)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    picture = Image.fromarray(array[:, :, :3] if array.ndim == 3 else array).convert("RGB")
    if max(picture.size) > size:
        picture.thumbnail((size, size))
    scale = size / max(picture.size)
    if scale > 1:  # small thumbnails are enlarged with visible pixels
        new_size = (max(1, round(picture.size[0] * scale)), max(1, round(picture.size[1] * scale)))
        picture = picture.resize(new_size, Image.Resampling.NEAREST)
    w, h = picture.size
    top, left = (size - h) // 2, (size - w) // 2
    tile[top : top + h, left : left + w] = np.asarray(picture)
    return tile


def tile_png(image: np.ndarray | None, size: int = THUMBNAIL_SIZE) -> str:
    """Base64 PNG of ``image`` fitted into a white ``size`` x ``size`` tile (see :func:`_to_rgb_tile`)."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(_to_rgb_tile(image, size)).save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def retrieval_grid_html(
    data: TestEmbeddings,
    query_index: np.ndarray,
    neighbours: np.ndarray,
    images: dict[int, np.ndarray | None],
    title: str,
) -> str:
    """An HTML grid: one row per query (blue frame), then its neighbours framed green (same class) or red.

    Each cell is a ``<figure>`` with its thumbnail and a two-line caption (rank; class name) cut
    to the cell's width with an ellipsis, the full text in the ``title`` tooltip, so long class
    names never run into the next cell.
    """
    columns = 1 + neighbours.shape[1]
    cells = []
    for q, row in zip(query_index, neighbours):
        q = int(q)
        entries = [(q, "query", QUERY_COLOR)] + [
            (int(n), f"#{j + 1}", CORRECT_COLOR if data.labels[n] == data.labels[q] else WRONG_COLOR)
            for j, n in enumerate(row)
        ]
        for index, rank, color in entries:
            name = data.label_name(int(data.labels[index]))
            cells.append(
                f'<figure><img src="data:image/png;base64,{tile_png(images.get(index), 80)}" '
                f'alt="{esc(rank)}: {esc(name)}" style="border-color:{color}">'
                f'<figcaption title="{esc(rank)} · {esc(name)} (test sample {index})" style="color:{color}">'
                f"<b>{esc(rank)}</b><br>{esc(name)}</figcaption></figure>"
            )
    return (
        f'<div><h3>{esc(title)}</h3><div class="grid" style="grid-template-columns:repeat({columns}, 88px)">'
        + "".join(cells) + "</div></div>"
    )
