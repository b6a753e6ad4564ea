"""The PML-named data sets against pytorch-metric-learning's own classes on the same test-built trees:
same paths, labels, split sizes and items; PML's constructor; download=True through a loopback server."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from pytorch_metric_learning import datasets as pml_datasets

from dmlkit import datasets
from dmlkit.data.sources import DOWNLOADS, ArchiveSource

SPLITS = ("train", "test", "train+test")
#: Class names with a "/" (PML's folder names replace it by "-"), as in the real Cars196 names.
CAR_NAMES = [f"Make Model {c} 2012" if c != 3 else "Ram C/V Cargo Van Minivan 2012" for c in range(1, 197)]


def make_cars_pml(root: Path, image_writer) -> Path:
    """PML's Cars196 layout (the Kaggle copy): names.csv, anno_{train,test}.csv, car_data/car_data/<half>/<name>/."""
    root.mkdir(parents=True)
    (root / "names.csv").write_text("\n".join(CAR_NAMES) + "\n")
    k = 0
    for half, classes in (("train", (1, 3, 98, 99, 196)), ("test", (3, 98, 99, 150))):
        rows = []
        for cls in classes:
            for _ in range(2):
                k += 1
                rows.append(f"{k:05d}.jpg,1,2,9,9,{cls}")
                image_writer(root / "car_data" / "car_data" / half / CAR_NAMES[cls - 1].replace("/", "-") / f"{k:05d}.jpg", k)
        (root / f"anno_{half}.csv").write_text("\n".join(rows) + "\n")
    return root


def make_inaturalist(root: Path, image_writer) -> Path:
    """PML's iNaturalist 2018 layout: the two annotation files, the images and the Smooth-AP split lists."""
    root.mkdir(parents=True)
    split_lists = {"train": [], "test": []}
    image_id = 0
    for file, categories in (("train2018.json", (5, 7, 9)), ("val2018.json", (5, 11))):
        images, annotations = [], []
        for category in categories:
            for _ in range(2):
                image_id += 1
                name = f"train_val2018/Plantae/{category}/{image_id:04d}.jpg"
                image_writer(root / name, image_id)
                images.append({"id": image_id, "file_name": name})
                annotations.append({"id": 1000 + image_id, "image_id": image_id, "category_id": category})
                split_lists["train" if category in (5, 7) else "test"].append(name)
        (root / file).write_text(json.dumps({"images": images, "annotations": annotations}))
    (root / "Inat_dataset_splits").mkdir()
    for half, names in split_lists.items():
        (root / "Inat_dataset_splits" / f"Inaturalist_{half}_set1.txt").write_text("\n".join(names) + "\n")
    return root


@pytest.fixture
def trees(tmp_path, cub_factory, layout_makers, image_writer):
    return {
        "CUB": cub_factory(tmp_path / "cub", classes=(1, 2, 100, 101, 200)),  # both sides of PML's 100 | 101
        "StanfordOnlineProducts": layout_makers["sop"](tmp_path / "sop"),
        "Cars196": make_cars_pml(tmp_path / "cars", image_writer),
        "INaturalist2018": make_inaturalist(tmp_path / "inat", image_writer),
    }


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def assert_same(ours, theirs) -> None:
    assert len(ours) == len(theirs) > 0
    assert [os.path.normpath(p) for p in ours.paths] == [os.path.normpath(p) for p in theirs.paths]
    assert list(ours.labels) == list(theirs.labels)
    for i in range(len(theirs)):
        (image, label), (their_image, their_label) = ours[i], theirs[i]
        assert np.array_equal(image, their_image) and label == their_label


@pytest.mark.parametrize("name", ["CUB", "Cars196", "StanfordOnlineProducts", "INaturalist2018"])
@pytest.mark.parametrize("split", SPLITS)
def test_same_items_labels_and_split_sizes_as_pml(name, split, trees):
    kwargs = dict(split=split, transform=pixels, target_transform=lambda label: label * 10, download=False)
    ours = getattr(datasets, name)(str(trees[name]), **kwargs)
    theirs = getattr(pml_datasets, name)(str(trees[name]), **kwargs)
    assert_same(ours, theirs)


def test_split_sizes_follow_pmls_class_split(trees):
    """CUB: classes 1-100 train, 101-200 test; Cars196: 1-98 | 99-196 (the trees hold classes on both sides)."""
    cub = {s: datasets.CUB(trees["CUB"], split=s) for s in SPLITS}
    assert (len(cub["train"]), len(cub["test"]), len(cub["train+test"])) == (9, 6, 15)
    assert set(cub["train"].labels) == {1, 2, 100} and set(cub["test"].labels) == {101, 200}
    cars = {s: datasets.Cars196(trees["Cars196"], split=s) for s in SPLITS}
    assert set(cars["train"].labels) == {1, 3, 98} and set(cars["test"].labels) == {99, 150, 196}
    assert len(cars["train"]) + len(cars["test"]) == len(cars["train+test"]) == 18


def test_pmls_constructor_errors_are_value_errors(tmp_path, trees):
    for cls in (datasets.CUB, pml_datasets.CUB):
        with pytest.raises(ValueError):
            cls(trees["CUB"], split="val")
        with pytest.raises(ValueError):
            cls(tmp_path / "missing", download=False)
    with pytest.raises(ValueError, match="'split' parameter of CUB must be one of .*'train\\+test'.*Got 'val'"):
        datasets.CUB(trees["CUB"], split="val")


def test_cars196_also_reads_the_layout_dmlkit_downloads(cars_root):
    """cars_annos.mat + car_ims/ (classes 1, 2, 98 | 99, 196; two images each): PML's class split, .mat order."""
    split = {s: datasets.Cars196(cars_root, split=s) for s in SPLITS}
    assert (len(split["train"]), len(split["test"])) == (6, 4)
    assert split["train+test"].labels == [1, 1, 2, 2, 98, 98, 99, 99, 196, 196]
    assert split["train+test"].paths == sorted(split["train+test"].paths)


def test_download_true_fetches_into_an_empty_root_then_reads_as_pml(tmp_path, loopback, cub_factory, monkeypatch):
    built = cub_factory(tmp_path / "built")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(built / "CUB_200_2011", arcname="CUB_200_2011")
    loopback.files["/CUB_200_2011.tgz"] = buf.getvalue()
    archive = ArchiveSource("CUB_200_2011.tgz", (loopback.url("/CUB_200_2011.tgz"),),
                            md5=hashlib.md5(buf.getvalue()).hexdigest(), origin="test server")
    source = dataclasses.replace(DOWNLOADS.get("cub200"), archives=(archive,),
                                 expected={"train": (9, 3), "test": (6, 2)})
    monkeypatch.setattr(datasets.CUB, "source", source)
    root = tmp_path / "fresh"
    ours = datasets.CUB(str(root), split="test", transform=pixels, download=True)
    assert [p for p, _ in loopback.requests] == ["/CUB_200_2011.tgz"]
    assert_same(ours, pml_datasets.CUB(str(root), split="test", transform=pixels))
    datasets.CUB(str(root), split="train", download=True)  # not empty any more: nothing fetched again
    assert len(loopback.requests) == 1


def test_inaturalist_download_gives_the_manual_steps(tmp_path):
    with pytest.raises(ValueError, match="(?s)train_val2018.tar.gz.*Inat_dataset_splits"):
        datasets.INaturalist2018(tmp_path / "inat", download=True)
    assert not (tmp_path / "inat").exists()
