"""Photos end to end with data options only: a pretrained backbone, RGB kept, never worse than it.

Real photos: a few breeds of the Oxford-IIIT Pet sample in ../shared/data/pets (read, never copied into the repo;
the test folders hold links to them).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import yaml

PETS = Path(__file__).resolve().parents[3] / "shared" / "data" / "pets" / "images"


def link_folder(root: Path, assignment: dict[str, list[Path]]) -> Path:
    for class_name, files in assignment.items():
        (root / class_name).mkdir(parents=True, exist_ok=True)
        for i, file in enumerate(files):
            os.symlink(file, root / class_name / f"{i}{file.suffix}")
    return root


def breeds(first: int, last: int, per_class: int) -> dict[str, list[Path]]:
    names = sorted(p.name for p in PETS.iterdir() if p.is_dir())[first:last]
    return {name: sorted((PETS / name).iterdir())[:per_class] for name in names}


def train(*args: str) -> None:
    """``dmlkit train ARGS``, in this process (the CLI's own code path, without a second interpreter's imports)."""
    from dmlkit.cli.main import main

    assert main(["train", *args]) == 0


@pytest.fixture(scope="module")
def photo_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("photos")
    data = link_folder(base / "data", breeds(0, 8, 4))  # 5 breeds train (2 of them held out), 3 breeds test
    out = base / "run"
    train("--set", "data.name=folder", "--set", f"data.root={data}", "--set", "train.max_steps=2",
          "--quiet", "--no-report", "--out", str(out))
    return out, (out / "train.log").read_text()  # the recipe's choices with their reasons, also under --quiet


def test_photos_train_a_pretrained_backbone_on_rgb_with_its_preprocessing(photo_run):
    out, printed = photo_run
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    # the time budget picks Lite0, Lite1 or Lite2 (recipe/backbone_choice.py), printed with its reason
    assert cfg["model"]["name"] in ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")
    assert f"recipe:   model.name = {cfg['model']['name']}" in printed and "model.pretrained = True" in printed
    assert cfg["name"] == "folder-proxy-anchor"  # named after the data, not after the MNIST job
    assert cfg["model"]["args"] == {}
    assert cfg["model"]["embedding_size"] == 1280 and cfg["model"]["head_init"] == "identity"
    assert cfg["data"]["image_size"] == 288 and cfg["data"]["crop_size"] == 224 and cfg["data"]["augment"] == "crop"
    assert cfg["protocol"]["val_class_fraction"] == 0.4  # 5 training breeds: 2 held out to judge training
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["eval_input"]["view"] == "photo" and manifest["eval_input"]["input_size"] == [3, 288, 288]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["selected_on"] == "val" and isinstance(metrics["kept_pretrained"], bool)
    assert 0.0 < metrics["map_at_r"] <= 1.0


def test_the_run_embeds_with_the_backbones_own_normalisation(photo_run):
    import numpy as np
    import torch
    from PIL import Image

    from dmlkit.inference import RunEmbedder
    from dmlkit.models import LITE0_PRETRAINED_CFG

    out, _ = photo_run
    embedder = RunEmbedder.from_run(out)
    assert embedder.model.pretrained_cfg["mean"] == LITE0_PRETRAINED_CFG["mean"]  # TF scaling (x - 127) / 128
    saved = np.load(out / "embeddings" / "test.npz", allow_pickle=False)
    paths = json.loads((out / "manifest.json").read_text())["test"]["paths"]
    # by hand: shorter side 329 (bicubic), centre 288 x 288, RGB, (x - 127) / 128, then the model
    with Image.open(paths[0]) as img:
        img = img.convert("RGB")
        short = min(img.size)
        w, h = round(img.size[0] * 329 / short), round(img.size[1] * 329 / short)
        img = img.resize((w, h), Image.BICUBIC)
        left, top = int(round((w - 288) / 2.0)), int(round((h - 288) / 2.0))
        pixels = torch.from_numpy(np.asarray(img.crop((left, top, left + 288, top + 288)))).permute(2, 0, 1).float()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        by_hand = embedder.model.eval()(((pixels - 127) / 128)[None])
    assert torch.allclose(by_hand[0], torch.from_numpy(saved["embeddings"][0]), atol=2e-2)


def test_training_that_cannot_help_keeps_the_pretrained_embedding(tmp_path):
    files = [f for group in breeds(0, 6, 6).values() for f in group]
    random.Random(0).shuffle(files)  # training labels that say nothing about the pictures
    data = tmp_path / "data"
    link_folder(data / "train", {f"group{c}": files[c * 6:(c + 1) * 6] for c in range(6)})
    link_folder(data / "test", breeds(6, 10, 4))
    out = tmp_path / "run"
    train("--set", "data.name=folder", "--set", f"data.root={data}", "--set", "data.image_size=128",
          "--set", "train.max_steps=6", "--set", "train.eval_every=2", "--set", "optimizer.lr=0.001",
          "--quiet", "--no-report", "--out", str(out))
    assert "kept the pretrained embedding" in (out / "train.log").read_text()
    metrics = json.loads((out / "metrics.json").read_text())
    # the recipe's train.patience=2: two validations without a significant gain stop it at step 4 of 6
    assert metrics["kept_pretrained"] is True and metrics["best_step"] == 0 and metrics["steps"] == 4
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    gains = [r for r in log if r.get("split") == "val" and r["step"] > 0]
    assert len(gains) == 2 and all("gain_over_pretrained" in r and "gain_over_reference" in r for r in gains)
