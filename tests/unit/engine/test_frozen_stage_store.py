"""StageStore: the frozen stages' outputs of every photo computed once per key, mapped back, rebuilt when damaged.

The stored evaluation view gives the embedding the whole network gives the photo's evaluation view; the
store is built by one prefix pass set and read back without one; a new key (size, views) or a damaged
file (truncated, or a byte changed) is computed again, never used."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from dmlkit.data.transforms import photo_view
from dmlkit.engine.frozen_stage_store import StageStore
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.models import TrainedStages, create_model

SIZE = 64


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("efficientnet_lite0", pretrained=True, frozen_stages=4, freeze_bn=True, embedding_size=16)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    g = np.random.default_rng(0)
    paths, names = [], []
    for i in range(6):
        path = folder / f"p{i}.png"
        Image.fromarray(g.integers(0, 256, (40 + 4 * i, 56, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
        names.append(f"c{i % 2}")
    return paths, names


def counting(model, monkeypatch) -> list[int]:
    """Count the images ``model.prefix`` runs on."""
    seen, prefix = [], model.prefix
    monkeypatch.setattr(model, "prefix", lambda x: (seen.append(len(x)), prefix(x))[1])
    return seen


def test_the_store_is_built_once_and_read_back_without_a_prefix_pass(model, photos, tmp_path, monkeypatch):
    seen = counting(model, monkeypatch)
    store = StageStore(tmp_path)
    first = store.outputs(model, "lite0", *photos, image_size=SIZE, views=3, seed=1)
    built = sum(seen)
    assert built >= 6 * 4 and tuple(first.storage.shape) == (6, 4, SIZE // 16, SIZE // 16, 112)
    assert first.storage.dtype == torch.bfloat16
    again = store.outputs(model, "lite0", *photos, image_size=SIZE, views=3, seed=1)
    assert sum(seen) == built and torch.equal(again.storage, first.storage)  # read back, no prefix pass
    assert len(list(tmp_path.glob("*.pt"))) == 1
    store.outputs(model, "lite0", *photos, image_size=SIZE, views=2, seed=1)  # another key: computed
    assert sum(seen) > built and len(list(tmp_path.glob("*.pt"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip_a_stored_byte"])
def test_a_damaged_store_is_computed_again_never_used(model, photos, tmp_path, monkeypatch, damage):
    store = StageStore(tmp_path)
    first = store.outputs(model, "lite0", *photos, image_size=SIZE, views=1, seed=1)
    expected, path = first.storage.clone(), first.path
    raw = path.read_bytes()
    if damage == "truncate":
        damaged = raw[: len(raw) // 2]
    else:  # one byte inside the stored tensor's data: the file still reads, its checksum fails
        at = raw.find(expected.view(torch.uint8).reshape(-1).numpy().tobytes()[:256]) + 100
        assert at > 100
        damaged = raw[:at] + bytes([raw[at] ^ 0xFF]) + raw[at + 1:]
    del first  # the mapped file is replaced, not written in place (a mapped reader must never see it change)
    (tmp_path / "damaged").write_bytes(damaged)
    (tmp_path / "damaged").replace(path)
    from dmlkit.engine import frozen_stage_store

    monkeypatch.setattr(frozen_stage_store, "_CHECKED", set())  # a new process: the file is checked again
    seen = counting(model, monkeypatch)
    again = store.outputs(model, "lite0", *photos, image_size=SIZE, views=1, seed=1)
    assert sum(seen) > 0 and torch.equal(again.storage, expected)


def test_the_stored_evaluation_view_embeds_as_the_whole_network_embeds_the_photo(model, photos, tmp_path):
    stored = StageStore(tmp_path).outputs(model, "lite0", *photos, image_size=SIZE, views=2, seed=1)
    test = stored.evaluation([1, 4, 5])
    assert test.class_names == ["c0", "c1"] and test.labels.tolist() == [1, 0, 1]
    features, labels = test.get_batch([0, 1, 2])
    view = photo_view(SIZE, model.pretrained_cfg["interpolation"])  # the view the photo pipeline decodes
    images = torch.stack([torch.from_numpy(np.asarray(view(Image.open(photos[0][i]).convert("RGB"))).copy())
                          .permute(2, 0, 1) for i in (1, 4, 5)])
    model.eval()
    with torch.no_grad():
        whole = model(model.preprocess(images / 255.0))
        stored_path = TrainedStages(model).eval()(features)
    assert torch.nn.functional.cosine_similarity(whole, stored_path).min() > 0.99  # bf16 storage of the prefix
    train = stored.training([0, 3], names=["a", "b"])
    assert len(train) == 4 and train.labels.tolist() == [0, 0, 1, 1]
    assert not torch.equal(train.get_batch([0])[0], train.get_batch([1])[0])  # two crops of one photo
    with pytest.raises(DataError, match="image rows must lie in"):
        stored.evaluation([6])


def test_trained_stages_need_an_embedder_with_a_fixed_prefix():
    with pytest.raises(InvalidParameterError, match="freeze_bn=False"):
        TrainedStages(create_model("efficientnet_lite0", pretrained=True, frozen_stages=4, embedding_size=8))


def test_a_trunk_frozen_through_a_chain_step_splits_there_and_keys_its_store_by_it(photos):
    model = create_model("efficientnet_lite0", pretrained=True, frozen_stages=4, freeze_bn=True, embedding_size=16)
    model.trunk.freeze_through("blocks.5")
    prefix, suffix = model.trunk.split_names()
    assert prefix[-1] == "blocks.5" and suffix[0] == "blocks.6" and model.trunk.frozen_stages == 4
    assert not any(p.requires_grad for p in model.trunk.model.blocks[5].parameters())
    assert all(p.requires_grad for p in model.trunk.model.blocks[6].parameters())
    model.eval()
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():  # the split is exact: prefix then the rest is the whole network
        assert torch.allclose(model.forward_from_prefix(model.prefix(images)), model(images), atol=1e-5)
    key = StageStore("unused").key(model, "efficientnet_lite0", *photos, image_size=64, views=1, seed=0)
    assert key.frozen_through == "blocks.5" and "to-blocks.5" in key.filename()
    with pytest.raises(InvalidParameterError, match="no such step"):
        model.trunk.freeze_through("blocks.9")


def test_freezing_zero_stages_freezes_nothing():
    model = create_model("efficientnet_lite0", pretrained=False, frozen_stages=2, embedding_size=8)
    model.trunk.freeze_stages(0)  # after a count: the flags stay as the caller left them, no prefix is named
    assert model.trunk.frozen_stages == 0 and model.trunk.split_problem().startswith("model.frozen_stages=0")
    fresh = create_model("efficientnet_lite0", pretrained=False, embedding_size=8)
    fresh.trunk.freeze_stages(0)
    assert all(p.requires_grad for p in fresh.trunk.parameters())
