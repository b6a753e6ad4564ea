"""Retrieval grid pieces: brute-force neighbours, query choice, framed mosaic."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.report.retrieval_grid import (
    CORRECT_COLOR,
    QUERY_COLOR,
    WRONG_COLOR,
    _hex_to_rgb,
    choose_queries,
    grid_mosaic,
    load_images,
    nearest_neighbours,
)


def _reference_neighbours(x: np.ndarray, queries: np.ndarray, k: int, distance: str) -> np.ndarray:
    """Explicit loop: score every other row, sort by (score, index)."""
    out = []
    for q in queries:
        scored = []
        for j in range(x.shape[0]):
            if j == q:
                continue
            if distance == "cosine":
                cos = float(np.dot(x[q], x[j]) / (np.linalg.norm(x[q]) * np.linalg.norm(x[j])))
                scored.append((-cos, j))
            else:
                scored.append((float(np.sum((x[q] - x[j]) ** 2)), j))
        out.append([j for _, j in sorted(scored)[:k]])
    return np.array(out)


def test_neighbours_match_loop_reference():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 7))
    queries = np.array([0, 5, 39, 17])
    for distance in ("cosine", "euclidean"):
        got = nearest_neighbours(x.astype(np.float32), queries, 4, distance, chunk_rows=7)
        np.testing.assert_array_equal(got, _reference_neighbours(x, queries, 4, distance))


def test_cosine_and_euclidean_can_disagree():
    x = np.array([[1.0, 0.0], [10.0, 0.5], [0.5, 0.6]])
    assert nearest_neighbours(x, np.array([0]), 1, "cosine")[0, 0] == 1  # same direction
    assert nearest_neighbours(x, np.array([0]), 1, "euclidean")[0, 0] == 2  # closer point


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 30), dim=st.integers(1, 5), k=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_neighbours_exclude_self_and_are_sorted(n, dim, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim))
    k = min(k, n - 1)
    queries = np.arange(n)
    got = nearest_neighbours(x, queries, k, "euclidean")
    assert got.shape == (n, k)
    assert not (got == queries[:, None]).any()
    dist = ((x[queries][:, None, :] - x[got]) ** 2).sum(-1)
    assert (np.diff(dist, axis=1) >= -1e-9).all()
    assert all(len(set(row)) == k for row in got.tolist())


def test_queries_come_from_distinct_eligible_classes_and_depend_on_seed():
    labels = np.array([0, 0, 1, 2, 2, 2, 3, 3, 4], dtype=np.int64)  # classes 1 and 4 are singletons
    chosen = choose_queries(labels, 3, seed=0)
    assert len(chosen) == 3 and len(set(labels[chosen])) == 3
    assert set(labels[chosen]) <= {0, 2, 3}
    np.testing.assert_array_equal(chosen, choose_queries(labels, 3, seed=0))
    draws = {tuple(choose_queries(labels, 2, seed=s)) for s in range(10)}
    assert len(draws) > 1
    more = choose_queries(labels, 6, seed=1)  # more queries than eligible classes
    assert len(more) == 6 and len(set(more.tolist())) == 6 and set(labels[more]) <= {0, 2, 3}
    assert choose_queries(np.arange(5), 3, seed=0).size == 0


def test_mosaic_frames_carry_the_requested_colours():
    gray = np.full((10, 6), 77, np.uint8)
    rgb = np.zeros((5, 5, 3), np.uint8)
    tiles = [[(gray, QUERY_COLOR), (rgb, CORRECT_COLOR)], [(None, QUERY_COLOR), (gray, WRONG_COLOR)]]
    size, frame, gap, title = 20, 3, 4, 10
    mosaic = grid_mosaic(tiles, size, frame, gap, title)
    cell_w, cell_h = size + 2 * frame + gap, size + 2 * frame + gap + title
    assert mosaic.shape == (2 * cell_h + gap, 2 * cell_w + gap, 3)
    for r, row in enumerate(tiles):
        for c, (_, color) in enumerate(row):
            top, left = gap + r * cell_h + title, gap + c * cell_w
            np.testing.assert_array_equal(mosaic[top, left + 5], _hex_to_rgb(color))  # top edge
            np.testing.assert_array_equal(mosaic[top + 10, left + 1], _hex_to_rgb(color))  # left edge
    # the gray thumbnail is scaled into the tile; its centre keeps its value
    centre = mosaic[gap + title + frame + size // 2, gap + frame + size // 2]
    np.testing.assert_array_equal(centre, [77, 77, 77])
    assert _hex_to_rgb(WRONG_COLOR).tolist() == [0xD1, 0x24, 0x2F]


def test_images_load_from_thumbnails_or_paths_relative_to_the_run(tmp_path):
    from PIL import Image

    from dmlkit.report.run_dir import TestEmbeddings

    Image.fromarray(np.full((300, 150, 3), 200, np.uint8)).save(tmp_path / "big.png")
    data = TestEmbeddings(np.zeros((3, 2), np.float32), np.arange(3, dtype=np.int64),
                          paths=np.array(["big.png", "missing.png", str(tmp_path / "big.png")]))
    loaded = load_images(data, np.array([0, 1, 2]), run_dir=tmp_path)
    assert loaded[1] is None  # a missing file is a blank tile, not a crash
    assert loaded[0].shape == (96, 48, 3) and loaded[2].shape == (96, 48, 3)  # shrunk to <= 96 px
    data.thumbnails = np.arange(3 * 4 * 4, dtype=np.uint8).reshape(3, 4, 4)
    np.testing.assert_array_equal(load_images(data, np.array([2]), None)[0], data.thumbnails[2])
