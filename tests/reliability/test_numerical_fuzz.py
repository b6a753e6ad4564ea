"""Fuzz every registered loss and miner: extreme scales, duplicate and zero embeddings, extreme
margins/temperatures, fp16/bf16/fp32/fp64 inputs. These inputs are valid: outputs are finite and
nothing raises. Invalid inputs, one class at a time (:data:`INVALID_INPUTS`), raise the one exception
type documented for that class, for every loss and miner.

fp16 is the one exception the hardware imposes: the loss is computed in fp32 and returned in the
embeddings' dtype (PML's contract), and a loss or gradient larger than fp16's maximum (65504) becomes
inf when cast back to fp16 (the input, the loss, or proxies that took the batch's dtype); the test
checks that this happens only when the fp32 value of the same input really is that large (the
trainer hands losses fp32 embeddings, and its finite checks stop or skip such a step with a clear message).
"""

from __future__ import annotations

import copy
import inspect
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses import LOSSES, create_loss
from dmlkit.mining import MINERS, PairSelection, TripletSelection, create_miner

NUM_CLASSES, PER_CLASS, DIM = 4, 2, 4
BATCH = NUM_CLASSES * PER_CLASS
FP16_MAX = float(torch.finfo(torch.float16).max)

#: Extreme constructor arguments per loss (huge and tiny margins, scales, temperatures).
LOSS_VARIANTS: dict[str, list[dict]] = {
    "arcface": [{}, dict(margin=179.0, scale=1e4, chunk_size=3), dict(margin=0.0, scale=1e-6, monotonic=False)],
    "binomial_deviance": [{}, dict(alpha=1e3, beta=1e3, base=0.0), dict(alpha=1e-6, beta=1e-6)],
    "cosface": [{}, dict(margin=10.0, scale=1e4, sample_rate=0.5), dict(margin=0.0, scale=1e-6)],
    "large_margin_softmax": [{}, dict(margin=9, scale=1e3), dict(margin=1, scale=1e-6)],
    "normalized_softmax": [{}, dict(temperature=1e-6, chunk_size=1), dict(temperature=1e6)],
    "p2sgrad": [{}, dict(paper_gradient=True)],
    "sphereface": [{}, dict(margin=9, scale=1e3), dict(margin=1, scale=1e-6)],
    "subcenter_arcface": [dict(sub_centers=2), dict(sub_centers=2, margin=90.0, scale=1e4, chunk_size=1)],
    "contrastive": [{}, dict(pos_margin=0.0, neg_margin=1e6), dict(pos_margin=1e-9, neg_margin=1e-9)],
    "dro": [dict(weighting="top_k", k=4), dict(weighting="top_k_pn", k_pos=2, k_neg=2),
            dict(weighting="kl", gamma=1e-4), dict(weighting="kl", gamma=1e4),
            dict(weighting="kl_grouped", gamma_pos=1e-4, gamma_neg=1e4)],
    "dro_kl_g": [{}, dict(gamma_pos=1e-4, gamma_neg=1e-4), dict(gamma_pos=1e4, gamma_neg=1e4)],
    "generalized_lifted_structure": [{}, dict(neg_margin=1e6), dict(neg_margin=1e-9)],
    "lifted_structure": [{}, dict(neg_margin=1e6), dict(neg_margin=1e-9)],
    "margin": [{}, dict(margin=1e6, beta=1e6), dict(margin=1e-9, beta=0.0)],
    "multi_similarity": [{}, dict(alpha=1e3, beta=1e3), dict(alpha=1e-6, beta=1e-6)],
    "npairs": [{}],
    "proxy_anchor": [{}, dict(alpha=1e4, margin=10.0), dict(alpha=1e-6, margin=1e-9)],
    "proxy_nca": [{}, dict(softmax_scale=1e4), dict(softmax_scale=1e-6)],
    "proxy_nca_plus_plus": [{}, dict(temperature=1e-6), dict(temperature=1e4)],
    "proxy_pair": [dict(pair_loss="contrastive"), dict(pair_loss="multi_similarity")],
    "proxy_triplet": [{}, dict(margin=1e6), dict(margin=1e-9)],
    "soft_triple": [dict(centers_per_class=2), dict(centers_per_class=2, la=1e4, gamma=1e-6, margin=10.0),
                    dict(centers_per_class=2, la=1e-6, gamma=1e4)],
    "triplet_margin": [{}, dict(margin=1e6, smooth_loss=True), dict(margin=1e-9, swap=True)],
    # contrastive, circle, ranked-list and ranking losses
    "ntxent": [{}, dict(temperature=1e-6), dict(temperature=1e4)],
    "supcon": [{}, dict(temperature=1e-6), dict(temperature=1e4)],
    "circle": [{}, dict(m=0.25, gamma=1e4), dict(m=1e-9, gamma=1e-6)],
    "ranked_list": [dict(margin=0.4, Tn=10), dict(margin=1e6, Tn=5, Tp=5), dict(margin=1e-9, Tn=1e-6, imbalance=0.0)],
    "fastap": [{}, dict(num_bins=1), dict(num_bins=1000)],
    "smooth_ap": [{}, dict(temperature=1e-6), dict(temperature=1e4, query_in_ranking=False)],
    "pnp": [{}, dict(variant="Dq", anneal=1e-6), dict(variant="Ib", b=1e4, anneal=1e4), dict(variant="Iu")],
    "histogram": [{}, dict(n_bins=1), dict(n_bins=1000)],
    "angular": [{}, dict(alpha=89.9, normalize_negatives=True), dict(alpha=1e-6)],
    "tuplet_margin": [{}, dict(margin=90.0, scale=1e4), dict(margin=0.0, scale=1e-6)],
    "tcm": [{}, dict(lambda_plus=1e6, lambda_minus=0.0, margin_plus=1.0, margin_minus=-1.0)],
    "threshold_consistent_margin": [{}],
    "intra_pair_variance": [{}, dict(pos_eps=1e6, neg_eps=-1e6)],
    "snr_contrastive": [{}, dict(pos_margin=0.0, neg_margin=1e6)],
    "nca": [{}, dict(softmax_scale=1e4), dict(softmax_scale=1e-6)],
    "instance": [{}, dict(gamma=1e4), dict(gamma=1e-6)],
    "dynamic_soft_margin": [{}, dict(min_val=-1e-6, num_bins=1), dict(min_val=-1e6, num_bins=1000, momentum=1.0)],
    "manifold": [dict(l=DIM, K=NUM_CLASSES), dict(l=DIM, K=NUM_CLASSES, alpha=0.999, lambdaC=1e6, margin=1e3)],
}

