"""Index: build, add, query, remove, save/load, interrupted writes, model refusal, thresholds."""

import os

import numpy as np
import pytest
import torch

from dmlkit.exceptions import ConfigError, DataError, InvalidParameterError
from dmlkit.index import Index
from dmlkit.index.gallery import gallery_images


def _clustered(n=600, d=16, classes=12, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, d))
    labels = rng.integers(0, classes, n)
    x = centres[labels] + 0.3 * rng.normal(size=(n, d))
    return x.astype(np.float32), [f"c{v}" for v in labels]


def _exact(x, q, k):
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    s = qn.astype(np.float64) @ xn.T.astype(np.float64)
    return np.argsort(-s, axis=1, kind="stable")[:, :k], s


class FakeEmbedder:
    """Stands in for a RunEmbedder: a fixed linear map, with a fingerprint."""

    def __init__(self, fingerprint):
        self.fingerprint = fingerprint
        self.run_dir = None

    def embed(self, images):
        return torch.as_tensor(np.stack(images)).float()


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_query_returns_exact_neighbours_with_cosine_scores(kind):
    x, labels = _clustered()
    index = Index.from_embeddings(x, labels=labels, paths=[f"img{i}.png" for i in range(len(x))], kind=kind)
    q = x[:20]
    result = index.query_embeddings(q, k=5)
    truth, s = _exact(x, q, 5)
    assert (result.ids[:, 0] == np.arange(20)).all() and (result.distances[:, 0] < 1e-5).all()
    np.testing.assert_allclose(result.scores, np.take_along_axis(s, result.ids, 1), atol=1e-5)
    np.testing.assert_allclose(result.distances, 1 - result.scores, atol=1e-6)
    assert result.paths[3][0] == "img3.png" and result.labels[3][0] == labels[3]
    if kind == "flat":
        assert (result.ids == truth).all() and index.build_recall_at_10 is None
    else:  # approximate kinds measure their recall@10 against exact search at build time
        assert 0.9 <= index.build_recall_at_10 <= 1.0


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_add_gives_new_stable_ids_and_remove_never_reuses_them(kind, tmp_path):
    x, labels = _clustered()
    index = Index.from_embeddings(x[:500], labels=labels[:500], kind=kind)
    new = index.add_embeddings(x[500:], labels=labels[500:])
    assert new.tolist() == list(range(500, 600)) and len(index) == 600
    assert index.remove([3, 550, 10_000]) == 2 and len(index) == 598
    result = index.query_embeddings(x[[3, 550, 551]], k=3)
    assert 3 not in result.ids and 550 not in result.ids and result.ids[2, 0] == 551
    again = index.add_embeddings(x[:2])
    assert again.tolist() == [600, 601]  # removed ids are not reused
    index.save(tmp_path / "g.index")
    loaded = Index.load(tmp_path / "g.index")
    assert loaded.kind == kind and loaded.next_id == 602 and loaded.ids.tolist() == index.ids.tolist()
    assert loaded.labels == index.labels and loaded.paths == index.paths
    q = x[100:130]
    a, b = index.query_embeddings(q, k=7), loaded.query_embeddings(q, k=7)
    assert (a.ids == b.ids).all() and np.array_equal(a.scores, b.scores)


