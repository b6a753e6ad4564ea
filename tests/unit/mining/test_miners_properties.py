"""Every registered miner: valid index relations, degenerate batches, validation, seeding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.mining import (
    MINERS,
    DistanceWeightedMiner,
    DROKLMiner,
    EasyPositiveMiner,
    PairSelection,
    TripletMarginMiner,
    TripletSelection,
    UniformHistogramMiner,
    create_miner,
    list_miners,
)

EPS_VARIANTS = [("easy_positive", {"negative": v}) for v in ("random", "distance_weighted", "semihard", "multi_similarity")]
TRIPLET_VARIANTS = [("triplet_margin", {"type_of_triplets": v}) for v in ("all", "hard", "semihard", "easy")]
DRO_VARIANTS = [("dro_kl", {"sample": True}), ("dro_kl_grouped", {"pseudo_pairs": True}),
                ("dro_top_k", {"base": "binomial"})]
EASY_HARD_VARIANTS = [("batch_easy_hard", {"pos_strategy": p, "neg_strategy": n})
                      for p in ("easy", "hard", "semihard", "all") for n in ("easy", "hard", "semihard", "all")
                      if not ({p, n} == {"semihard"} or {p, n} == {"semihard", "all"})]
#: Reads no labels: the batch is read as consecutive (anchor, positive, negative) rows.
LABEL_FREE = {"embeddings_already_packaged_as_triplets"}
CONFIGS = ([(name, {}) for name in list_miners() if name not in LABEL_FREE] + EPS_VARIANTS + TRIPLET_VARIANTS
           + DRO_VARIANTS + EASY_HARD_VARIANTS)
#: Select positive and negative pairs independently (a one-sided batch still gives one-sided pairs).
ONE_SIDED = {"pair_margin", "hdc", "uniform_histogram"}


def test_all_expected_miners_are_registered():
    assert set(list_miners()) == {
        "triplet_margin", "batch_hard", "distance_weighted", "multi_similarity", "pair_margin",
        "easy_positive", "dro_top_k", "dro_top_k_pn", "dro_kl", "dro_kl_grouped", "angular",
        "batch_easy_hard", "hdc", "uniform_histogram", "embeddings_already_packaged_as_triplets",
    }
    with pytest.raises(InvalidParameterError, match="Did you mean 'batch_hard'"):
        create_miner("batch_hardd")


def check_relations(sel, labels, ref_labels, same_set):
    """Anchor/positive share a class, anchor/negative do not, and no sample is its own positive."""
    if isinstance(sel, TripletSelection):
        for t in (sel.anchor, sel.positive, sel.negative):
            assert t.dtype == torch.int64
        assert len(sel.anchor) == len(sel.positive) == len(sel.negative)
        assert torch.equal(labels[sel.anchor], ref_labels[sel.positive])
        assert (labels[sel.anchor] != ref_labels[sel.negative]).all()
        if same_set:
            assert (sel.anchor != sel.positive).all()
        return
    assert isinstance(sel, PairSelection)
    same = labels[:, None] == ref_labels[None, :]
    assert not (sel.positive & ~same).any()
    assert not (sel.negative & same).any()
    if same_set:
        assert not sel.positive.diagonal().any() and not sel.negative.diagonal().any()
    for w, m in ((sel.positive_weight, sel.positive), (sel.negative_weight, sel.negative)):
        if w is not None:
            assert torch.isfinite(w).all() and (w >= 0).all()
            assert not (w * ~m).any()


@settings(deadline=None, max_examples=12)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 14), classes=st.integers(1, 5),
       use_memory=st.booleans(), config=st.sampled_from(CONFIGS))
def test_miners_return_valid_relations(seed, n, classes, use_memory, config):
    name, kwargs = config
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    labels = torch.randint(0, classes, (n,), generator=g)
    miner = create_miner(name, **kwargs)
    if use_memory:
        mem, mem_labels = torch.randn(9, 5, generator=g), torch.randint(0, classes, (9,), generator=g)
        sel = miner(x, labels, mem, mem_labels)
        check_relations(sel, labels, mem_labels, same_set=False)
    else:
        sel = miner(x, labels)
        check_relations(sel, labels, labels, same_set=True)


def selection_size(sel) -> int:
    return len(sel) if isinstance(sel, TripletSelection) else sel.num_pairs


DEGENERATE = {
    "one_class": (torch.randn(6, 4), torch.zeros(6, dtype=torch.long)),
    "singletons": (torch.randn(6, 4), torch.arange(6)),
    "single_sample": (torch.randn(1, 4), torch.tensor([3])),
}


@pytest.mark.parametrize("case", sorted(DEGENERATE))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}{sorted(c[1].values())}" if isinstance(c, tuple) else None)
def test_degenerate_batches_give_empty_selections(case, config):
    name, kwargs = config
    x, labels = DEGENERATE[case]
    sel = create_miner(name, **kwargs)(x, labels)
    if name in ONE_SIDED or "all" in kwargs.values():
        # positives and negatives chosen apart (as in PML): a one-sided batch still has one-sided pairs
        assert not (sel.negative.any() if case == "one_class" else sel.positive.any())
        return
    assert selection_size(sel) == 0


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}{sorted(c[1].values())}" if isinstance(c, tuple) else None)
def test_duplicates_and_zero_vectors_do_not_produce_nan(config):
    name, kwargs = config
    x = torch.cat([torch.ones(4, 3), torch.zeros(2, 3), -torch.ones(2, 3)])
    labels = torch.tensor([0, 0, 1, 1, 0, 1, 2, 2])
    sel = create_miner(name, **kwargs)(x, labels)
    check_relations(sel, labels, labels, same_set=True)
    if isinstance(sel, PairSelection) and sel.positive_weight is not None:
        assert torch.isfinite(sel.positive_weight).all() and torch.isfinite(sel.negative_weight).all()


def test_data_errors_quote_both_operands():
    miner = TripletMarginMiner()
    with pytest.raises(DataError, match="embeddings has 4 rows but labels has 3"):
        miner(torch.randn(4, 2), torch.arange(3))
    with pytest.raises(DataError, match="int64"):
        miner(torch.randn(4, 2), torch.arange(4).float())
    with pytest.raises(DataError, match="ref_labels"):
        miner(torch.randn(4, 2), torch.arange(4), ref_emb=torch.randn(3, 2))
    with pytest.raises(DataError, match="embeddings has 2 columns but ref_emb has 5"):
        miner(torch.randn(4, 2), torch.arange(4), torch.randn(3, 5), torch.arange(3))


@pytest.mark.parametrize("name, kwargs, message", [
    ("triplet_margin", {"margin": "1"}, "The 'margin' parameter of TripletMarginMiner must be a float. Got '1' instead."),
    ("triplet_margin", {"type_of_triplets": "semi"}, "'type_of_triplets' parameter of TripletMarginMiner must be one of"),
    ("distance_weighted", {"cutoff": float("nan")}, "'cutoff' parameter of DistanceWeightedMiner"),
    ("batch_easy_hard", {"pos_strategy": "medium"}, "'pos_strategy' parameter of BatchEasyHardMiner must be one of"),
    ("batch_easy_hard", {"pos_strategy": "semihard", "neg_strategy": "semihard"}, "cannot both be 'semihard'"),
    ("batch_easy_hard", {"pos_strategy": "all", "neg_strategy": "semihard"}, "cannot be combined with 'all'"),
    ("batch_easy_hard", {"allowed_pos_range": (0, 1, 2)}, "'allowed_pos_range' parameter of BatchEasyHardMiner"),
    ("hdc", {"filter_percentage": 1.5}, "The 'filter_percentage' parameter of HDCMiner must be a float"),
    ("uniform_histogram", {"num_bins": 0}, "The 'num_bins' parameter of UniformHistogramMiner must be an int >= 1"),
    ("angular", {"angle": "20"}, "The 'angle' parameter of AngularMiner must be a float"),
    ("easy_positive", {"negative": "hard"}, "'negative' parameter of EasyPositiveMiner"),
    ("easy_positive", {"negatives_per_anchor": 0}, "'negatives_per_anchor'"),
    ("dro_top_k", {"k": 0}, "The 'k' parameter of DROTopKMiner must be an int >= 1. Got 0 instead."),
    ("dro_kl", {"gamma": 0.0}, "The 'gamma' parameter of DROKLMiner must be a float > 0. Got 0.0 instead."),
    ("dro_kl", {"base": "hinge"}, "'base' parameter of DROKLMiner must be one of"),
    ("dro_kl", {"seed": -3}, "'seed' parameter of DROKLMiner"),
])
def test_invalid_parameters_are_rejected(name, kwargs, message):
    with pytest.raises(InvalidParameterError) as err:
        create_miner(name, **kwargs)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("factory", [
    lambda: DistanceWeightedMiner(seed=5, nonzero_loss_cutoff=2.0),
    lambda: EasyPositiveMiner(negative="random", seed=5),
    lambda: DROKLMiner(gamma=1.0, sample=True, seed=5),
    lambda: UniformHistogramMiner(num_bins=3, pos_per_bin=2, neg_per_bin=2, seed=5),
])
def test_seeded_miners_are_reproducible_and_resume_from_state_dict(factory):
    g = torch.Generator().manual_seed(0)
    x, labels = torch.randn(20, 6, generator=g), torch.arange(20) % 4

    def draw(miner):
        sel = miner(x, labels)
        if isinstance(sel, TripletSelection):
            return sel.negative.tolist()
        return sel.negative_weight.tolist() if sel.listed is None else [t.tolist() for t in sel.listed]

    first = factory()
    a1 = draw(first)
    state = first.state_dict()
    a2 = draw(first)
    second = factory()
    assert draw(second) == a1  # same seed, same first draw
    resumed = factory()
    resumed.load_state_dict(state)
    assert draw(resumed) == a2  # the generator state travels with state_dict
    assert a1 != a2


def test_explicit_generator_is_used():
    g = torch.Generator().manual_seed(11)
    miner = DistanceWeightedMiner(generator=g, nonzero_loss_cutoff=2.0)
    assert miner.generator is g
    x, labels = torch.randn(10, 4), torch.arange(10) % 2
    before = g.get_state()
    miner(x, labels)
    assert not torch.equal(before, g.get_state())


def test_global_rng_is_untouched():
    x, labels = torch.randn(12, 4), torch.arange(12) % 3
    state = torch.get_rng_state()
    for name in ("distance_weighted", "easy_positive", "dro_kl", "uniform_histogram"):
        kwargs = {"sample": True} if name == "dro_kl" else {}
        kwargs.update({"negative": "random"} if name == "easy_positive" else {})
        create_miner(name, **kwargs)(x, labels)
    assert torch.equal(state, torch.get_rng_state())


def test_registry_names_build_default_instances():
    for name in list_miners():
        miner = MINERS.create(name)
        assert isinstance(miner, torch.nn.Module)
        assert repr(miner)
