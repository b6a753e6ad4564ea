"""PML's device contract for every loss, miner, reducer, regularizer, distance, cross-batch memory and
the accuracy calculator: labels, ``indices_tuple``, ``ref_emb`` / ``ref_labels`` and masks given on
another device than the embeddings are moved to the embeddings' device, and nothing is created on the
default device behind the caller's back (:mod:`device_emulation` makes both mistakes fail on a CPU).

Each case is called twice: plainly, and with its label-like inputs on the emulator's away device;
the second call must not raise and must give the first call's value and gradient. A module with state of
its own (proxies, class weights, MarginLoss's ``beta``, a memory) is also called parked: built on the away
device (PML's tests build losses on the CPU and hand them ``cuda`` embeddings) and called with home
inputs, it must give the plain call's value and gradients, and its parameters and buffers must come
home as the same objects (PML's ``cast_types``). A new registered
loss or miner is covered without a new line here; a PML name dmlkit gains outside the registries
fails :func:`test_every_pml_name_dmlkit_has_is_covered` until a case is added.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import itertools

import pytest
import torch

import dmlkit.losses.reducers as reducers_module
import dmlkit.losses.regularizers as regularizers_module
from dmlkit.distances import DISTANCES, create_distance
from dmlkit.losses import LOSSES, create_loss
from dmlkit.mining import MINERS, create_miner

from .device_emulation import AWAY, DeviceEmulator

NUM_CLASSES, PER_CLASS, DIM = 4, 3, 6
BATCH = NUM_CLASSES * PER_CLASS
#: Constructor arguments a loss needs (everything else: its defaults).
LOSS_ARGUMENTS = {"manifold": dict(l=DIM, K=NUM_CLASSES), "soft_triple": dict(centers_per_class=2),
                  "ranked_list": dict(margin=0.4, Tn=10)}
#: Miners that read the batch's layout rather than its labels.
LAYOUT_MINERS = ("embeddings_already_packaged_as_triplets",)


def batch(dtype=torch.float32, seed=0, n=BATCH):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, DIM, generator=g, dtype=torch.float64).to(dtype)
    y = torch.arange(n) % NUM_CLASSES
    return x, y


#: What a loss gets for these parameters when its constructor has them (a factory: a fresh object each time).
SHAPE_ARGUMENTS = {"num_classes": lambda: NUM_CLASSES, "embedding_size": lambda: DIM,
                   "pair_loss": lambda: create_loss("contrastive")}


def build_loss(name: str):
    """The registered loss ``name`` for a ``[BATCH, DIM]`` batch of ``NUM_CLASSES`` classes, seeded."""
    accepted = inspect.signature(LOSSES.get(name)).parameters
    given = {k: make() for k, make in SHAPE_ARGUMENTS.items() if k in accepted}
    torch.manual_seed(0)
    return create_loss(name, **{**given, **LOSS_ARGUMENTS.get(name, {})})


def value_and_grad(fn, x, *args, emulator=None, **kwargs):
    """``fn(x, *args, **kwargs)`` and its gradient w.r.t. ``x`` (under ``emulator`` when given)."""
    x = x.detach().clone().requires_grad_(True)
    torch.manual_seed(1)
    if emulator is None:
        value = fn(x, *args, **kwargs)
        grad = torch.autograd.grad(value, x, allow_unused=True)[0] if value.requires_grad else None
        return value.detach(), grad
    with emulator:
        value = fn(x, *emulator.away(args), **emulator.away(kwargs))
        grad = torch.autograd.grad(value, x, allow_unused=True)[0] if value.requires_grad else None
    assert not emulator.is_away(value), "the loss came back on the away device, not the embeddings'"
    return value.detach(), grad


def assert_same_call(fn, x, *args, **kwargs):
    """The call with ``args`` / ``kwargs`` away gives the plain call's value and gradient, or its error."""
    try:
        expected = value_and_grad(copy.deepcopy(fn), x, *args, **kwargs)
    except (ValueError, TypeError) as plain_error:  # the call itself is refused: refused the same way away
        with pytest.raises(type(plain_error)):
            value_and_grad(copy.deepcopy(fn), x, *args, emulator=DeviceEmulator(), **kwargs)
        return None
    got = value_and_grad(copy.deepcopy(fn), x, *args, emulator=DeviceEmulator(), **kwargs)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-6, atol=1e-7)
    if expected[1] is not None:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-6, atol=1e-7)
    return got