def test_hnsw_defaults_are_the_documented_ones(capsys):
    import faiss

    from dmlkit.cli.main import main
    from dmlkit.index import gallery

    assert (gallery.HNSW_M, gallery.HNSW_EF_CONSTRUCTION, gallery.HNSW_EF_SEARCH) == (20, 64, 256)
    index = Index.from_embeddings(_clustered(n=300)[0], kind="hnsw", measure_recall=False)
    assert {k: index.params[k] for k in ("hnsw_m", "ef_construction", "ef_search")} == \
        {"hnsw_m": 20, "ef_construction": 64, "ef_search": 256}
    hnsw = faiss.downcast_index(index.faiss_index.index).hnsw
    assert (hnsw.nb_neighbors(1), hnsw.efConstruction, hnsw.efSearch) == (20, 64, 256)
    doc = " ".join(Index.__doc__.split())
    assert "``hnsw_m`` (default 20), ``ef_construction`` (64) and ``ef_search`` (256)" in doc
    with pytest.raises(SystemExit):
        main(["index", "build", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "hnsw (M=20, efConstruction=64, efSearch=256)" in help_text


def test_hnsw_defaults_reach_recall_095_against_flat_on_clustered_vectors():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(100, 128)).astype(np.float32)
    x = centres[rng.integers(0, 100, 5000)] + 0.35 * rng.normal(size=(5000, 128)).astype(np.float32)
    q = centres[rng.integers(0, 100, 200)] + 0.35 * rng.normal(size=(200, 128)).astype(np.float32)
    flat = Index.from_embeddings(x).query_embeddings(q, k=10).ids
    hnsw = Index.from_embeddings(x, kind="hnsw").query_embeddings(q, k=10).ids
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(flat.tolist(), hnsw.tolist())])
    assert recall >= 0.95


def test_an_index_built_with_other_hnsw_parameters_loads_with_them(tmp_path):
    import faiss

    x, _ = _clustered()
    old = {"hnsw_m": 32, "ef_construction": 80, "ef_search": 128}  # the earlier defaults
    Index.from_embeddings(x, kind="hnsw", **old).save(tmp_path / "old.index")
    loaded = Index.load(tmp_path / "old.index")
    assert {k: loaded.params[k] for k in old} == old
    hnsw = faiss.downcast_index(loaded.faiss_index.index).hnsw
    assert (hnsw.nb_neighbors(1), hnsw.efConstruction, hnsw.efSearch) == (32, 80, 128)


def test_interrupted_save_leaves_the_previous_index_intact(tmp_path, monkeypatch):
    x, labels = _clustered()
    path = tmp_path / "g.index"
    index = Index.from_embeddings(x[:300], labels=labels[:300])
    index.save(path)
    before = path.read_bytes()
    index.add_embeddings(x[300:])

    def fail(fd):  # the temp file is written; the failure comes before the rename
        raise OSError("disk full (injected)")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="injected"):
        index.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["g.index"]  # no temp file left behind
    loaded = Index.load(path)
    assert len(loaded) == 300 and loaded.next_id == 300


def test_queries_from_another_model_are_refused():
    x, labels = _clustered(n=50)
    model = FakeEmbedder({"config": "a", "weights": "1"})
    index = Index.build(model, list(x), labels=labels)
    assert index.fingerprint == {"config": "a", "weights": "1"}
    assert index.query(model, list(x[:2]), k=1).ids[:, 0].tolist() == [0, 1]
    with pytest.raises(ConfigError, match="does not match the index"):
        index.query(FakeEmbedder({"config": "a", "weights": "2"}), list(x[:2]))
    with pytest.raises(ConfigError, match="does not match the index"):
        index.add(FakeEmbedder({"config": "b", "weights": "1"}), list(x[:2]))
    assert len(index) == 50


def test_threshold_at_fmr_marks_matches():
    from dmlkit.evaluation.verification import threshold_at_fmr

    x, labels = _clustered(n=200)
    index = Index.from_embeddings(x, labels=labels)
    t = index.set_threshold_at_fmr(1e-2)
    codes = torch.tensor([int(v[1:]) for v in labels])
    assert t == pytest.approx(threshold_at_fmr(torch.from_numpy(index.vectors()), codes, 1e-2), abs=1e-6)
    result = index.query_embeddings(x[:10], k=20)
    assert (result.match == (result.scores >= t)).all() and result.match[:, 0].all()
    records = result.records([f"q{i}" for i in range(10)])
    assert records[0]["query"] == "q0" and records[0]["neighbours"][0]["match"] is True
    unlabelled = Index.from_embeddings(x)
    with pytest.raises(DataError, match="needs every gallery item labelled"):
        unlabelled.set_threshold_at_fmr(1e-3)


