"""PML's ``utils.inference`` classes under dmlkit (``FaissKNN``, ``CustomKNN``, ``FaissKMeans``, ``MatchFinder``,
``InferenceModel``): PML's names, arguments and results, compared with PML's own classes on the same inputs."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity as PMLCosine
from pytorch_metric_learning.distances import LpDistance as PMLLp
from pytorch_metric_learning.utils import inference as pml
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator as PMLAccuracyCalculator

from dmlkit.distances import CosineSimilarity, LpDistance
from dmlkit.evaluation import AccuracyCalculator
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.inference import CustomKNN, FaissKMeans, FaissKNN, InferenceModel, MatchFinder


def blobs(n: int = 120, dim: int = 16, classes: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g) * 3
    labels = torch.arange(n) % classes
    return centres[labels] + torch.randn(n, dim, generator=g), labels


def test_the_names_are_dmlkits_own_and_reachable_from_the_index_room():
    import dmlkit.index as index

    for cls in (CustomKNN, FaissKMeans, FaissKNN, InferenceModel, MatchFinder):
        assert getattr(index, cls.__name__) is cls and cls.__module__.startswith("dmlkit.index.")


@pytest.mark.parametrize("ref_includes_query", [False, True])
def test_faiss_knn_returns_pmls_distances_and_indices(ref_includes_query):
    x, _ = blobs()
    query = x[:50]
    reference = x if ref_includes_query else x[50:]
    ours = FaissKNN()(query, 7, reference, ref_includes_query)
    theirs = pml.FaissKNN()(query, 7, reference, ref_includes_query)
    assert torch.equal(ours[1], theirs[1])
    torch.testing.assert_close(ours[0], theirs[0])
    squared = torch.cdist(query.double(), reference.double()) ** 2  # IndexFlatL2 reports squared L2
    torch.testing.assert_close(ours[0].double(), squared.gather(1, ours[1]), rtol=1e-4, atol=1e-3)
    if ref_includes_query:
        assert not (ours[1] == torch.arange(50)[:, None]).any()


def test_faiss_knn_drops_the_last_neighbour_of_a_query_not_found_among_its_own():
    """Duplicated rows: a query may not see its own index among k + 1; PML then drops the last column."""
    x = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [5.0, 5.0]])
    ours = FaissKNN()(x[:2], 1, x, True)
    theirs = pml.FaissKNN()(x[:2], 1, x, True)
    assert torch.equal(ours[1], theirs[1]) and ours[1].shape == (2, 1)


@pytest.mark.parametrize("batch_size", [None, 16])
@pytest.mark.parametrize("distance", ["cosine", "lp"])
@pytest.mark.parametrize("ref_includes_query", [False, True])
def test_custom_knn_equals_pmls(batch_size, distance, ref_includes_query):
    x, _ = blobs(seed=1)
    query = x[:40]
    reference = x if ref_includes_query else x[40:]
    ours_d, theirs_d = (CosineSimilarity(), PMLCosine()) if distance == "cosine" else (LpDistance(), PMLLp())
    ours = CustomKNN(ours_d, batch_size=batch_size)(query, 5, reference, ref_includes_query)
    theirs = pml.CustomKNN(theirs_d, batch_size=batch_size)(query, 5, reference, ref_includes_query)
    assert torch.equal(ours[1], theirs[1])
    torch.testing.assert_close(ours[0], theirs[0])


def test_the_calculator_with_pml_style_knn_funcs_gives_pmls_numbers():
    x, labels = blobs(seed=2)
    include = ("precision_at_1", "r_precision", "mean_average_precision_at_r")
    for ours_knn, theirs_knn in ((CustomKNN(CosineSimilarity()), pml.CustomKNN(PMLCosine())),
                                 (FaissKNN(), pml.FaissKNN())):
        ours = AccuracyCalculator(include=include, knn_func=ours_knn).get_accuracy(x, labels)
        theirs = PMLAccuracyCalculator(include=include, knn_func=theirs_knn, device=torch.device("cpu")).get_accuracy(
            x, labels)
        assert ours == pytest.approx(theirs, abs=1e-9)


def test_faiss_kmeans_equals_pmls_for_the_same_seed_and_follows_the_device():
    x, labels = blobs(seed=3)
    ours = FaissKMeans(niter=20, seed=7)(x, 6)
    theirs = pml.FaissKMeans(niter=20, seed=7)(x, 6)
    assert ours.dtype == torch.int64 and torch.equal(ours, theirs.long())
    with pytest.raises(DataError, match="nmb_clusters=200"):
        FaissKMeans()(x, 200)


def test_match_finder_equals_pmls_and_asks_for_a_threshold():
    x, _ = blobs(n=20, seed=4)
    x = torch.nn.functional.normalize(x, dim=1)
    ours, theirs = MatchFinder(CosineSimilarity(), 0.5), pml.MatchFinder(PMLCosine(), 0.5)
    assert (ours.get_matching_pairs(x) == theirs.get_matching_pairs(x)).all()
    assert ours.get_matching_pairs(x[:5], x[5:], return_tuples=True) == theirs.get_matching_pairs(
        x[:5], x[5:], return_tuples=True)
    assert (ours.is_match(x[:10], x[10:]) == theirs.is_match(x[:10], x[10:])).all()
    assert ours.is_match(x[:1], x[:1]) is True
    lp = MatchFinder(LpDistance(normalize_embeddings=False), threshold=1.0)
    assert lp.is_match(torch.zeros(1, 2), torch.tensor([[0.6, 0.0]])) is True
    with pytest.raises(InvalidParameterError, match="threshold"):
        MatchFinder(CosineSimilarity()).is_match(x[:2], x[2:4])


class Images(torch.utils.data.Dataset):
    def __init__(self, x, labels):
        self.x, self.labels = x, labels

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.labels[i]


def test_inference_model_trains_searches_matches_and_round_trips_its_index_like_pmls(tmp_path):
    x, labels = blobs(n=90, dim=12, seed=5)
    torch.manual_seed(0)
    trunk = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    ours = InferenceModel(trunk, data_device="cpu")
    theirs = pml.InferenceModel(trunk, data_device=torch.device("cpu"))
    ours.train_knn(Images(x[:60], labels[:60]), batch_size=16)  # a Dataset of (input, label)
    theirs.train_knn(Images(x[:60], labels[:60]), batch_size=16)
    ours.add_to_knn(list(x[60:80]))  # a list of tensors
    theirs.add_to_knn(list(x[60:80]))
    d_ours, i_ours = ours.get_nearest_neighbors(x[80:], k=5)
    d_theirs, i_theirs = theirs.get_nearest_neighbors(x[80:], k=5)
    assert torch.equal(i_ours, i_theirs) and i_ours.max() >= 60  # the added inputs are searched too
    torch.testing.assert_close(d_ours, d_theirs)
    assert (ours.get_matches(x[:10]) == theirs.get_matches(x[:10])).all()
    assert (ours.is_match(x[:4], x[4:8]) == theirs.is_match(x[:4], x[4:8])).all()
    emb = ours.get_embeddings(x[:3])
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(3))

    path = tmp_path / "knn.index"
    ours.save_knn_func(str(path))
    fresh = InferenceModel(trunk, data_device="cpu")
    fresh.load_knn_func(str(path))
    assert torch.equal(fresh.get_nearest_neighbors(x[80:], k=5)[1], i_ours)
    assert [p.name for p in tmp_path.iterdir()] == ["knn.index"]  # the write left no temporary file


def test_mistakes_name_the_thing_at_fault(tmp_path):
    x, _ = blobs(n=10, dim=4)
    with pytest.raises(DataError, match="train"):
        FaissKNN(reset_before=False)(x, 2)
    with pytest.raises(DataError, match="k=20"):
        FaissKNN()(x, 20, x)
    with pytest.raises(InvalidParameterError, match="k"):
        CustomKNN(LpDistance())(x, 0, x)
    with pytest.raises(TypeError, match="gpus"):
        FaissKNN(gpus=0)
    with pytest.raises(TypeError, match="Dataset"):
        InferenceModel(torch.nn.Identity(), data_device="cpu").train_knn({"not": "inputs"})
    bad = tmp_path / "not.index"
    bad.write_bytes(b"not a faiss index")
    with pytest.raises(DataError, match="not a faiss index"):
        FaissKNN().load(bad)
    assert bad.read_bytes() == b"not a faiss index"
    with pytest.raises(FileNotFoundError, match="missing.index"):
        FaissKNN().load(tmp_path / "missing.index")