def _state(module: torch.nn.Module) -> list[torch.Tensor]:
    return list(itertools.chain(module.parameters(), module.buffers()))


def _parked_value_and_grads(module, x, args, kwargs, emulator=None):
    """``module(x, *args, **kwargs)`` and its gradients w.r.t. ``x`` and ``module``'s parameters (``module``
    parked on ``emulator``'s away device when given; its inputs stay home)."""
    x = x.detach().clone().requires_grad_(True)
    params = list(module.parameters())
    torch.manual_seed(1)
    with emulator if emulator is not None else contextlib.nullcontext():
        value = module(x, *args, **kwargs)
        grads = torch.autograd.grad(value, [x, *params], allow_unused=True) if value.requires_grad else ()
    return value.detach(), grads


def assert_parked_call(module, x, *args, prepare=None, **kwargs):
    """``module`` parked away and called with home inputs gives the plain call's value and gradients, and its
    parameters and buffers come home, the parameters as the same objects. ``prepare(module, emulator)`` runs
    after parking (a test that brings part of the state home first, as PML's memory test does)."""
    expected = _parked_value_and_grads(copy.deepcopy(module), x, args, kwargs)
    emu = DeviceEmulator()
    parked = emu.park(copy.deepcopy(module))
    assert emu.away_state(parked) == [n for n, _ in itertools.chain(parked.named_parameters(), parked.named_buffers())]
    if prepare is not None:
        prepare(parked, emu)
    params = list(parked.parameters())
    got = _parked_value_and_grads(parked, x, args, kwargs, emu)
    assert not emu.is_away(got[0]), "the loss came back on the away device, not the embeddings'"
    assert not emu.away_state(parked), f"{type(parked).__name__} left {emu.away_state(parked)} on the away device"
    assert all(a is b for a, b in zip(params, parked.parameters(), strict=True)), "a parameter was replaced, not moved"
    torch.testing.assert_close(got[0], expected[0], rtol=1e-6, atol=1e-7)
    assert len(got[1]) == len(expected[1])
    for g, e in zip(got[1], expected[1], strict=True):
        assert (g is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-7)
    return parked


# -- the emulator itself ---------------------------------------------------------------------------


class ArangeWithoutDevice(torch.nn.Module):
    """A deliberately wrong loss: a row index from ``torch.arange(n)`` on the default device."""

    def forward(self, embeddings, labels):
        labels = labels.to(embeddings.device)
        weight = torch.arange(embeddings.shape[0]).to(embeddings.dtype)
        return (embeddings.sum(1) * weight).sum() + labels.sum() * 0


class LabelsNotMoved(torch.nn.Module):
    """A deliberately wrong loss: the labels' same-class mask used where the labels came in."""

    def forward(self, embeddings, labels):
        same = (labels[:, None] == labels[None]).to(embeddings.dtype)
        return (embeddings @ embeddings.T * same).sum()


class Correct(torch.nn.Module):
    def forward(self, embeddings, labels):
        labels = labels.to(embeddings.device)
        same = (labels[:, None] == labels[None]).to(embeddings.dtype)
        rows = torch.arange(embeddings.shape[0], device=labels.device)
        return (embeddings @ embeddings.T * same).sum() + embeddings[rows].sum()


@pytest.mark.parametrize("wrong", [ArangeWithoutDevice(), LabelsNotMoved()], ids=["arange", "labels"])
def test_the_emulator_catches_a_loss_that_mixes_devices(wrong):
    x, y = batch()
    value_and_grad(wrong, x, y)  # fine on one device
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        value_and_grad(wrong, x, y, emulator=DeviceEmulator())


