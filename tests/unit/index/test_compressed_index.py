"""The compressed index kind: IVF-PQ codes in memory, float vectors memory-mapped on disk, exact re-rank."""

import numpy as np
import pytest

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.index import Index, compressed
from dmlkit.index.compressed import default_code_size, exact_top_k, vectors_path


def _clustered(n=3000, d=32, centres=60, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centres, d))
    x = c[rng.integers(0, centres, n)] + 0.35 * rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _exact_ids(x, q, k):
    s = q.astype(np.float64) @ x.T.astype(np.float64)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def _recall(found, truth):
    return np.mean([len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist())]) / truth.shape[1]


@pytest.fixture(scope="module")
def gallery():
    x = _clustered()
    return x, Index.from_embeddings(x[:2800], kind="compressed", labels=[f"c{i % 7}" for i in range(2800)])


def test_re_rank_recovers_exact_neighbours_that_the_codes_alone_miss(gallery):
    x, index = gallery
    q = _clustered(n=200, seed=1)  # held out, from the same centres
    truth = _exact_ids(x[:2800], q, 10)
    _, raw = index.faiss_index.search(q, 10)  # PQ order, before re-rank
    result = index.query_embeddings(q, k=10)
    assert _recall(result.ids, truth) >= 0.95 > _recall(raw, truth)
    scores = np.take_along_axis(q @ x[:2800].T, result.ids, 1)  # re-ranked scores are exact cosines
    np.testing.assert_allclose(result.scores, scores, atol=1e-5)
    assert (np.diff(result.scores, axis=1) <= 1e-7).all() and index.build_recall_at_10 >= 0.95


def test_header_records_the_parameters_chosen_from_the_gallery(gallery, tmp_path, monkeypatch):
    _, index = gallery
    p = index.params
    assert p["nlist"] == 53 and p["nprobe"] == 32 and p["code_size"] == default_code_size(32) == 8
    assert p["pq_bits"] == 6 and p["opq"] is False and p["shortlist"] == 100
    assert index.training["factory"] == "IVF53,PQ8x6np"
    index.save(tmp_path / "g.index")
    loaded = Index.load(tmp_path / "g.index")
    assert loaded.params == p and loaded.header()["training"]["factory"] == "IVF53,PQ8x6np"
    monkeypatch.setattr(compressed, "OPQ_ITERATIONS", 2)  # a rotation, not a good one: the test checks the wiring
    forced = Index.from_embeddings(_clustered(n=1000), kind="compressed", nlist=10, nprobe=3, code_size=16,
                                   pq_bits=4, opq=True, shortlist=40, measure_recall=False)
    assert {k: forced.params[k] for k in ("nlist", "nprobe", "code_size", "pq_bits", "opq", "shortlist")} == {
        "nlist": 10, "nprobe": 3, "code_size": 16, "pq_bits": 4, "opq": True, "shortlist": 40}
    assert forced.training["factory"] == "OPQ16,IVF10,PQ16x4np"


def test_floats_stay_on_disk_memory_mapped(gallery, tmp_path):
    x, index = gallery
    index.save(tmp_path / "g.index")
    loaded = Index.load(tmp_path / "g.index")
    assert isinstance(loaded.store.array, np.memmap) and loaded.store.path == vectors_path(tmp_path / "g.index")
    assert vectors_path(tmp_path / "g.index").stat().st_size == 2800 * 32 * 4
    np.testing.assert_allclose(np.asarray(loaded.store.array), x[:2800], atol=1e-6)
    # what the index holds in memory is codes (8 sub-quantisers x 6 bits = 6 bytes a vector), not 128 bytes of floats
    assert loaded.faiss_index.code_size == 6


