"""Retrieval grid: test queries with their nearest test neighbours, wrong ones framed red."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dmlkit.report.figures import DEFAULT_DPI, figure_to_base64_png, new_figure
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
    embeddings: np.ndarray, query_index: np.ndarray, k: int, distance: str = "cosine", chunk_rows: int = 8192
) -> np.ndarray:
    """Top-``k`` neighbours [Q, k] of rows ``query_index`` among all rows of ``embeddings`` [N, D], self excluded.

    Brute force in float64, over chunks of the database rows so memory stays bounded:
    ``cosine`` ranks by similarity of L2-normalised rows, ``euclidean`` by squared distance.
    Ties go to the lower index.
    """
    queries = embeddings[query_index].astype(np.float64)  # [Q, D]
    if distance == "cosine":
        queries = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    score = np.empty((len(query_index), embeddings.shape[0]))  # [Q, N], lower is closer
    for start in range(0, embeddings.shape[0], chunk_rows):
        block = embeddings[start : start + chunk_rows].astype(np.float64)
        if distance == "cosine":
            block = block / np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)
            score[:, start : start + len(block)] = -(queries @ block.T)
        else:
            score[:, start : start + len(block)] = (
                (queries * queries).sum(axis=1)[:, None] - 2.0 * (queries @ block.T) + (block * block).sum(axis=1)[None, :]
            )
    score[np.arange(len(query_index)), query_index] = np.inf
    return np.argsort(score, axis=1, kind="stable")[:, :k]


def _load_path_image(path_text: str, run_dir: Path | None) -> np.ndarray | None:
    from PIL import Image

    candidates = [Path(path_text)]
    if run_dir is not None and not Path(path_text).is_absolute():
        candidates.append(run_dir / path_text)
    for path in candidates:
        if path.is_file():
            try:
                with Image.open(path) as image:
                    image = image.convert("RGB")
                    image.thumbnail((THUMBNAIL_SIZE, THUMBNAIL_SIZE))
                    return np.asarray(image)
            except OSError:
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


def _hex_to_rgb(color: str) -> np.ndarray:
    return np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.uint8)


def grid_mosaic(
    tiles: list[list[tuple[np.ndarray | None, str]]], tile_size: int = 80, frame: int = 4, gap: int = 6,
    title_height: int = 16,
) -> np.ndarray:
    """RGB mosaic [H, W, 3] of rows of (image, frame colour) tiles, leaving room above each for a title."""
    rows, cols = len(tiles), max(len(row) for row in tiles)
    cell_w = tile_size + 2 * frame + gap
    cell_h = tile_size + 2 * frame + gap + title_height
    mosaic = np.full((rows * cell_h + gap, cols * cell_w + gap, 3), 255, dtype=np.uint8)
    for r, row in enumerate(tiles):
        for c, (image, color) in enumerate(row):
            top = gap + r * cell_h + title_height
            left = gap + c * cell_w
            outer = tile_size + 2 * frame
            mosaic[top : top + outer, left : left + outer] = _hex_to_rgb(color)
            mosaic[top + frame : top + frame + tile_size, left + frame : left + frame + tile_size] = (
                _to_rgb_tile(image, tile_size)
            )
    return mosaic


def retrieval_grid_png(
    data: TestEmbeddings,
    query_index: np.ndarray,
    neighbours: np.ndarray,
    images: dict[int, np.ndarray | None],
    dpi: int = DEFAULT_DPI,
) -> str:
    """Grid figure: one row per query (blue frame), then its neighbours framed green (same class) or red.

    The tiles are composed into one array and drawn on a single axes (fast even for many cells).
    """
    tile_size, frame, gap, title_height = 80, 4, 6, 16
    rows = []
    titles = []
    for q, row in zip(query_index, neighbours):
        q = int(q)
        cells = [(q, "query", QUERY_COLOR)] + [
            (int(n), f"#{j + 1}", CORRECT_COLOR if data.labels[n] == data.labels[q] else WRONG_COLOR)
            for j, n in enumerate(row)
        ]
        rows.append([(images.get(idx), color) for idx, _, color in cells])
        titles.append([(f"{title} · {data.label_name(int(data.labels[idx]))}", color) for idx, title, color in cells])
    mosaic = grid_mosaic(rows, tile_size, frame, gap, title_height)
    height, width = mosaic.shape[:2]
    fig = new_figure(width / dpi, height / dpi)
    fig.set_layout_engine(None)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.imshow(mosaic, interpolation="nearest")
    ax.set_axis_off()
    cell_w = tile_size + 2 * frame + gap
    cell_h = tile_size + 2 * frame + gap + title_height
    for r, row_titles in enumerate(titles):
        for c, (text, color) in enumerate(row_titles):
            x = gap + c * cell_w + (tile_size + 2 * frame) / 2
            y = gap + r * cell_h + title_height - 3
            ax.text(x, y, text, ha="center", va="bottom", fontsize=9 * 72 / dpi, color=color)
    return figure_to_base64_png(fig, dpi)