def test_the_emulator_passes_a_loss_that_follows_its_embeddings():
    x, y = batch()
    assert assert_same_call(Correct(), x, y)[0] > 0


def test_the_emulator_tracks_moves_and_factories():
    with DeviceEmulator() as emu:
        home = torch.ones(3, device="cpu")
        away = emu.away(torch.tensor([0, 1, 2]))
        assert away.device == AWAY and home.device == torch.device("cpu")
        assert not emu.is_away(away.to(home.device)) and emu.is_away(away)  # a move copies, the original stays
        assert emu.is_away(torch.arange(3)) and emu.is_away(torch.zeros(2, device=away.device))
        assert not emu.is_away(torch.zeros_like(home)) and emu.is_away(home.cpu())
        assert not emu.is_away(home[away])  # a home tensor indexed by away indices, as CUDA allows
        assert not emu.is_away(home + away.sum())  # an away 0-dim tensor joins home ones
        with pytest.raises(RuntimeError, match="same device"):
            away[home.long()]
        with pytest.raises(TypeError, match="numpy"):
            home.numpy()


# -- losses ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSSES.names())
def test_loss_moves_labels_to_the_embeddings_device(name):
    x, y = batch()
    assert_same_call(build_loss(name), x, y)


@pytest.mark.parametrize("name", LOSSES.names())
def test_loss_moves_mined_indices_to_the_embeddings_device(name):
    x, y = batch()
    indices = create_miner("multi_similarity").as_pml()(x, y)
    assert_same_call(build_loss(name), x, y, indices)


@pytest.mark.parametrize("name", LOSSES.names())
def test_loss_moves_the_reference_set_to_the_embeddings_device(name):
    x, y = batch()
    ref, ref_y = batch(seed=1, n=8)
    assert_same_call(build_loss(name), x, y, ref_emb=ref, ref_labels=ref_y)


def test_the_emulator_parks_a_module_and_follows_its_moves():
    layer = torch.nn.Linear(DIM, 2)
    x = torch.randn(3, DIM)
    with DeviceEmulator() as emu:
        emu.park(layer)
        assert emu.away_state(layer) == ["weight", "bias"] and layer.weight.device == AWAY
        with pytest.raises(RuntimeError, match="same device"):
            layer(x)  # CPU weights meet cuda inputs
        weight = layer.weight
        weight.data = weight.data.to(x.device)  # PML's cast_types: the same Parameter, moved
        assert layer.weight is weight and not emu.is_away(weight) and emu.away_state(layer) == ["bias"]
        assert emu.is_away(layer.bias.data)  # .data has its parameter's device
        layer.to(x.device)
        assert not emu.away_state(layer) and layer.weight is weight
        assert layer(x).shape == (3, 2)


# -- module state parked on the other device: it follows the embeddings (PML's cast_types) ------------------


@pytest.mark.parametrize("name", LOSSES.names())
def test_a_loss_left_on_another_device_follows_the_embeddings(name):
    x, y = batch()
    loss = build_loss(name)
    if not _state(loss):  # nothing of its own to move: its own state is created per call
        assert_parked_call(loss, x, y)
        return
    parked = assert_parked_call(loss, x, y)
    for p in parked.parameters():
        assert p.dtype == torch.float32


@pytest.mark.parametrize("name", ["arcface", "proxy_anchor", "soft_triple", "margin"])
def test_a_parked_loss_takes_a_float64_batch_dtype_and_device(name):
    x, y = batch(torch.float64)
    loss = build_loss(name)
    if name == "margin":
        loss = create_loss("margin", learn_beta=True, num_classes=NUM_CLASSES, nu=0.1)
    parked = assert_parked_call(loss, x, y)
    cast = name != "margin"  # PML casts proxies and class weights; MarginLoss's beta is cast per call
    assert all((p.dtype == torch.float64) == cast for p in parked.parameters())


def test_margin_loss_with_a_learned_per_class_beta_follows_the_embeddings():
    x, y = batch()
    assert_parked_call(create_loss("margin", learn_beta=True, num_classes=NUM_CLASSES, nu=0.1), x, y)
    assert_parked_call(create_loss("margin", learn_beta=True, nu=0.1), x, y)