def test_save_load_add_remove_keep_ids_and_results(gallery, tmp_path):
    x, _ = gallery
    index = Index.from_embeddings(x[:2800], kind="compressed", measure_recall=False)
    path = tmp_path / "g.index"
    index.save(path)
    loaded = Index.load(path)
    q = x[2800:2850]
    np.testing.assert_array_equal(loaded.query_embeddings(q, 5).ids, index.query_embeddings(q, 5).ids)
    new = loaded.add_embeddings(x[2800:])
    assert new.tolist() == list(range(2800, 3000))
    assert (loaded.query_embeddings(x[2800:2810], 1).ids[:, 0] == np.arange(2800, 2810)).all()
    assert loaded.remove([2800, 5, 123456]) == 2
    loaded.save(path)
    again = Index.load(path)
    assert len(again) == 2998 and again.next_id == 3000
    top = again.query_embeddings(x[[2800, 5]], 3).ids
    assert 2800 not in top[0] and 5 not in top[1]
    assert again.add_embeddings(x[:1]).tolist() == [3000]  # removed ids are never reused; row 3000 = id 3000
    np.testing.assert_allclose(again.store.rows_of(np.array([3000])), x[:1], atol=1e-6)


def test_an_add_interrupted_before_save_leaves_the_saved_index_readable(gallery, tmp_path):
    x, _ = gallery
    path = tmp_path / "g.index"
    Index.from_embeddings(x[:2800], kind="compressed", measure_recall=False).save(path)
    loaded = Index.load(path)
    loaded.add_embeddings(x[2800:])  # rows appended to the file beside the index, never saved
    old = Index.load(path)
    assert len(old) == 2800 and old.store.rows == 2800
    assert old.add_embeddings(x[2900:2901]).tolist() == [2800]  # the unsaved rows are cut off first
    np.testing.assert_allclose(old.store.rows_of(np.array([2800])), x[2900:2901], atol=1e-6)


def test_exact_top_k_in_chunks_matches_brute_force():
    x, q = _clustered(n=1000), _clustered(n=30, seed=2)
    scores, rows = exact_top_k(q, x, 10, chunk=128)
    np.testing.assert_array_equal(rows, _exact_ids(x, q, 10))
    _, some = exact_top_k(q, x, 5, ids=np.arange(0, 1000, 2), chunk=100)
    np.testing.assert_array_equal(some, np.arange(0, 1000, 2)[_exact_ids(x[::2], q, 5)])


@pytest.mark.parametrize("options, match", [
    ({"code_size": 7}, "'code_size' parameter of Index must divide the embedding size 32"),
    ({"code_size": 0}, "'code_size' parameter of Index must be an int in the range"),
    ({"pq_bits": 12}, "'pq_bits' parameter of Index must be an int in the range"),
    ({"opq": "yes"}, "'opq' parameter of Index must be"),
    ({"shortlist": 0}, "'shortlist' parameter of Index must be an int >= 1"),
])
def test_bad_parameters_are_rejected_up_front(options, match):
    with pytest.raises(InvalidParameterError, match=match):
        Index(32, "compressed", **options)


def test_bad_parameters_found_at_the_first_add_are_rejected_before_anything_is_stored():
    x = _clustered(n=400)
    with pytest.raises(InvalidParameterError, match="'nprobe' parameter of Index must be at most nlist=10"):
        Index.from_embeddings(x, kind="compressed", nlist=10, nprobe=11)
    with pytest.raises(InvalidParameterError, match=r"'nlist' parameter of Index must be at most the number of vectors of the first add \(400\)"):
        Index.from_embeddings(x, kind="compressed", nlist=500)
    with pytest.raises(DataError, match="needs at least 32 .* use kind 'flat'"):
        Index.from_embeddings(x[:31], kind="compressed")
    with pytest.raises(DataError, match=r"cannot train on 40 vectors"):  # 256 centroids per sub-quantiser
        Index.from_embeddings(x[:40], kind="compressed", pq_bits=8)
    with pytest.raises(InvalidParameterError, match="apply to kind 'compressed' only"):
        Index(32, "ivf", code_size=8)
    bad = x.copy()
    bad[300, 0] = np.nan
    index = Index(32, "compressed")
    with pytest.raises(DataError, match="NaN"):
        index.add_embeddings(bad)
    assert len(index) == 0 and index.store is None


def test_a_missing_vectors_file_is_named(gallery, tmp_path):
    _, index = gallery
    index.save(tmp_path / "g.index")
    vectors_path(tmp_path / "g.index").unlink()
    with pytest.raises(DataError, match=r"g\.index\.vectors.*does not exist"):
        Index.load(tmp_path / "g.index")