MINER_VARIANTS: dict[str, list[dict]] = {
    "batch_hard": [{}],
    "distance_weighted": [{}, dict(cutoff=1e-6, nonzero_loss_cutoff=1e6)],
    "dro_kl": [{}, dict(gamma=1e-4), dict(gamma=1e4, sample=True, num_samples=4)],
    "dro_kl_grouped": [{}, dict(gamma_pos=1e-4, gamma_neg=1e4)],
    "dro_top_k": [dict(k=4), dict(k=1000)],
    "dro_top_k_pn": [dict(k_pos=1, k_neg=1), dict(k_pos=1000, k_neg=1000)],
    "easy_positive": [{}, dict(negative="random"), dict(margin=1e6, epsilon=1e-9)],
    "multi_similarity": [{}, dict(epsilon=1e6), dict(epsilon=0.0)],
    "pair_margin": [{}, dict(pos_margin=0.0, neg_margin=1e6)],
    "triplet_margin": [{}, dict(margin=1e6, type_of_triplets="semihard"), dict(margin=0.0, type_of_triplets="hard")],
}

MODES = ("random", "duplicates", "identical", "some-zero", "all-zero")
SCALES = {torch.float16: (1e-3, 1.0, 1e3), torch.bfloat16: (1e-30, 1e-6, 1.0, 1e6, 1e30),
          torch.float32: (1e-30, 1e-6, 1.0, 1e6, 1e30), torch.float64: (1e-30, 1e-6, 1.0, 1e6, 1e30)}