@pytest.mark.parametrize("regularizer", ["RegularFaceRegularizer", "CenterInvariantRegularizer", "LpRegularizer"])
def test_weight_regularizers_read_the_moved_weights(regularizer):
    x, y = batch()
    for name in ("arcface", "proxy_anchor"):
        loss = create_loss(name, num_classes=NUM_CLASSES, embedding_size=DIM,
                           weight_regularizer=getattr(regularizers_module, regularizer)())
        assert_parked_call(loss, x, y)


def test_sparse_centers_regularizer_reads_the_moved_centres():
    from dmlkit.losses import SoftTripleLoss

    x, y = batch()
    regularizer = regularizers_module.SparseCentersRegularizer(num_classes=NUM_CLASSES, centers_per_class=2)
    loss = SoftTripleLoss(NUM_CLASSES, DIM, centers_per_class=2, weight_regularizer=regularizer)
    assert_parked_call(loss, x, y)


def test_multiple_losses_left_on_another_device_follow_the_embeddings():
    from dmlkit.losses import MultipleLosses

    x, y = batch()
    combined = MultipleLosses([build_loss("arcface"), build_loss("proxy_anchor"), build_loss("margin"),
                               build_loss("contrastive")], weights=[1.0, 0.5, 0.25, 2.0])
    assert_parked_call(combined, x, y)


def _filled_memory():
    from dmlkit.memory import CrossBatchMemory

    memory = CrossBatchMemory(create_loss("contrastive"), DIM, memory_size=32)
    memory(*batch(seed=3))  # a memory that already holds a batch
    return memory


def test_cross_batch_memory_left_on_another_device_follows_the_embeddings():
    x, y = batch()
    assert_parked_call(_filled_memory(), x, y)
    assert_parked_call(_filled_memory(), x, y, create_miner("multi_similarity").as_pml()(x, y))


def test_cross_batch_memory_whose_memory_alone_was_moved_brings_the_rest_of_its_state():
    """PML's memory test moves ``embedding_memory`` and ``label_memory`` to the card itself; the queue
    pointer and counts stay where the memory was built."""
    x, y = batch()

    def bring_the_memory_home(memory, emu):
        with emu:
            memory.embedding_memory = memory.embedding_memory.to(x.device)
            memory.label_memory = memory.label_memory.to(x.device)
        assert emu.is_away(memory.queue_idx)

    assert_parked_call(_filled_memory(), x, y, prepare=bring_the_memory_home)


def test_cross_batch_memory_add_to_memory_after_its_memory_alone_was_moved():
    """PML's ``test_remove_self_comparisons``: the memory tensors moved by hand, then ``add_to_memory`` (no
    forward): the slots are written where the memory now lives and the pointer, counts and slots follow."""
    x, y = batch()
    expected = _filled_memory()
    expected.add_to_memory(x, y, 5)
    emu = DeviceEmulator()
    memory = emu.park(_filled_memory())
    with emu:
        memory.embedding_memory = memory.embedding_memory.to(x.device)
        memory.label_memory = memory.label_memory.to(x.device)
        memory.add_to_memory(x, y, 5)
    assert not emu.away_state(memory), f"CrossBatchMemory left {emu.away_state(memory)} on the away device"
    torch.testing.assert_close(memory.embedding_memory, expected.embedding_memory, rtol=0, atol=0)
    assert torch.equal(memory.label_memory, expected.label_memory)
    assert torch.equal(memory.curr_batch_idx, expected.curr_batch_idx)
    assert int(memory.queue_idx) == int(expected.queue_idx) == BATCH + 5


# -- losses outside the registry (PML names) -------------------------------------------------------------




def test_cross_batch_memory_moves_labels_indices_and_mask_to_the_embeddings_device():
    from dmlkit.memory import CrossBatchMemory

    x, y = batch()
    memory = CrossBatchMemory(create_loss("contrastive"), DIM, memory_size=32)
    memory(*batch(seed=3))  # a memory that already holds a batch
    assert_same_call(memory, x, y)
    assert_same_call(memory, x, y, create_miner("multi_similarity").as_pml()(x, y))
    assert_same_call(memory, x, y, enqueue_mask=torch.arange(BATCH) % 2 == 0)