def test_rerank_options_run_and_keep_self_first_without_k_reciprocal():
    x, labels = _clustered(n=120)
    index = Index.from_embeddings(x, labels=labels)
    plain = index.query_embeddings(x[:5], k=4)
    expanded = index.query_embeddings(x[:5], k=4, query_expansion=1)  # QE with the query's own twin: same ranking
    assert (expanded.ids == plain.ids).all()
    reranked = index.query_embeddings(x[:5], k=4, k_reciprocal=True, database_augmentation=2)
    assert reranked.ids.shape == (5, 4) and (np.diff(reranked.distances, axis=1) >= 0).all()


def test_bad_input_is_named(tmp_path):
    with pytest.raises(InvalidParameterError, match="'kind'"):
        Index(8, "lsh")
    index = Index.from_embeddings(np.eye(4, dtype=np.float32))
    with pytest.raises(DataError, match="size 3 but the index holds size 4"):
        index.query_embeddings(np.ones((1, 3), np.float32))
    with pytest.raises(InvalidParameterError, match="'k'"):
        index.query_embeddings(np.ones((1, 4), np.float32), k=0)
    (tmp_path / "junk.index").write_bytes(b"not an index")
    with pytest.raises(DataError, match="not a readable .npz"):
        Index.load(tmp_path / "junk.index")
    with pytest.raises(DataError, match="does not exist"):
        Index.load(tmp_path / "missing.index")


def test_gallery_images_reads_folders_and_csv(tmp_path):
    from PIL import Image

    for rel in ("a/1.png", "a/2.png", "b/x/3.png", "4.png"):
        (tmp_path / "g" / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("L", (4, 4)).save(tmp_path / "g" / rel)
    paths, labels = gallery_images(tmp_path / "g")
    assert [os.path.relpath(p, tmp_path / "g") for p in paths] == ["4.png", "a/1.png", "a/2.png", "b/x/3.png"]
    assert labels == [None, "a", "a", "b/x"]
    (tmp_path / "g" / "list.csv").write_text("path,label\na/1.png,cat\n4.png,\n")
    paths, labels = gallery_images(tmp_path / "g" / "list.csv")
    assert paths == [str(tmp_path / "g" / "a/1.png"), str(tmp_path / "g" / "4.png")] and labels == ["cat", None]


def test_a_run_without_eval_input_embeds_its_splits_but_not_new_images(tmp_path):
    from dmlkit.config import load_config
    from dmlkit.inference import RunEmbedder
    from dmlkit.models import create_model

    cfg = load_config(overrides=["model.args={width: 8}"])
    model = create_model("small_cnn", embedding_size=8)
    embedder = RunEmbedder(model, cfg, None, fingerprint={"config": "x", "weights": "y"})
    assert embedder.input_size == tuple(model.pretrained_cfg["input_size"])  # the nominal size, as before
    with pytest.raises(ConfigError, match="does not record the run's evaluation preprocessing"):
        embedder.embed(torch.zeros(1, 1, 28, 28))


def test_the_run_embedder_makes_its_inference_copy_once_and_embeds_as_the_model(monkeypatch):
    import dmlkit.models.inference_copy as ic
    from dmlkit.config import load_config
    from dmlkit.inference import RunEmbedder
    from dmlkit.models import create_model

    cfg = load_config(overrides=["model.args={width: 8}"])
    torch.manual_seed(0)
    model = create_model("small_cnn", embedding_size=8)
    embedder = RunEmbedder(model, cfg, None, fingerprint={"config": "x", "weights": "y"})
    made = []
    real = ic.inference_copy
    monkeypatch.setattr(ic, "inference_copy", lambda *a, **kw: made.append(1) or real(*a, **kw))
    images = torch.rand(5, 1, 28, 28)
    split = torch.utils.data.TensorDataset(images, torch.arange(5))
    first = embedder.embed_dataset(split)[0]
    for i in range(5):  # one query at a time, as a search service asks
        one = embedder.embed_dataset(torch.utils.data.TensorDataset(images[i:i + 1], torch.zeros(1)))[0]
        torch.testing.assert_close(one[0], first[i], rtol=1e-5, atol=1e-6)
    assert made == [1]
    with torch.no_grad():
        torch.testing.assert_close(first, model.eval()(images), rtol=1e-5, atol=1e-6)
