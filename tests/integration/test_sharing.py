"""`dmlkit push` and `dmlkit.load("hf://...")`: a run shared through a Hub that is a local directory.

The Hub stand-in (``local_hub``, tests/integration/conftest.py) keeps each repository as a folder under
``tmp_path`` and answers the ``huggingface_hub`` calls of a push (``HfApi.create_repo``, ``upload_folder``)
and of a load (``snapshot_download``); it replaces the module dmlkit imports, so nothing reaches the
network and the code path from the CLI verb to the built model is dmlkit's own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import dmlkit
from dmlkit import sharing
from dmlkit.cli.main import main
from dmlkit.config import load_config
from dmlkit.core.extras import MissingExtraError
from dmlkit.engine.checkpoint_files import load_checkpoint
from dmlkit.exceptions import CheckpointError, ConfigError
from dmlkit.inference import RunEmbedder
from dmlkit.recipe import Trainer


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A two-step run on sklearn's digits (8x8, in memory): seconds, with real metrics and checkpoints."""
    run_dir = tmp_path_factory.mktemp("sharing") / "run"
    cfg = load_config(overrides=[
        "data.name=digits", "train.max_steps=2", "train.progress=false", "eval.clustering=false",
        "model.ensemble=1", "model.shift_average=0", "train.num_threads=1", "loss.args.margin=0.2",
    ])
    Trainer(cfg, run_dir, echo=lambda text: None).fit()
    return run_dir


def images() -> torch.Tensor:
    return torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def test_push_then_load_hf_gives_the_runs_embeddings(tiny_run, local_hub, capsys):
    assert main(["push", str(tiny_run), "me/digits-embedder", "--private"]) == 0
    assert "hf://me/digits-embedder" in capsys.readouterr().out
    assert local_hub.created == [("me/digits-embedder", True)]
    repo = local_hub.root / "me" / "digits-embedder"
    assert {"config.yaml", "model.safetensors", "dmlkit.json", "README.md", "metrics.json",
            "preprocessing.json"} <= {p.name for p in repo.iterdir()}
    assert not list(repo.glob("*.pt")), "weights are shared as safetensors only"
    expected = dmlkit.load(tiny_run)(images())
    got = dmlkit.load("hf://me/digits-embedder")(images())
    assert torch.equal(got, expected)
    embedder = RunEmbedder.from_run("hf://me/digits-embedder")
    assert embedder.eval_input["size"] == [8, 8]
    assert torch.equal(embedder.embed(images()), RunEmbedder.from_run(tiny_run).embed(images()))


def test_model_card_says_data_loss_metrics_preprocessing_and_command(tiny_run, tmp_path):
    folder = sharing.write_shared_folder(tiny_run, tmp_path / "shared", repo_id="me/digits")
    card = (folder / "README.md").read_text()
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    assert card.startswith("---\nlibrary_name: dmlkit\n")
    assert f"| map_at_r | {metrics['map_at_r']:.4f} |" in card
    assert "- loss: `proxy_anchor` (margin=0.2)" in card
    assert "data set `digits`" in card and "resized to [8, 8]" in card
    assert "- command: `dmlkit " in card  # the run's own command line, from env.json
    assert 'dmlkit.load("hf://me/digits")' in card


def test_shared_weights_equal_the_checkpoint_and_load_without_unpickling(tiny_run, tmp_path):
    from safetensors.torch import load_file

    folder = sharing.write_shared_folder(tiny_run, tmp_path / "shared")
    saved = load_checkpoint(tiny_run / "checkpoints" / "best.pt")["model"]
    shared = load_file(str(folder / "model.safetensors"))
    assert shared.keys() == saved.keys()
    assert all(torch.equal(shared[k], saved[k]) for k in saved)
    manifest = json.loads((folder / "preprocessing.json").read_text())
    assert set(manifest) == {"eval_input"}, "the run's file list stays home"


def test_a_tampered_weights_file_is_refused(tiny_run, tmp_path):
    folder = sharing.write_shared_folder(tiny_run, tmp_path / "shared")
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256 differs"):
        dmlkit.load(folder)


