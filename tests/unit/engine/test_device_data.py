"""The engine's GPU data path, checked on a machine without one.

PyTorch's ``meta`` device stands in for the card where tensors must live somewhere else than the
CPU (a CPU tensor mixed into an operation on meta tensors raises as it would on CUDA); CUDA-only
calls (free memory, synchronisation, bf16 support, pinning) are monkeypatched and their arguments
checked. On the CPU every step of the path must leave the batch and its numbers as they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib

import pytest
import torch

import dmlkit.data.base as base
import dmlkit.data.transforms as transforms
from dmlkit.core import devices as _devices
from dmlkit.data.base import TensorImageDataset
from dmlkit.data.transforms import (
    BackboneNormalize,
    RandomAffine,
    RandomCropFlip,
    RandomResizedCropFlip,
    RandomTranslate,
)
from dmlkit.engine import device_data, timing
from dmlkit.engine.batches import BatchPosition, fetch_batch, iterate_training_batches
from dmlkit.engine.device import native_bf16
from dmlkit.engine.training.step_timing import CALIBRATION_STEPS
from dmlkit.recipe import Trainer

trainer_module = importlib.import_module("dmlkit.engine.trainer")
META = torch.device("meta")
CUDA = torch.device("cuda", 0)
AUGMENTATIONS = [RandomResizedCropFlip(8), RandomAffine(fill=[0.1, 0.2, 0.3]), RandomTranslate(2), RandomCropFlip(8)]


def photos(n=6):
    images = (torch.arange(n * 3 * 12 * 12) % 251).to(torch.uint8).view(n, 3, 12, 12)
    normalise = BackboneNormalize({"mean": (0.5, 0.4, 0.3), "std": (0.2, 0.25, 0.3)})
    return TensorImageDataset(images, torch.arange(n) % 3, ["a", "b", "c"], normalise)


@pytest.mark.parametrize("augment", AUGMENTATIONS, ids=lambda a: type(a).__name__)
def test_batch_augmentation_runs_on_the_images_device_with_the_cpus_random_numbers(augment):
    images = torch.rand(4, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    on_cpu, on_device = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    out = augment(images.to(META), on_device)  # a parameter left on the CPU would raise here
    augment(images, on_cpu)
    assert out.device == META and out.shape[:2] == (4, 3)
    assert torch.equal(on_device.get_state(), on_cpu.get_state())  # the same draws from the batch's generator


def test_an_in_memory_split_moves_to_the_device_once_and_its_batches_come_from_there():
    split = photos()
    resident = device_data.resident_on(split, META)
    assert resident is not split and resident.images.device == META
    assert split.images.device.type == "cpu" and split.transform.mean.device.type == "cpu"  # the split is untouched
    images, labels = resident.get_batch([4, 0, 2])
    assert images.device == META and images.shape == (3, 3, 12, 12)  # indexed and normalised on the device
    assert torch.equal(labels, torch.tensor([1, 0, 2]))
    assert device_data.resident_on(resident, META) is resident


def test_the_cpu_and_what_cannot_move_keep_the_split_itself(monkeypatch):
    split = photos()
    assert device_data.resident_on(split, torch.device("cpu")) is split
    per_item = photos()
    per_item.transform = lambda image: image  # a per-item transform (not batched) stays on the CPU
    assert device_data.resident_on(per_item, META) is per_item
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * split.images.nbytes - 1, 80 * 2**30))
    assert device_data.resident_on(split, CUDA) is split  # more than half of the free memory: batches copy per step


def test_copies_from_the_cpu_go_through_pinned_memory_without_blocking(monkeypatch):
    calls = []
    real_to = torch.Tensor.to

    def pin_memory(self):
        calls.append("pin")
        return self.clone()

    def to(self, *args, **kwargs):
        calls.append(("to", args, kwargs))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: False)
    monkeypatch.setattr(torch.Tensor, "to", to)
    moved = device_data.to_device(torch.ones(2, 3), META, pin=True)
    assert moved.device == META and calls == ["pin", ("to", (META,), {"non_blocking": True})]
    calls.clear()
    cpu = torch.ones(2)
    assert device_data.to_device(cpu, torch.device("cpu"), pin=True) is cpu and calls == []


def test_the_trainer_asks_for_pinned_batches_on_a_gpu(tmp_path, tiny_config, monkeypatch):
    trainer = Trainer(tiny_config("train.max_steps=1", "train.device=cpu"), tmp_path / "run", echo=lambda _: None)
    seen = {}
    monkeypatch.setattr(trainer_module, "iterate_training_batches", lambda *args, **kwargs: seen.update(kwargs) or iter(()))
    trainer._training_batches()
    assert seen == {"pin_memory": False}  # the CPU: nothing to pin
    trainer._pin = True  # as on CUDA
    trainer._training_batches()
    assert seen == {"pin_memory": True}


def test_workers_decode_into_pinned_memory(monkeypatch):
    class Files(torch.utils.data.Dataset):  # read per item: a DataLoader with workers
        labels = torch.tensor([0, 1, 0, 1])

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.full((1, 2, 2), float(i)), int(self.labels[i])

    loaders = []
    real_loader = torch.utils.data.DataLoader

    def loader(*args, **kwargs):
        loaders.append(kwargs["pin_memory"])
        return real_loader(*args, **{**kwargs, "pin_memory": False})  # pinning needs CUDA

    monkeypatch.setattr(torch.utils.data, "DataLoader", loader)
    sampler = type("Batches", (), {"batches": lambda self, epoch: torch.tensor([[0, 1], [2, 3]])})()
    stream = iterate_training_batches(Files(), sampler, BatchPosition(), num_workers=1,
                                      pin_memory=True)
    indices, images, labels, _ = next(stream)
    assert loaders == [True] and indices == [0, 1] and torch.equal(labels, torch.tensor([0, 1]))


def test_convolutional_models_run_channels_last_on_a_gpu_only(tmp_path, tiny_config, monkeypatch):
    trainer = Trainer(tiny_config("train.max_steps=1", "train.device=cpu"), tmp_path / "run", echo=lambda _: None)
    assert device_data.uses_channels_last(trainer.model, CUDA)
    assert not device_data.uses_channels_last(trainer.model, torch.device("cpu")) and not trainer._channels_last
    assert not device_data.uses_channels_last(torch.nn.Linear(3, 2), CUDA)
    images, raw = fetch_batch(trainer.splits.train, trainer.sampler.batches(0)[0].tolist())
    layouts, real_contiguous = [], torch.Tensor.contiguous

    def contiguous(self, *args, **kwargs):
        if self is images:
            layouts.append(kwargs.get("memory_format"))
        return real_contiguous(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "contiguous", contiguous)
    trainer.training_step(images, trainer.label_map(raw))
    on_cpu, layouts[:] = list(layouts), []  # the CPU: the batch as it came (the model may reorder it itself)
    trainer.resolved = dataclasses.replace(trainer.resolved, channels_last=True)  # as on CUDA: the batch goes in
    # channels_last before the model sees it
    trainer.training_step(images, trainer.label_map(raw))
    assert layouts == [torch.channels_last, *on_cpu]


def test_bf16_is_native_only_on_cards_that_compute_it(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda **kwargs: asked.append(kwargs) or True)
    assert native_bf16(CUDA)
    assert asked == [{"including_emulation": False}]  # an emulated bf16 (before Ampere) is slower than fp32


class FakeEvent:
    """A CUDA event on a card whose work takes 5 ms between any two events."""

    def __init__(self, enable_timing: bool = False):
        self.recorded = False

    def record(self) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        assert self.recorded

    def elapsed_time(self, end: "FakeEvent") -> float:
        return 5.0  # milliseconds


def test_device_clocks_wait_for_the_gpu_and_costs_are_its_event_time(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    timing.device_clock(CUDA)()
    assert synced == [CUDA]
    seconds = timing.fastest_of(lambda: None, CUDA, repeats=3)  # the card's time between the events, not the host's
    assert len(synced) == 1 + 3 and seconds == 0.005
    timing.synchronize(torch.device("cpu"))
    timing.fastest_of(lambda: None, "cpu")
    assert len(synced) == 4


def test_the_training_loop_synchronises_where_the_budget_reads_its_clock(tmp_path, tiny_config, monkeypatch):
    steps = []
    trainer = Trainer(tiny_config("train.max_steps=9", "train.eval_every=7", "protocol.val_fraction=0.2"), tmp_path / "run",
                      echo=lambda _: None)
    assert trainer.splits.val is not None
    monkeypatch.setattr(trainer_module, "synchronize", lambda device: steps.append(trainer.step))
    trainer.fit()
    calibration = list(range(1, 2 + CALIBRATION_STEPS))
    assert steps == [*calibration, 7, 9]  # the timed steps, and the last steps before a validation


def test_evaluation_searches_the_embeddings_on_the_training_gpu(tmp_path, tiny_config, monkeypatch):
    trainer = Trainer(tiny_config("train.max_steps=1", "train.device=cpu"), tmp_path / "run", echo=lambda _: None)
    embeddings = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(40) % 4
    on_cpu = trainer.score(embeddings, labels, clustering=False)
    moved, real_to = [], torch.Tensor.to

    def to(self, *args, **kwargs):
        if args and args[0] == CUDA:  # stands in for the copy to the card
            moved.append(self)
            return self
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    trainer.resolved = dataclasses.replace(trainer.resolved, device=CUDA)
    # (approx: where a real card is present, the search beside it may sum in another order)
    assert trainer.score(embeddings, labels, clustering=False) == pytest.approx(on_cpu, rel=1e-12)
    assert len(moved) == 1 and moved[0] is embeddings  # the k-NN search gets the embeddings on the card


def test_host_to_device_queues_the_copies_of_the_batch_augmentation_and_indexing(monkeypatch):
    """The translate's shifts and an in-memory split's row indices reach the images' device through
    ``host_to_device``: pinned, non-blocking for CUDA (never a blocking ``.to``, a host synchronisation)."""
    moved = []
    real = _devices.host_to_device

    def recording(tensor, device, pin=None):
        moved.append((tuple(tensor.shape), tensor.dtype))
        return real(tensor, device, pin)

    monkeypatch.setattr(transforms, "host_to_device", recording)
    monkeypatch.setattr(base, "host_to_device", recording)
    images = torch.rand(6, 1, 8, 8)
    RandomTranslate(2)(images, torch.Generator().manual_seed(0))
    TensorImageDataset(images, torch.arange(6), [str(i) for i in range(6)]).get_batch([0, 3])
    assert moved == [((6, 2), torch.int64), ((2,), torch.int64)]
    assert real(images, torch.device("cpu")) is images  # on its device already: nothing to copy
