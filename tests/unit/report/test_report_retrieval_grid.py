"""Retrieval grid pieces: exact neighbours, query choice (random and worst), the HTML grid."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.report.retrieval_grid import (
    CORRECT_COLOR,
    QUERY_COLOR,
    WRONG_COLOR,
    all_neighbours,
    choose_queries,
    cosine_similarities,
    load_images,
    missed_matches,
    nearest_neighbours,
    retrieval_grid_html,
    worst_queries,
)
from dmlkit.report.run_reader import TestEmbeddings


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
        got = nearest_neighbours(x.astype(np.float32), queries, 4, distance)
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


def test_worst_queries_have_wrong_first_neighbours_most_wrong_first_one_per_class():
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 3], dtype=np.int64)  # class 3 is a singleton
    neighbours = np.array([
        [3, 5, 1],  # 0: wrong, wrong, right
        [0, 2, 3],  # 1: right first: never a worst query
        [4, 6, 3],  # 2: all wrong -> worst of class 0
        [0, 1, 2],  # 3: all wrong
        [0, 3, 1],  # 4: wrong, right, wrong
        [0, 1, 6],  # 5: wrong, wrong, right
        [5, 0, 1],  # 6: right first
        [0, 1, 2],  # 7: singleton class: excluded
    ])
    # loop reference: eligible rows with a wrong first neighbour, by (hits as a binary number, index)
    rows = []
    for q in range(len(labels)):
        if (labels == labels[q]).sum() < 2 or labels[neighbours[q, 0]] == labels[q]:
            continue
        hits = [int(labels[n] == labels[q]) for n in neighbours[q]]
        rows.append((int("".join(map(str, hits)), 2), q))
    expected, seen = [], set()
    for _, q in sorted(rows):
        if labels[q] not in seen:
            seen.add(labels[q])
            expected.append(q)
    got = worst_queries(labels, neighbours, 8)
    assert got.tolist() == expected == [2, 3, 5]
    assert worst_queries(labels, neighbours, 2).tolist() == [2, 3]
    np.testing.assert_array_equal(all_neighbours(np.eye(3), 2, "euclidean"), [[1, 2], [0, 2], [0, 1]])


def test_grid_cells_carry_frames_and_full_names_in_tooltips():
    names = np.array(["Pileated_Woodpecker", "Rock_Wren", "Black_footed_Albatross_with_a_long_name"])
    data = TestEmbeddings(np.zeros((4, 2), np.float32), np.array([0, 0, 1, 2]), class_names=names)
    images = {i: np.full((12, 12), 40 * i, np.uint8) for i in range(4)}
    text = retrieval_grid_html(data, np.array([0]), np.array([[1, 2, 3]]), images, "Worst queries")
    assert "<h3>Worst queries</h3>" in text and "repeat(4, 88px)" in text
    assert text.count("<figure ") == 4 and text.count("data:image/png;base64,") == 4
    assert text.count('width="12" height="12"') == 4  # shown at the stored pixels, never enlarged
    for color in (QUERY_COLOR, CORRECT_COLOR, WRONG_COLOR):
        assert f"border-color:{color}" in text
    assert 'title="#3 · Black_footed_Albatross_with_a_long_name (test sample 3) · cos 0.00"' in text
    assert 'title="query · Pileated_Woodpecker (test sample 0)"' in text
    assert "<b>\u2713 #1</b>" in text and "<b>\u2717 #2</b>" in text  # tick / cross besides the colour


def test_missed_matches_are_the_nearest_true_matches_outside_the_grid_with_their_ranks():
    x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.8, 0.3], [-1.0, 0.0]])
    labels = np.array([0, 1, 0, 0, 0])
    true, ranks = missed_matches(x, labels, 0, np.array([1]), 3)
    # by cosine to sample 0: 1 (0.99), 3 (0.94), 2 (0.0), 4 (-1): sample 1 is in the grid
    assert true.tolist() == [3, 2, 4] and ranks.tolist() == [2, 3, 4]
    sims = cosine_similarities(x, np.array([0]), np.array([[2, 4]]))
    np.testing.assert_allclose(sims, [[0.0, -1.0]], atol=1e-12)


def test_images_load_from_thumbnails_or_paths_relative_to_the_run(tmp_path):
    from PIL import Image

    from dmlkit.report.run_reader import TestEmbeddings

    Image.fromarray(np.full((300, 150, 3), 200, np.uint8)).save(tmp_path / "big.png")
    data = TestEmbeddings(np.zeros((3, 2), np.float32), np.arange(3, dtype=np.int64),
                          paths=np.array(["big.png", "missing.png", str(tmp_path / "big.png")]))
    loaded = load_images(data, np.array([0, 1, 2]), run_dir=tmp_path)
    assert loaded[1] is None  # a missing file is a blank tile, not a crash
    assert loaded[0].shape == (96, 48, 3) and loaded[2].shape == (96, 48, 3)  # shrunk to <= 96 px
    data.thumbnails = np.arange(3 * 4 * 4, dtype=np.uint8).reshape(3, 4, 4)
    np.testing.assert_array_equal(load_images(data, np.array([2]), None)[0], data.thumbnails[2])
