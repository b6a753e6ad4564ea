"""Index.classify: a hand-computed distance-weighted vote, its confidence, and unknown queries rejected."""

import math

import numpy as np
import pytest

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.index import Index
from dmlkit.index.classify import DISTANCE_EPS

# unit vectors at these angles (radians) and labels; a query at angle 0 has cosine score cos(angle)
GALLERY = [(0.2, "cat"), (-0.5, "dog"), (0.6, "dog"), (2.0, "cat")]


def unit(angle):
    return [math.cos(angle), math.sin(angle)]


def gallery_index():
    return Index.from_embeddings(np.array([unit(a) for a, _ in GALLERY], dtype=np.float32),
                                 labels=[label for _, label in GALLERY])


def test_hand_computed_vote_weights_the_nearer_neighbour_more():
    result = gallery_index().classify_embeddings(np.array([unit(0.0)], dtype=np.float32), k=3)
    # neighbours: cat at 0.2, dog at -0.5, dog at 0.6; weight 1 / (1 - cos(angle) + eps)
    weight = {a: 1 / (1 - math.cos(a) + DISTANCE_EPS) for a in (0.2, -0.5, 0.6)}
    cat, dog = weight[0.2], weight[-0.5] + weight[0.6]
    assert cat > dog  # a plain majority would say dog
    assert result.labels == ["cat"]
    assert result.confidence[0] == pytest.approx(cat / (cat + dog), rel=1e-4)
    assert result.nearest_score[0] == pytest.approx(math.cos(0.2), rel=1e-5)
    assert result.threshold is None and not result.unknown.any()


def test_queries_below_the_threshold_are_unknown_and_only_matches_vote():
    queries = np.array([unit(0.0), unit(math.pi)], dtype=np.float32)  # the second is far from everything
    result = gallery_index().classify_embeddings(queries, k=3, threshold=0.9)
    assert result.labels == ["cat", None]  # only cat at 0.2 (score 0.98) reaches 0.9
    assert result.confidence.tolist() == [pytest.approx(1.0), 0.0]
    assert result.unknown.tolist() == [False, True]
    assert result.records(["a.png", "b.png"])[1] == {
        "query": "b.png", "label": None, "unknown": True, "confidence": 0.0,
        "nearest_score": pytest.approx(math.cos(math.pi - 2.0), rel=1e-5), "nearest_unlabelled": False}


def test_threshold_at_fmr_rejects_queries_of_classes_the_gallery_lacks():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(16, 32))

    def draw(classes, per_class):
        labels = np.repeat(classes, per_class)
        return (centres[labels] + 0.25 * rng.normal(size=(len(labels), 32))).astype(np.float32), labels

    gallery, gallery_labels = draw(np.arange(8), 10)
    known, known_labels = draw(np.arange(8), 10)
    unknown, _ = draw(np.arange(8, 16), 10)
    index = Index.from_embeddings(gallery, labels=[f"c{v}" for v in gallery_labels])
    result = index.classify_embeddings(np.concatenate([known, unknown]), k=5, fmr=1e-3)
    assert result.threshold == pytest.approx(index.threshold_at_fmr(1e-3))
    assert index.threshold is None  # fmr= does not change the index
    accepted = ~result.unknown[:80]
    correct = np.array(result.labels[:80], dtype=object)[accepted] == np.array([f"c{v}" for v in known_labels])[accepted]
    assert accepted.mean() > 0.9 and correct.mean() > 0.95
    assert result.unknown[80:].mean() >= 0.85  # each of 80 gallery items matches an impostor at rate 1e-3
    index.set_threshold_at_fmr(1e-3)  # the index's own threshold is the default
    assert index.classify_embeddings(unknown, k=5).labels == index.classify_embeddings(unknown, k=5, fmr=1e-3).labels


def test_bad_arguments_and_unlabelled_galleries_are_refused():
    index = gallery_index()
    q = np.array([unit(0.0)], dtype=np.float32)
    with pytest.raises(InvalidParameterError, match="either 'fmr' or 'threshold'"):
        index.classify_embeddings(q, fmr=0.01, threshold=0.5)
    with pytest.raises(InvalidParameterError, match="'k' parameter of Index.classify"):
        index.classify_embeddings(q, k=0)
    unlabelled = Index.from_embeddings(np.array([unit(0.0), unit(1.0)], dtype=np.float32), labels=[None, None])
    with pytest.raises(DataError, match="classifying needs a gallery item labelled"):
        unlabelled.classify_embeddings(q)


def test_unlabelled_gallery_items_do_not_vote():
    index = gallery_index()
    index.add_embeddings(np.array([unit(0.01)], dtype=np.float32))  # nearest to the query, but unlabelled
    result = index.classify_embeddings(np.array([unit(0.0)], dtype=np.float32), k=2)
    assert result.labels == ["cat"] and result.confidence[0] == pytest.approx(1.0)
    assert result.nearest_score[0] == pytest.approx(math.cos(0.01), rel=1e-5)
    with pytest.raises(DataError, match="needs every gallery item labelled"):
        index.classify_embeddings(np.array([unit(0.0)], dtype=np.float32), fmr=0.1)


def test_an_unlabelled_nearest_item_is_reported_as_such_not_as_unknown():
    vectors = np.array([unit(0.0), unit(0.3), unit(2.5)], dtype=np.float32)
    index = Index.from_embeddings(vectors, labels=[None, "cat", "dog"])
    queries = np.array([unit(0.0), unit(0.0), unit(math.pi)], dtype=np.float32)
    alone = index.classify_embeddings(queries[:1], k=1)  # only the unlabelled item is looked at
    assert alone.labels == [None] and alone.nearest_unlabelled.tolist() == [True] and not alone.unknown.any()
    assert alone.nearest_score[0] == pytest.approx(1.0)
    voted = index.classify_embeddings(queries, k=2, threshold=0.9)
    assert voted.labels == ["cat", "cat", None]  # the labelled neighbour votes; the far query is unknown
    assert voted.nearest_unlabelled.tolist() == [True, True, False] and voted.unknown.tolist() == [False, False, True]
    records = voted.records(["a", "b", "c"])
    assert records[0]["nearest_unlabelled"] is True and records[2]["unknown"] is True