def test_push_local_refuses_a_folder_with_files_and_keeps_them(tiny_run, tmp_path, capsys):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    assert main(["push", str(tiny_run), "me/x", "--local", str(target)]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "Traceback" not in err
    assert (target / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("repo_id", ["digits", "me/", "a/b/c", "me/my model"])
def test_a_malformed_repo_id_is_named(tiny_run, local_hub, repo_id):
    with pytest.raises(ConfigError, match="user/name"):
        sharing.push_run(tiny_run, repo_id)
    assert local_hub.created == []


def test_hub_failures_name_the_repository_and_what_to_check(tiny_run, local_hub, capsys):
    local_hub.fail = True
    assert main(["push", str(tiny_run), "me/digits"]) == 2
    err = capsys.readouterr().err
    assert "'me/digits'" in err and "HF_TOKEN" in err and "ConnectionError" in err
    with pytest.raises(sharing.HubError, match="downloading 'me/absent'"):
        dmlkit.load("hf://me/absent")


def test_a_missing_hub_package_names_the_extra(tiny_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(MissingExtraError, match=r'sharing on the Hugging Face Hub needs .*pip install "dmlkit\[hub\]"'):
        sharing.push_run(tiny_run, "me/digits")


def test_push_of_a_folder_that_is_not_a_run_says_so(tmp_path, local_hub, capsys):
    assert main(["push", str(tmp_path), "me/digits"]) == 2
    assert "not a dmlkit run directory" in capsys.readouterr().err
    assert local_hub.created == []


def digit_pixels() -> torch.Tensor:
    """One 8x8 grey image, uint8 ``[1, 8, 8]``."""
    return torch.randint(0, 256, (1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))


def test_a_loaded_model_embeds_files_pil_images_arrays_and_tensors_as_its_run_embedder(tiny_run, tmp_path):
    from PIL import Image

    pixels = digit_pixels()
    image = Image.fromarray(pixels[0].numpy(), mode="L")
    image.save(tmp_path / "digit.png")
    model = dmlkit.load(tiny_run)
    assert isinstance(model, torch.nn.Module) and not model.training
    given = [str(tmp_path / "digit.png"), image, pixels[0].numpy(), pixels, pixels.float() / 255]
    got = model.embed(given)
    assert got.shape == (5, model.embedding_size) and got.dtype == torch.float32
    assert torch.allclose(got, got[:1].expand_as(got), atol=1e-6)  # the same pixels, however given
    assert torch.equal(got, RunEmbedder.from_run(tiny_run).embed(given))  # the one implementation: RunEmbedder's
    assert model.embed(image).shape == (1, model.embedding_size)  # one image, not a list
    batch = torch.stack([pixels, 255 - pixels])  # [2, 1, 8, 8]
    assert torch.allclose(model.embed(batch.permute(0, 2, 3, 1).numpy()), model.embed(batch), atol=1e-6)  # [N, H, W, C]
    assert model.fingerprint == RunEmbedder.from_run(tiny_run).fingerprint and model.run_dir == tiny_run.resolve()
    from dmlkit.index import Index

    index = Index.build(model, [image, 255 - pixels], labels=["a", "b"])  # an index takes the loaded model
    assert index.query(RunEmbedder.from_run(tiny_run), [image], k=1).ids[0, 0] == 0


def test_a_loaded_model_survives_a_deep_copy_and_a_hub_round_trip(tiny_run, local_hub):
    import copy

    model = dmlkit.load(tiny_run)
    expected = model.embed(images())
    twin = copy.deepcopy(model)
    assert twin.run_embedder.model is twin and twin.run_embedder is not model.run_embedder
    assert torch.equal(twin.embed(images()), expected)
    assert main(["push", str(tiny_run), "me/digits-embed"]) == 0
    assert torch.equal(dmlkit.load("hf://me/digits-embed").embed(images()), expected)


def test_a_built_model_says_embed_needs_a_loaded_one():
    from dmlkit.exceptions import InvalidParameterError
    from dmlkit.models import create_model

    model = create_model("small_cnn", embedding_size=8, in_chans=1)
    with pytest.raises(ConfigError, match=r"built, not loaded from a run.*dmlkit\.load"):
        model.embed(images())
    with pytest.raises(InvalidParameterError, match=r"embedded by a loaded model's embed: dmlkit\.load"):
        model.preprocess([images()[0]])
    assert model.run_dir is None


def test_embed_refuses_unknown_items_and_channel_counts(tiny_run):
    from dmlkit.exceptions import DataError

    model = dmlkit.load(tiny_run)
    with pytest.raises(DataError, match="image 1: expected a path, a PIL image, a numpy array or a tensor. Got dict"):
        model.embed([images()[0], {}])
    with pytest.raises(DataError, match=r"image 0 must be \[H, W\] or \[H, W, C\] with C = 1 or 3.*Got \(8, 8, 2\)"):
        model.embed([torch.zeros(8, 8, 2).numpy()])