@st.composite
def embedding_batches(draw):
    """``(embeddings [8, 4], labels [8])``: 4 classes x 2, one of the MODES, scale and dtype."""
    dtype = draw(st.sampled_from(list(SCALES)))
    scale = draw(st.sampled_from(SCALES[dtype]))
    mode = draw(st.sampled_from(MODES))
    seed = draw(st.integers(0, 2**16))
    x = torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    labels = torch.arange(BATCH, dtype=torch.int64) // PER_CLASS
    if mode == "duplicates":
        x = x[labels * PER_CLASS]
    elif mode == "identical":
        x = x[:1].expand(BATCH, DIM).clone()
    elif mode == "some-zero":
        x[::3] = 0.0
    elif mode == "all-zero":
        x.zero_()
    perm = torch.randperm(BATCH, generator=torch.Generator().manual_seed(seed + 1))
    return (x * scale).to(dtype)[perm], labels[perm]


def build_loss(name: str, kwargs: dict):
    kwargs = dict(kwargs)
    params = inspect.signature(LOSSES.get(name)).parameters
    if "num_classes" in params:
        kwargs.setdefault("num_classes", NUM_CLASSES)
    if "embedding_size" in params:
        kwargs.setdefault("embedding_size", DIM)
    if "pair_loss" in params:
        kwargs["pair_loss"] = create_loss(kwargs.get("pair_loss", "contrastive"))
    return create_loss(name, **kwargs)


def _variants(table: dict[str, list[dict]], registered: list[str]) -> list[tuple[str, dict]]:
    return [(name, kw) for name in registered for kw in table.get(name, [{}])]


LOSS_CASES = _variants(LOSS_VARIANTS, LOSSES.names())
#: Miners that read the batch's layout rather than its labels (PML's packaged triplets: rows 3i, 3i+1, 3i+2).
LAYOUT_MINERS = ("embeddings_already_packaged_as_triplets",)
MINER_CASES = _variants(MINER_VARIANTS, [n for n in MINERS.names() if n not in LAYOUT_MINERS])
FUZZ = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def _ids(cases):
    return [f"{name}-{i}" for i, (name, _) in enumerate(cases)]


def test_every_registered_loss_and_miner_is_fuzzed():
    assert {n for n, _ in LOSS_CASES} == set(LOSSES.names())
    assert {n for n, _ in MINER_CASES} | set(LAYOUT_MINERS) == set(MINERS.names())
    assert set(LOSS_VARIANTS) <= set(LOSSES.names()) and set(MINER_VARIANTS) <= set(MINERS.names())


def _loss_and_grads(loss, x, labels):
    """The loss (in float32 or float64) and the gradients of ``x`` and of the loss's parameters.

    The loss must come back in ``x``'s dtype (PML's contract); it is returned upcast. An fp16 loss or
    fp16 parameter (proxy) gradient that overflowed is replaced by its fp32 value after checking that
    the fp32 value of the same input really exceeds fp16's range (the input's own gradient is checked
    by the caller the same way).
    """
    fresh = copy.deepcopy(loss)
    x = x.detach().clone().requires_grad_(True)
    value = loss(x, labels)
    assert value.dtype == x.dtype, f"a {x.dtype} batch gave a {value.dtype} loss"
    value.backward()
    grads = [x.grad] + [p.grad for p in loss.parameters() if p.grad is not None]
    if x.dtype == torch.float16 and not (torch.isfinite(value) and all(torch.isfinite(g).all() for g in grads[1:])):
        value32, grads32 = _loss_and_grads(fresh, x.detach().float(), labels)
        if not torch.isfinite(value):
            assert value32.abs() > FP16_MAX / 2, f"fp16 loss overflowed without cause: fp32 {value32}"
            value = value32
        for i, (g, g32) in enumerate(zip(grads[1:], grads32[1:]), start=1):
            if not torch.isfinite(g).all():
                assert g32[~torch.isfinite(g)].abs().max() > FP16_MAX / 2, "fp16 parameter gradient overflowed without cause"
                grads[i] = g32
    return value.float() if value.dtype != torch.float64 else value, grads


@pytest.mark.parametrize("name,kwargs", LOSS_CASES, ids=_ids(LOSS_CASES))
@FUZZ
@given(batch=embedding_batches())
def test_loss_is_finite_on_extreme_inputs(name, kwargs, batch):
    x, labels = batch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value, grads = _loss_and_grads(build_loss(name, kwargs), x, labels)  # valid input: no error expected
    assert value.dim() == 0 and torch.isfinite(value), f"{name}: loss {value}"
    assert value.dtype in (torch.float32, torch.float64)
    if x.dtype != torch.float16:
        assert all(torch.isfinite(g).all() for g in grads), f"{name}: non-finite gradient"
        return
    if not torch.isfinite(grads[0]).all():  # fp16 overflow: only where the fp32 gradient exceeds fp16's range
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, grads32 = _loss_and_grads(build_loss(name, kwargs), x.float(), labels)
        bad = ~torch.isfinite(grads[0])
        assert grads32[0][bad].abs().max() > FP16_MAX / 2, f"{name}: fp16 gradient overflowed without cause"
    assert all(torch.isfinite(g).all() for g in grads[1:]), f"{name}: non-finite parameter gradient"


