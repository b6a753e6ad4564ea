"""Users' own data as they bring it: a seeded random class split recorded in the run, OML's CSV
format, the CSV's outside-root choice from the config, and messages that name what to change."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch
from PIL import Image

from dmlkit.cli.index import not_indexed
from dmlkit.config import load_config
from dmlkit.data.folder import classes_tested, read_csv_manifest, read_folder
from dmlkit.data.splits import build_splits
from dmlkit.engine.batches import build_batch_sampler
from dmlkit.engine.run_dir import split_manifest
from dmlkit.exceptions import DataError
from dmlkit.recipe.survey import survey_data

CLASSES = ["abyssinian", "beagle", "boxer", "persian", "pug", "sphynx"]


def image(path, value: int = 0) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 6, 3), value, dtype=np.uint8)).save(path)
    return str(path)


def folder(root, classes=CLASSES, per_class=2):
    for c, name in enumerate(classes):
        for i in range(per_class):
            image(root / name / f"{i}.png", 20 * c + i)
    return root


def train_classes(sources) -> set[str]:
    return set(sources["train"].names["class"])


def test_a_folder_splits_a_seeded_random_draw_of_its_classes(tmp_path):
    folder(tmp_path)  # 6 classes, fewer than 20: a third of them (2) test, 4 train
    drawn = train_classes(read_folder(tmp_path, split_seed=0))
    assert drawn == set(random.Random(0).sample(sorted(CLASSES), 6)[:4])
    assert drawn != {"abyssinian", "beagle", "boxer", "persian"}  # not the alphabetical first ones
    assert drawn == train_classes(read_folder(tmp_path, split_seed=0))  # one seed, one split
    assert train_classes(read_folder(tmp_path, class_split="sorted")) == {"abyssinian", "beagle", "boxer", "persian"}


def test_the_split_follows_protocol_seed_and_is_recorded(tmp_path):
    folder(tmp_path)
    cfg = load_config(overrides=[f"data.root={tmp_path}", "protocol.seed=3"])
    splits = survey_data(cfg)
    few = "2 of the 6 classes test: a third, not half, below 20 classes, so that enough classes are left to train on"
    assert splits.info["class_split"] == {"mode": "random", "seed": 3, "test_classes": few}
    manifest = split_manifest(splits)
    assert manifest["class_split"] == {"mode": "random", "seed": 3, "test_classes": few}
    expected = set(random.Random(3).sample(sorted(CLASSES), 6)[:4])
    assert set(manifest["train"]["class_names"]) == expected
    sorted_cfg = load_config(overrides=[f"data.root={tmp_path}", "data.class_split=sorted"])
    assert set(survey_data(sorted_cfg).train.class_names) == {"abyssinian", "beagle", "boxer", "persian"}


@pytest.mark.parametrize("classes, tested", [(2, 1), (3, 2), (4, 2), (6, 2), (12, 4), (19, 6), (20, 10), (37, 19),
                                             (81, 41)])
def test_fewer_than_20_classes_test_a_third_of_them_and_more_test_half(tmp_path, classes, tested):
    """Half the classes test from 20 up (the benchmarks' protocol: Pets' 37 breeds 18 + 19, as before); below,
    a third (at least 2, at least 1 left to train), so 12 classes train on 8, not 6."""
    names = [f"c{i:02d}" for i in range(classes)]
    for name in names:  # the split reads names only; nothing is decoded
        (tmp_path / name).mkdir()
        (tmp_path / name / "0.png").touch()
    sources = read_folder(tmp_path, class_split="sorted")
    assert len(set(sources["test"].names["class"])) == tested == classes_tested(classes)
    assert train_classes(sources) == set(names[: classes - tested])  # the first ones by name train, as before
    assert ("test_classes" in sources["train"].class_split) == (classes < 20)  # the reason, said with the split


def test_a_small_folder_says_its_split_before_training(tmp_path):
    """12 classes of 5 photos: 8 train, 4 test; the split line says classes, images and the share that trains."""
    names = [f"class{i:02d}" for i in range(12)]
    folder(tmp_path, names, per_class=5)
    splits = build_splits("folder", tmp_path, class_split="sorted")
    assert splits.describe() == ("8 classes (40 images) train, 4 classes (20 images) test; 67% of the 60 images train "
                                 "(4 of the 12 classes test: a third, not half, below 20 classes, so that enough classes "
                                 "are left to train on)")


def test_an_oml_csv_reads_with_validation_rows_and_extra_columns(tmp_path, caplog):
    lines = ["label,path,split,is_query,is_gallery,category,x_1,y_1,x_2,y_2"]
    for c in range(4):
        for i in range(2):
            lines.append(f"{c},{image(tmp_path / f'tr{c}{i}.png', c)},train,,,cat,0,0,5,5")
    for c in range(4, 6):
        for i in range(2):
            lines.append(f"{c},{image(tmp_path / f'va{c}{i}.png', c)},validation,True,True,cat,0,0,5,5")
    (tmp_path / "df.csv").write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="dmlkit.data"):
        sources = read_csv_manifest(tmp_path / "df.csv")
    assert len(sources["train"].paths) == 8 and len(sources["query"].paths) == len(sources["gallery"].paths) == 4
    assert "x_1, y_1, x_2, y_2 are not read" in caplog.text


def test_outside_root_is_a_config_setting(tmp_path):
    outside = [image(tmp_path / "elsewhere" / f"{c}{i}.png", c) for c in range(4) for i in range(2)]
    (tmp_path / "csv").mkdir()
    rows = [f"{path},{path[-6]}" for path in outside]
    (tmp_path / "csv" / "manifest.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    with pytest.raises(DataError, match="set data.allow_outside_root=true"):
        survey_data(load_config(overrides=["data.name=csv", f"data.root={tmp_path / 'csv'}"]))
    cfg = load_config(overrides=["data.name=csv", f"data.root={tmp_path / 'csv'}", "data.allow_outside_root=true"])
    assert len(survey_data(cfg).train) == 4


def test_images_without_class_folders_are_asked_for_class_folders(tmp_path):
    for i in range(3):
        image(tmp_path / f"{i}.jpg")
    with pytest.raises(DataError, match="holds 3 images directly, and no class sub-folders: put each class's images"):
        read_folder(tmp_path)


def test_too_few_classes_names_the_split(tmp_path):
    folder(tmp_path, classes=["cat", "dog"], per_class=4)
    labels = build_splits("folder", tmp_path).train.labels
    cfg = load_config(overrides=["sampler.batch_size=4", "sampler.m=2"])
    with pytest.raises(DataError, match="The train split has 1 class; metric learning needs at least 2 classes"):
        build_batch_sampler(cfg, labels)
    with pytest.raises(DataError, match=r"train split has 3 classes; sampler.batch_size=8 with sampler.m=2 needs 4"):
        build_batch_sampler(load_config(overrides=["sampler.batch_size=8", "sampler.m=2"]), torch.arange(12) % 3)


def test_an_unreadable_image_points_at_skip_bad_images(tmp_path):
    folder(tmp_path, classes=["a", "b", "c", "d"])
    (tmp_path / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    with pytest.raises(DataError, match=r"broken\.jpg.*set data\.skip_bad_images=true"):
        build_splits("folder", tmp_path, class_split="sorted", cache_in_memory=True)


class Index:
    paths = ["/g/a.png", "/g/b.png"]


def test_index_add_skips_images_already_indexed():
    paths, labels, already = not_indexed(Index(), ["/g/a.png", "/g/c.png", "/g/b.png"], ["x", "y", "z"])
    assert (paths, labels, already) == (["/g/c.png"], ["y"], 2)
