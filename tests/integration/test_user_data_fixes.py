"""A new user's small image folders: bad files, validation images, one image per class, paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dmlkit.cli.main import main

# the fixtures are noise images, which the recipe reads as photos: these tests are about data handling, so
# they name the small CNN (trained from scratch at the images' own size) instead of the pretrained backbone
QUICK = ["--quiet", "--no-report", "--set", "train.max_steps=4", "--set", "model.ensemble=1",
         "--set", "model.shift_average=0", "--set", "eval.clustering=false", "--set", "model.name=small_cnn"]


def make_folder(root: Path, classes: int, per_class: int, size=lambda c, k: 16) -> Path:
    for c in range(classes):
        for k in range(per_class):
            side = size(c, k)
            pixels = np.random.default_rng(100 * c + k).integers(0, 256, (side, side, 3), dtype=np.uint8)
            path = root / f"c{c:02d}" / f"{k}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(path)
    return root


def test_skip_bad_images_skips_files_decoded_into_memory_and_records_them(tmp_path, capsys):
    data = make_folder(tmp_path / "data", 8, 6)
    truncated = data / "c01" / "2.png"
    truncated.write_bytes(truncated.read_bytes()[:100])
    (data / "c06" / "0.png").write_text("not an image")  # 8 classes: c00..c04 train, c05..c07 test (sorted)
    out = tmp_path / "run"
    with pytest.warns(RuntimeWarning, match="Skipping unreadable image"):
        code = main(["train", "--out", str(out), *QUICK, "--set", "data.name=folder",
                     "--set", f"data.root={data}", "--set", "data.skip_bad_images=true", "--set", "data.class_split=sorted"])
    assert code == 0
    skipped = sorted([str(truncated), str(data / "c06" / "0.png")])
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["skipped_images"]["paths"]) == skipped and manifest["skipped_images"]["count"] == 2
    assert manifest["train"]["size"] == 29 and manifest["test"]["size"] == 17  # 30 and 18, one file left out of each
    assert str(truncated) not in manifest["train"]["paths"]
    record = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    assert record["kind"] == "data" and record["skipped_images"] == 2 and sorted(record["paths"]) == skipped


def test_skip_bad_images_counts_files_read_per_item_in_the_log_and_manifest(tmp_path, capsys):
    import io

    data = make_folder(tmp_path / "data", 8, 8, size=lambda c, k: 20 + k)  # mixed sizes: read per item
    truncated = data / "c01" / "2.png"  # c00..c04 train, c05..c07 test (data.class_split=sorted)
    truncated.write_bytes(truncated.read_bytes()[:100])
    (data / "c01" / "7.png").unlink()
    text = data / "c01" / "7.jpg"
    text.write_text("not an image")
    jpeg = io.BytesIO()
    Image.fromarray(np.full((24, 24, 3), 90, dtype=np.uint8)).save(jpeg, format="JPEG")
    cut = data / "c06" / "8.jpg"
    cut.write_bytes(jpeg.getvalue()[:120])
    out = tmp_path / "run"
    # one batch of every class with all its 8 images reads the whole training split in the one step
    with pytest.warns(RuntimeWarning, match="Skipping unreadable image"):
        code = main(["train", "--out", str(out), *QUICK, "--set", "train.max_steps=1", "--set", "sampler.m=8",
                     "--set", "sampler.batch_size=40", "--set", "data.name=folder", "--set", f"data.root={data}",
                     "--set", "data.skip_bad_images=true", "--set", "data.class_split=sorted"])
    assert code == 0
    skipped = sorted([str(truncated), str(text), str(cut)])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["skipped_images"] == {"count": 3, "paths": skipped}
    assert manifest["train"]["size"] == 40 and manifest["test"]["size"] == 25  # read per item: kept, replaced
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    data_records = [r for r in records if r["kind"] == "data"]
    assert data_records == [{"kind": "data", "step": 1, "skipped_images": 3, "paths": skipped}]
    assert "skipped 3 unreadable image(s) read per item" in capsys.readouterr().err  # a warning: shown under --quiet
    with pytest.warns(RuntimeWarning, match="Skipping unreadable image"):
        assert main(["evaluate", str(out)]) == 0  # the test split again: its bad file is in the evaluation's record
    evaluation = json.loads(next((out / "evaluations").glob("*-test.json")).read_text())
    assert evaluation["skipped_images"] == {"count": 1, "paths": [str(cut)]}


def test_validation_images_held_out_per_class_get_the_evaluation_transform(tmp_path):
    from dmlkit.config import load_config
    from dmlkit.engine.splits import build_splits

    data = make_folder(tmp_path / "data", 4, 6, size=lambda c, k: 20 + k)  # mixed sizes: decoded per item
    cfg = load_config(overrides=["data.name=folder", f"data.root={data}", "protocol.val_fraction=0.5"])
    splits = build_splits(cfg, None)
    assert splits.val.paths is not None and not hasattr(splits.val, "images")  # the per-item path
    assert splits.val.transform is splits.test.transform and splits.val.augmentation_seed is None
    splits.val.set_epoch(0)
    first = splits.val[0][0]
    splits.val.set_epoch(3)
    assert torch.equal(first, splits.val[0][0])  # no random crop or flip


def test_one_image_per_class_trains_with_batches_of_distinct_classes(tmp_path, capsys):
    data = make_folder(tmp_path / "data", 8, 1)
    code = main(["train", "--out", str(tmp_path / "run"), *QUICK, "--set", "data.name=folder",
                 "--set", f"data.root={data}"])
    assert code == 0
    printed = (tmp_path / "run" / "train.log").read_text()  # the recipe's reasons, whatever the console showed
    assert "recipe:   sampler.m = 1  (1 image per class: batches of distinct classes" in printed
    assert "recipe:   sampler.batch_size = 5" in printed  # 8 classes: 5 train


def test_evaluate_and_embed_the_validation_classes_the_recipe_chose(tmp_path, capsys):
    data = make_folder(tmp_path / "data", 40, 3, size=lambda c, k: 8)
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *QUICK, "--set", "data.name=folder", "--set", f"data.root={data}"]) == 0
    assert "protocol.val_class_fraction = 0.2" in (run / "train.log").read_text()
    assert main(["evaluate", str(run), "--split", "val"]) == 0
    val = json.loads(next((run / "evaluations").glob("*-val.json")).read_text())
    assert 0.0 < val["map_at_r"] <= 1.0
    out = tmp_path / "val.npz"
    assert main(["embed", str(run), "--split", "val", "--out", str(out)]) == 0
    saved = np.load(out)
    assert len(saved["embeddings"]) == 12  # 4 of the 20 training classes, 3 images each
    classes = {Path(p).parent.name for p in saved["paths"]}
    assert len(classes) == 4 and all(Path(p).is_file() for p in saved["paths"])  # file names, not row numbers