@pytest.mark.parametrize("name,kwargs", MINER_CASES, ids=_ids(MINER_CASES))
@FUZZ
@given(batch=embedding_batches())
def test_miner_returns_valid_selection_on_extreme_inputs(name, kwargs, batch):
    x, labels = batch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        selection = create_miner(name, **kwargs)(x, labels)  # valid input: no error expected
    same = labels[:, None] == labels[None, :]
    if isinstance(selection, PairSelection):
        assert selection.positive.dtype == torch.bool and selection.positive.shape == (BATCH, BATCH)
        assert selection.negative.dtype == torch.bool and selection.negative.shape == (BATCH, BATCH)
        assert not (selection.positive & ~same).any() and not (selection.negative & same).any()
        assert not selection.positive.diagonal().any()
        for w in (selection.positive_weight, selection.negative_weight):
            if w is not None:
                assert w.shape == (BATCH, BATCH) and torch.isfinite(w).all() and (w >= 0).all()
    else:
        assert isinstance(selection, TripletSelection)
        a, p, n = selection.anchor, selection.positive, selection.negative
        assert a.dtype == p.dtype == n.dtype == torch.int64
        assert ((a >= 0) & (a < BATCH)).all() and ((p >= 0) & (p < BATCH)).all() and ((n >= 0) & (n < BATCH)).all()
        assert (labels[a] == labels[p]).all() and (labels[a] != labels[n]).all() and (a != p).all()


@pytest.mark.parametrize("name", LAYOUT_MINERS)
@FUZZ
@given(batch=embedding_batches())
def test_packaged_triplets_miner_returns_the_layout_on_extreme_inputs(name, batch):
    """Whole triplets (6 of the 8 rows) at any scale and dtype: the selection is the rows' layout, nothing else."""
    x, labels = batch[0][:6], batch[1][:6]
    selection = create_miner(name)(x, labels)
    assert isinstance(selection, TripletSelection)
    assert selection.anchor.tolist() == [0, 3] and selection.positive.tolist() == [1, 4]
    assert selection.negative.tolist() == [2, 5]


_X = torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(0))
_LABELS = torch.arange(BATCH, dtype=torch.int64) // PER_CLASS

#: Invalid input classes: ``{class: (embeddings, labels, exception type, message pattern)}``.
INVALID_INPUTS = {
    "float-labels": (_X, _LABELS.float(), DataError, r"labels must hold integer class ids"),
    "rows-mismatch": (_X, _LABELS[:-1], DataError, r"embeddings has 8 rows but labels has 7|labels has 7"),
    "integer-embeddings": (_LABELS.view(BATCH, 1).expand(BATCH, DIM).contiguous(), _LABELS, DataError,
                           r"embeddings must be a floating-point tensor"),
    "1-d-embeddings": (_X.flatten(), _LABELS, DataError, r"embeddings must be 2-D"),
    "labels-as-a-list": (_X, _LABELS.tolist(), InvalidParameterError, r"labels must be a torch\.Tensor"),
}


@pytest.mark.parametrize("input_class", list(INVALID_INPUTS))
@pytest.mark.parametrize("kind,name", [("loss", n) for n in LOSSES.names()] + [("miner", n) for n in MINERS.names()])
def test_each_invalid_input_class_raises_its_exception_type(kind, name, input_class):
    x, labels, error, message = INVALID_INPUTS[input_class]
    kwargs = dict(LOSS_VARIANTS.get(name, [{}])[0]) if kind == "loss" else dict(MINER_VARIANTS.get(name, [{}])[0])
    component = build_loss(name, kwargs) if kind == "loss" else create_miner(name, **kwargs)
    with pytest.raises(error, match=message) as info:
        component(x, labels)
    assert type(info.value) is error  # the documented type itself, not merely some DmlkitError
