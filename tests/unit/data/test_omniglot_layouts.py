"""Omniglot as users have it: one set folder alone, the zip files, or the zip itself as the root."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from dmlkit.data import build_splits
from dmlkit.exceptions import DataError

from .conftest import make_omniglot


def _zip_folder(folder, zip_path, arcroot):
    with zipfile.ZipFile(zip_path, "w") as z:
        for path in sorted(folder.rglob("*.png")):
            z.write(path, f"{arcroot}/{path.relative_to(folder)}")


def test_single_set_folder_without_omniglot_py(tmp_path):
    make_omniglot(tmp_path / "full")
    only = tmp_path / "only"
    shutil.copytree(tmp_path / "full" / "omniglot-py" / "images_background", only / "images_background_small1")
    splits = build_splits("omniglot", only)
    names = splits.train.class_names + splits.test.class_names
    assert {n.split("/")[0] for n in names} == {"Alpha", "Beta", "Gamma"}  # the background set's alphabets
    assert splits.train.class_names == sorted(splits.train.class_names)
    assert max(splits.train.class_names) < min(splits.test.class_names)  # first half of the sorted characters


def test_zip_files_in_root_and_zip_as_root_give_the_folder_split(tmp_path):
    make_omniglot(tmp_path / "full")
    base = tmp_path / "full" / "omniglot-py"
    zips = tmp_path / "zips"
    zips.mkdir()
    for set_name in ("images_background", "images_evaluation"):
        _zip_folder(base / set_name, zips / f"{set_name}.zip", set_name)
    from_folders = build_splits("omniglot", tmp_path / "full")
    from_zips = build_splits("omniglot", zips)
    assert from_zips.train.class_names == from_folders.train.class_names
    assert from_zips.test.class_names == from_folders.test.class_names
    assert torch.equal(from_zips.train.labels, from_folders.train.labels)
    x_zip, _ = from_zips.train[0]
    x_dir, _ = from_folders.train[0]
    assert x_zip.shape == x_dir.shape == (1, 20, 20)
    torch.testing.assert_close(x_zip, x_dir)  # same pixels, decoded from the zip in memory
    one = build_splits("omniglot", zips / "images_background.zip", image_size=8)
    assert one.train[0][0].shape == (1, 8, 8)
    assert {n.split("/")[0] for n in one.train.class_names + one.test.class_names} == {"Alpha", "Beta", "Gamma"}


#: The shipped Omniglot sample, beside the repository (../shared/data, as the project's brief lays it out).
OMNIGLOT_ZIP = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "omniglot" / "images_background_small1.zip"


def test_real_omniglot_zip_reads_136_characters():
    splits = build_splits("omniglot", OMNIGLOT_ZIP, label="character", image_size=28)
    assert len(splits.train.class_names) == len(splits.test.class_names) == 68
    assert len(splits.train) == len(splits.test) == 1360
    image, _ = splits.train[0]
    assert image.shape == (1, 28, 28) and float(image.max()) <= 1.0


def test_missing_sets_name_what_was_looked_for(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"images_background\[\.zip\].*images_background_small1\[\.zip\]"):
        build_splits("omniglot", tmp_path / "empty")
    (tmp_path / "bad.zip").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="cannot open zip file"):
        build_splits("omniglot", tmp_path / "bad.zip")
    make_omniglot(tmp_path / "full")
    shutil.rmtree(tmp_path / "full" / "omniglot-py" / "images_evaluation")
    with pytest.raises(DataError, match="omniglot_background needs both official sets"):
        build_splits("omniglot_background", tmp_path / "full")