def test_self_supervised_losses_move_the_second_view_to_the_embeddings_device():
    from dmlkit.losses import SelfSupervisedLoss, VICRegLoss

    x, _ = batch()
    view, _ = batch(seed=2)
    assert_same_call(SelfSupervisedLoss(create_loss("ntxent")), x, view)
    assert_same_call(VICRegLoss(), x, ref_emb=view)


def test_multiple_losses_move_labels_and_indices_to_the_embeddings_device():
    from dmlkit.losses import MultipleLosses

    x, y = batch()
    combined = MultipleLosses([create_loss("contrastive"), create_loss("triplet_margin")], weights=[1.0, 0.5])
    assert_same_call(combined, x, y)
    assert_same_call(combined, x, y, create_miner("multi_similarity").as_pml()(x, y))


# -- miners ----------------------------------------------------------------------------------------------


def _selection_tensors(selection):
    return selection.to_indices_tuple() if hasattr(selection, "to_indices_tuple") else selection


@pytest.mark.parametrize("name", MINERS.names())
def test_miner_moves_labels_and_references_to_the_embeddings_device(name):
    x, y = batch()
    ref, ref_y = batch(seed=1, n=9)
    for args in ((y,), (y, ref, ref_y)):
        if name in LAYOUT_MINERS and len(args) > 1:
            continue
        torch.manual_seed(0)
        expected = _selection_tensors(create_miner(name)(x, *args))
        emu = DeviceEmulator()
        torch.manual_seed(0)
        with emu:
            got = _selection_tensors(create_miner(name)(x, *emu.away(args)))
        assert not any(emu.is_away(t) for t in got), f"{name}'s selection is on the away device"
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e)


# -- reducers, regularizers, distances ----------------------------------------------------------------------


def _reducers():
    from dmlkit.losses.reducers import (
        BaseReducer,
        ClassWeightedReducer,
        MultipleReducers,
        PerAnchorReducer,
        PMLReducer,
        ThresholdReducer,
    )

    special = {ClassWeightedReducer: lambda: ClassWeightedReducer(torch.rand(NUM_CLASSES) + 0.5),
               ThresholdReducer: lambda: ThresholdReducer(low=0.1),
               MultipleReducers: lambda: MultipleReducers({"loss": reducers_module.MeanReducer()}),
               PerAnchorReducer: lambda: PerAnchorReducer(),
               PMLReducer: None}  # wraps a PML reducer object: PML's own code
    found = {}
    for name in reducers_module.__all__:
        cls = getattr(reducers_module, name)
        if isinstance(cls, type) and issubclass(cls, BaseReducer) and cls is not BaseReducer and special.get(cls, 0) is not None:
            found[name] = special.get(cls, cls)
    return found


REDUCERS = _reducers()


def _total(out):
    """A reducer's scalar, or the sum of what a do-nothing reducer hands back."""
    if isinstance(out, torch.Tensor):
        return out.sum()
    values = out.values() if isinstance(out, dict) else out
    return sum(_total(v["losses"] if isinstance(v, dict) and "losses" in v else v) for v in values
               if isinstance(v, (torch.Tensor, dict, list, tuple)))


@pytest.mark.parametrize("name", sorted(REDUCERS))
def test_reducer_moves_indices_masks_and_labels_to_the_terms_device(name):
    x, y = batch()
    terms = torch.rand(BATCH, generator=torch.Generator().manual_seed(0))
    anchors = torch.arange(BATCH)
    pair_terms = torch.rand(BATCH, BATCH, generator=torch.Generator().manual_seed(1))
    mask = (y[:, None] == y[None]) & ~torch.eye(BATCH, dtype=torch.bool)
    loss_dict = {"loss": {"losses": terms, "indices": anchors, "reduction_type": "element"}}
    if name == "DivisorReducer":
        loss_dict["loss"]["divisor"] = 3
    calls = [
        (lambda t, dct, emb, lab: _total(REDUCERS[name]()({"loss": {**dct["loss"], "losses": t}}, emb, lab)),
         (terms, loss_dict, x, y)),
        (lambda t, m, lab: _total(REDUCERS[name]()(t, m, kind="pos_pair", labels=lab, divisor=3)), (pair_terms, mask, y)),
    ]
    for fn, (t, *rest) in calls:
        assert_same_call(fn, t, *rest)


