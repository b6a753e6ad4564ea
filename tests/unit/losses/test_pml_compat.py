"""PML code runs on dmlkit's losses: PML's constructor arguments, distances, reducers, regularizers,
miner tuples, reference sets and proxy attributes give the values and gradients PML gives."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning import distances as pml_distances
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners
from pytorch_metric_learning import reducers as pml_reducers
from pytorch_metric_learning import regularizers as pml_regularizers

import dmlkit.losses as dml_losses
from dmlkit.distances import CallableDistance, CosineSimilarity, LpDistance, as_distance
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.reducers import AvgNonZeroReducer, MeanReducer, SumReducer, ThresholdReducer
from dmlkit.losses.regularizers import LpRegularizer
from dmlkit.mining import MultiSimilarityMiner, TripletMarginMiner, selection_from_indices_tuple

DTYPES = [torch.float32, torch.float64]


def tolerances(dtype):
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-11}


def batch(dtype, n=24, dim=8, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, classes, (n,), generator=g)
    return x, y


def value_and_grad(loss, x, *args, **kwargs):
    x = x.clone().requires_grad_(True)
    value = loss(x, *args, **kwargs)
    (grad,) = torch.autograd.grad(value, x)
    return value.detach(), grad


def assert_same(ours, theirs, x, dtype, *args, **kwargs):
    va, ga = value_and_grad(ours, x, *args, **kwargs)
    vb, gb = value_and_grad(theirs, x, *args, **kwargs)
    torch.testing.assert_close(va, vb.to(va.dtype), **tolerances(dtype))
    torch.testing.assert_close(ga, gb, **tolerances(dtype))


# (name, PML constructor keywords) for the pair losses both libraries share.
PAIR_CASES = [
    ("ContrastiveLoss", {"pos_margin": 0.1, "neg_margin": 0.9, "distance": pml_distances.LpDistance(power=2)}),
    ("ContrastiveLoss", {"pos_margin": 0.7, "neg_margin": 0.3, "distance": pml_distances.CosineSimilarity()}),
    ("ContrastiveLoss", {"reducer": pml_reducers.MeanReducer()}),
    ("ContrastiveLoss", {"reducer": pml_reducers.SumReducer()}),
    ("TripletMarginLoss", {"margin": 0.2, "reducer": pml_reducers.MeanReducer()}),
    ("TripletMarginLoss", {"margin": 0.1, "distance": pml_distances.CosineSimilarity()}),
    ("TripletMarginLoss", {"margin": 0.1, "swap": True, "smooth_loss": True}),
    ("MarginLoss", {"margin": 0.1, "nu": 0.0, "beta": 1.0}),
    ("MultiSimilarityLoss", {"alpha": 2.0, "beta": 40.0, "base": 0.5}),
    ("LiftedStructureLoss", {"neg_margin": 0.5}),
    ("GeneralizedLiftedStructureLoss", {"neg_margin": 0.5, "pos_margin": 0.1}),
    ("NPairsLoss", {"embedding_regularizer": pml_regularizers.LpRegularizer(power=2)}),
    ("ContrastiveLoss", {"embedding_regularizer": pml_regularizers.LpRegularizer(), "embedding_reg_weight": 0.3}),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kwargs", PAIR_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(PAIR_CASES)])
def test_pair_loss_with_pml_arguments_matches_pml(name, kwargs, dtype):
    x, y = batch(dtype)
    if name == "NPairsLoss":
        y = torch.arange(x.shape[0]) // 2  # one anchor-positive pair per class
    assert_same(getattr(dml_losses, name)(**kwargs), getattr(pml_losses, name)(**kwargs), x, dtype, y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["ContrastiveLoss", "TripletMarginLoss", "MultiSimilarityLoss", "MarginLoss"])
def test_reference_set_matches_pml(name, dtype):
    x, y = batch(dtype, n=12)
    ref, ref_y = batch(dtype, n=10, seed=1)
    assert_same(getattr(dml_losses, name)(), getattr(pml_losses, name)(), x, dtype, y, ref_emb=ref, ref_labels=ref_y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "name, miner",
    [
        ("ContrastiveLoss", pml_miners.MultiSimilarityMiner(epsilon=0.2)),
        ("MultiSimilarityLoss", pml_miners.MultiSimilarityMiner(epsilon=0.2)),
        ("TripletMarginLoss", pml_miners.TripletMarginMiner(margin=0.3, type_of_triplets="semihard")),
        ("MarginLoss", pml_miners.TripletMarginMiner(margin=0.3, type_of_triplets="all")),
    ],
)
def test_indices_tuple_from_pml_miner_matches_pml(name, miner, dtype):
    x, y = batch(dtype, n=32)
    indices = miner(x, y)
    assert len(indices[0]) > 0
    assert_same(getattr(dml_losses, name)(), getattr(pml_losses, name)(), x, dtype, y, indices)


def test_indices_tuple_positional_and_keyword_agree_with_selection():
    x, y = batch(torch.float64)
    indices = pml_miners.MultiSimilarityMiner(epsilon=0.2)(x, y)
    loss = dml_losses.ContrastiveLoss()
    by_position = loss(x, y, indices)
    by_keyword = loss(x, y, indices_tuple=indices)
    by_selection = loss(x, y, pairs=selection_from_indices_tuple(indices, len(x), len(x)))
    assert by_position == by_keyword == by_selection


def test_bad_indices_tuple_names_the_problem():
    x, y = batch(torch.float64)
    with pytest.raises(DataError, match=r"indices_tuple must be a dmlkit miner's .*pairs=.* or PML's"):
        dml_losses.ContrastiveLoss()(x, y, (torch.tensor([0]), torch.tensor([1])))
    with pytest.raises(DataError, match="outside"):
        dml_losses.ContrastiveLoss()(x, y, (torch.tensor([0]), torch.tensor([99]), torch.tensor([0]), torch.tensor([1])))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dmlkit_miners_in_pml_style_feed_pml_losses(dtype):
    x, y = batch(dtype, n=32)
    pairs = MultiSimilarityMiner(epsilon=0.2).as_pml()(x, y)
    theirs = pml_miners.MultiSimilarityMiner(epsilon=0.2)(x, y)
    assert len(pairs) == 4 and all(t.dtype == torch.int64 for t in pairs)
    for ours_part, pml_part in zip((pairs[:2], pairs[2:]), (theirs[:2], theirs[2:])):
        assert set(zip(*(t.tolist() for t in ours_part))) == set(zip(*(t.tolist() for t in pml_part)))
    triplets = TripletMarginMiner(margin=0.3, type_of_triplets="semihard").as_pml()(x, y)
    pml_triplets = pml_miners.TripletMarginMiner(margin=0.3, type_of_triplets="semihard")(x, y)
    assert set(zip(*(t.tolist() for t in triplets))) == set(zip(*(t.tolist() for t in pml_triplets)))
    # and a PML loss accepts the tuple
    assert torch.isfinite(pml_losses.TripletMarginLoss()(x, y, triplets))
    # a dmlkit miner takes PML's distance objects as a PML loop passes them
    cosine = TripletMarginMiner(margin=0.2, distance=pml_distances.CosineSimilarity()).as_pml()(x, y)
    pml_cosine = pml_miners.TripletMarginMiner(margin=0.2, distance=pml_distances.CosineSimilarity())(x, y)
    assert set(zip(*(t.tolist() for t in cosine))) == set(zip(*(t.tolist() for t in pml_cosine)))


PROXY_CASES = [
    ("ProxyAnchorLoss", {"margin": 0.1, "alpha": 32}),
    ("ProxyNCALoss", {"softmax_scale": 3}),
    ("SoftTripleLoss", {"centers_per_class": 3, "la": 20, "gamma": 0.1, "margin": 0.01}),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kwargs", PROXY_CASES, ids=[c[0] for c in PROXY_CASES])
def test_proxy_loss_with_assigned_proxies_matches_pml(name, kwargs, dtype):
    x, y = batch(dtype, n=40, classes=6)
    ours = getattr(dml_losses, name)(6, x.shape[1], **kwargs)
    theirs = getattr(pml_losses, name)(6, x.shape[1], **kwargs)
    if name == "SoftTripleLoss":
        theirs.fc.data = theirs.fc.data.to(dtype)
        ours.fc = theirs.fc
        torch.testing.assert_close(ours.fc, theirs.fc)
    else:
        shared = torch.nn.Parameter(torch.randn(6, x.shape[1], dtype=dtype))
        ours.proxies = shared
        theirs.proxies = shared
        assert ours.proxies is shared  # assigned, not copied: an optimiser holding it trains the loss
    assert_same(ours, theirs, x, dtype, y)
    torch.testing.assert_close(ours.get_logits(x), theirs.get_logits(x), **tolerances(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_regularizers_match_pml(dtype):
    x, y = batch(dtype, n=40, classes=6)
    reg = pml_regularizers.SparseCentersRegularizer(6, 3)
    kwargs = {"centers_per_class": 3, "weight_regularizer": reg, "weight_reg_weight": 0.2}
    ours, theirs = dml_losses.SoftTripleLoss(6, 8, **kwargs), pml_losses.SoftTripleLoss(6, 8, **kwargs)
    theirs.fc.data = theirs.fc.data.to(dtype)
    ours.fc = theirs.fc
    assert_same(ours, theirs, x, dtype, y)
    plain = dml_losses.SoftTripleLoss(6, 8, centers_per_class=3)
    plain.fc = theirs.fc
    assert ours(x, y) > plain(x, y)  # the regularizer adds a positive term

    lp = {"weight_regularizer": pml_regularizers.LpRegularizer(), "weight_reg_weight": 0.5}
    ours, theirs = dml_losses.ProxyAnchorLoss(6, 8, **lp), pml_losses.ProxyAnchorLoss(6, 8, **lp)
    shared = torch.nn.Parameter(torch.randn(6, 8, dtype=dtype))
    ours.proxies = shared
    theirs.proxies = shared
    assert_same(ours, theirs, x, dtype, y)


def test_dmlkit_lp_regularizer_equals_pml_lp_regularizer():
    x = torch.randn(10, 6, dtype=torch.float64)
    for p, power in [(2, 1), (2, 2), (1, 1)]:
        torch.testing.assert_close(LpRegularizer(p=p, power=power)(x), pml_regularizers.LpRegularizer(p=p, power=power)(x))
    loss = dml_losses.MultiSimilarityLoss(embedding_regularizer=LpRegularizer(power=2), embedding_reg_weight=0.1)
    y = torch.arange(10) % 3
    expected = dml_losses.MultiSimilarityLoss()(x, y) + 0.1 * (x.norm(dim=1) ** 2).mean()
    torch.testing.assert_close(loss(x, y), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_threshold_reducer_matches_pml(dtype):
    x, y = batch(dtype)
    mean = dml_losses.LiftedStructureLoss(neg_margin=0.5)(x, y)
    # the per-pair terms of this batch spread around 8.5: each threshold drops some of them
    for low, high in ((8.5, None), (None, 9.0), (7.0, 9.5)):
        reducer = pml_reducers.ThresholdReducer(low=low, high=high)
        ours = dml_losses.LiftedStructureLoss(neg_margin=0.5, reducer=reducer)
        assert isinstance(ours.reducer, ThresholdReducer)
        assert_same(ours, pml_losses.LiftedStructureLoss(neg_margin=0.5, reducer=reducer), x, dtype, y)
        assert not torch.isclose(ours(x, y), mean)


def test_reducer_objects_and_names_are_one_spelling():
    terms = torch.tensor([0.0, 1.0, 2.0, 3.0])
    mask = torch.tensor([True, True, True, False])
    assert MeanReducer()(terms, mask) == 1.0
    assert AvgNonZeroReducer()(terms, mask) == 1.5
    assert SumReducer()(terms, mask) == 3.0
    assert ThresholdReducer(low=0.5, high=2.5)(terms, mask) == 1.5
    # the same rules from counts (the analytic losses' route): selected 3, non-zero 2
    assert (MeanReducer().divisor(3, 2), AvgNonZeroReducer().divisor(3, 2), SumReducer().divisor(3, 2)) == (3, 2, 1)
    with pytest.raises(TypeError, match="ThresholdReducer needs the terms"):
        ThresholdReducer(low=0.5).divisor(3, 2)
    assert dml_losses.ContrastiveLoss(reducer=pml_reducers.MeanReducer()).reduction == "mean"
    assert dml_losses.ContrastiveLoss(reduction="sum").reducer.for_sub_loss("neg_loss") == SumReducer()
    with pytest.raises(InvalidParameterError, match="'reduction' parameter of MultiSimilarityLoss must be one of"):
        dml_losses.MultiSimilarityLoss(reducer=pml_reducers.AvgNonZeroReducer())
    with pytest.raises(InvalidParameterError, match="'reduction' parameter of ContrastiveLoss"):
        dml_losses.ContrastiveLoss(reducer=object())


def test_pml_distances_keep_dmlkit_fast_paths():
    assert type(as_distance(pml_distances.CosineSimilarity())) is CosineSimilarity
    lp = as_distance(pml_distances.LpDistance(power=2))
    assert type(lp) is LpDistance and lp.power == 2 and lp.normalize_embeddings
    raw = as_distance(pml_distances.LpDistance(normalize_embeddings=False))
    assert type(raw) is LpDistance and not raw.normalize_embeddings
    assert type(as_distance(pml_distances.DotProductSimilarity(normalize_embeddings=False))).__name__ == "DotProductSimilarity"
    snr = as_distance(pml_distances.SNRDistance())
    assert type(snr).__name__ == "SNRDistance" and not snr.is_inverted

    class Own(pml_distances.BaseDistance):
        def compute_mat(self, query_emb, ref_emb):
            return query_emb @ ref_emb.T

    own = as_distance(Own(is_inverted=True))
    assert isinstance(own, CallableDistance) and own.is_inverted
    x, y = batch(torch.float64)
    assert_same(dml_losses.ContrastiveLoss(distance=pml_distances.SNRDistance()),
                pml_losses.ContrastiveLoss(distance=pml_distances.SNRDistance()), x, torch.float64, y)
    with pytest.raises(InvalidParameterError, match="'distance' parameter of ContrastiveLoss"):
        dml_losses.ContrastiveLoss(distance="cosine")
    with pytest.raises(InvalidParameterError, match="'distance' parameter of ProxyAnchorLoss must be CosineSimilarity"):
        dml_losses.ProxyAnchorLoss(4, 8, distance=pml_distances.LpDistance())


@pytest.mark.parametrize("name, kwargs", PROXY_CASES[:2] + [("ContrastiveLoss", {}), ("TripletMarginLoss", {})])
def test_fp16_inputs_give_the_fp32_value(name, kwargs):
    x, y = batch(torch.float32, n=32, classes=6)
    half = x.half()
    cls = getattr(dml_losses, name)
    ours = cls(6, 8, **kwargs) if "Proxy" in name else cls(**kwargs)
    value = ours(half.clone().requires_grad_(True), y)
    assert value.dtype == torch.float16 and torch.isfinite(value)  # PML's dtype, the fp32 value rounded once
    torch.testing.assert_close(value, ours(half.float(), y).half(), rtol=0, atol=0)


def test_assigning_badly_shaped_proxies_is_refused():
    loss = dml_losses.ProxyAnchorLoss(5, 8)
    with pytest.raises(DataError, match=r"ProxyAnchorLoss.proxies must be a float tensor of shape \[5, 8\]"):
        loss.proxies = torch.nn.Parameter(torch.randn(4, 8))
    loss.proxies = torch.randn(5, 8)  # a plain tensor is wrapped in a Parameter
    assert isinstance(loss.proxies, torch.nn.Parameter) and loss.proxies in set(loss.parameters())