REGULARIZERS = [getattr(regularizers_module, n) for n in regularizers_module.__all__
                if isinstance(getattr(regularizers_module, n), type)
                and issubclass(getattr(regularizers_module, n), regularizers_module.BaseRegularizer)
                and n != "BaseRegularizer"]


REGULARIZER_ARGUMENTS = {"SparseCentersRegularizer": dict(num_classes=NUM_CLASSES, centers_per_class=PER_CLASS)}


@pytest.mark.parametrize("cls", REGULARIZERS, ids=lambda c: c.__name__)
def test_regularizer_creates_nothing_on_the_default_device(cls):
    x, _ = batch()
    assert_same_call(cls(**REGULARIZER_ARGUMENTS.get(cls.__name__, {})), x)


def _distances():
    from dmlkit.distances import SNRDistance

    return {**{n: (lambda n=n: create_distance(n)) for n in DISTANCES.names()}, "SNRDistance": SNRDistance}


DISTANCE_CASES = _distances()


@pytest.mark.parametrize("name", sorted(DISTANCE_CASES))
def test_distance_moves_references_to_the_query_device(name):
    x, _ = batch()
    ref, _ = batch(seed=1, n=7)
    assert_same_call(lambda q, r: DISTANCE_CASES[name]()(q, r).sum(), x, ref)
    assert_same_call(lambda q: DISTANCE_CASES[name]()(q).sum(), x)


def test_batched_distance_moves_references_to_the_query_device():
    from dmlkit.distances import BatchedDistance

    def blocks(q, r):
        out = []
        BatchedDistance(DISTANCE_CASES["cosine"](), lambda mat, s, e: out.append(mat.sum()), batch_size=5)(q, r)
        return torch.stack(out).sum()

    x, _ = batch()
    ref, _ = batch(seed=1, n=7)
    assert_same_call(blocks, x, ref)


# -- coverage: every PML name dmlkit has ------------------------------------------------------------------

COVERED_OUTSIDE_REGISTRIES = {"CrossBatchMemory", "SelfSupervisedLoss", "VICRegLoss", "MultipleLosses",
                              "AccuracyCalculator"}
#: PML base classes (interfaces, not computations).
PML_BASES = {"BaseMetricLossFunction", "GenericPairLoss", "BaseLossWrapper", "EmbeddingRegularizerMixin",
             "WeightRegularizerMixin", "BaseMiner", "BaseReducer", "BaseDistance", "BaseRegularizer",
             "BaseTupleMiner", "BaseSubsetBatchMiner", "WeightRegularizerMixin"}


def test_every_pml_name_dmlkit_has_is_covered():
    from pytorch_metric_learning import distances, losses, miners, reducers, regularizers

    import dmlkit.distances
    import dmlkit.losses
    import dmlkit.memory
    import dmlkit.mining

    covered = {type(build_loss(n)).__name__ for n in LOSSES.names()}
    covered |= {type(create_miner(n)).__name__ for n in MINERS.names()}
    covered |= {type(make()).__name__ for make in DISTANCE_CASES.values()} | {"BatchedDistance"}
    covered |= set(REDUCERS) | {c.__name__ for c in REGULARIZERS} | COVERED_OUTSIDE_REGISTRIES
    ours = (dmlkit.losses, dmlkit.memory, dmlkit.mining, dmlkit.distances, reducers_module, regularizers_module)
    missing = []
    for module in (losses, miners, reducers, distances, regularizers):
        for name in dir(module):
            if name.startswith("_") or name in PML_BASES or not isinstance(getattr(module, name), type):
                continue
            if any(hasattr(m, name) for m in ours) and name not in covered:
                missing.append(name)
    assert not missing, f"PML names dmlkit has but no device-contract case covers: {missing}"


# -- dtypes: a half-precision batch gets a loss of its own dtype ------------------------------------------

HALF = [torch.float16, torch.bfloat16]
HALF_RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # two units in the last place of the result


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", LOSSES.names())
def test_loss_of_a_half_precision_batch_has_its_dtype_and_the_float32_value(name, dtype):
    x, y = batch()
    x = x.to(dtype)
    loss = build_loss(name)
    value = copy.deepcopy(loss)(x.clone().requires_grad_(True), y)
    reference = copy.deepcopy(loss)(x.float(), y)  # the same rounded inputs in float32
    assert value.dtype == dtype
    assert torch.isfinite(value)
    torch.testing.assert_close(value.float(), reference.detach(), rtol=HALF_RTOL[dtype], atol=1e-3)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_distances_regularizers_and_reducers_keep_a_half_precision_dtype(dtype):
    x, y = batch()
    x = x.to(dtype)
    for name, make in DISTANCE_CASES.items():
        assert make()(x).dtype == dtype, name
    for cls in REGULARIZERS:
        assert cls(**REGULARIZER_ARGUMENTS.get(cls.__name__, {}))(x).dtype == dtype, cls.__name__
    terms = torch.rand(BATCH).to(dtype)
    for name, make in REDUCERS.items():
        entry = {"losses": terms, "indices": torch.arange(BATCH), "reduction_type": "element", "divisor": 3}
        assert _total(make()({"loss": entry}, x, y)).dtype == dtype, name


# -- the accuracy calculator ------------------------------------------------------------------------------


def test_accuracy_calculator_takes_labels_and_references_on_any_device(monkeypatch):
    from dmlkit.evaluation import AccuracyCalculator
    knn_module = importlib.import_module("dmlkit.evaluation.knn")  # the package exports the function knn

    # the home device stands for a GPU: the calculator takes the search a GPU runs (knn_device.py); the
    # CPU search (C scan) makes its shortlists on the CPU by design and is never reached from a GPU
    monkeypatch.setattr(knn_module, "DEVICE_SEARCH", "always")

    query, query_labels = batch(n=20)
    reference, reference_labels = batch(seed=4, n=30)
    calculator = AccuracyCalculator(include=("precision_at_1", "r_precision", "mean_average_precision_at_r"))
    for args in ((query_labels,), (query_labels, reference, reference_labels)):
        expected = calculator.get_accuracy(query, *args)
        emu = DeviceEmulator()
        with emu:
            got = calculator.get_accuracy(query, *emu.away(args))
        assert got == expected and len(got) == 3


def test_sub_center_arcface_outliers_take_labels_on_any_device():
    from dmlkit.losses import SubCenterArcFaceLoss

    x, y = batch()
    loss = SubCenterArcFaceLoss(num_classes=NUM_CLASSES, embedding_size=DIM, sub_centers=3)
    expected = loss.get_outliers(x, y, threshold=30)
    emu = DeviceEmulator()
    with emu:
        got = loss.get_outliers(x, emu.away(y), threshold=30)
    assert not any(emu.is_away(t) for t in got)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_sub_center_arcface_outliers_move_the_sub_centres_to_the_embeddings_device():
    from dmlkit.losses import SubCenterArcFaceLoss

    x, y = batch()
    loss = SubCenterArcFaceLoss(num_classes=NUM_CLASSES, embedding_size=DIM, sub_centers=3)
    expected = loss.get_outliers(x, y, threshold=30)
    emu = DeviceEmulator()
    emu.park(loss)
    weight = loss.W
    with emu:
        got = loss.get_outliers(x, y, threshold=30)
    assert not emu.away_state(loss) and loss.W is weight
    for g, e in zip(got, expected, strict=True):
        assert not emu.is_away(g)
        torch.testing.assert_close(g, e)
