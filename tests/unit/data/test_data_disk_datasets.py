"""Parsing of each benchmark's official layout on tiny fixture trees; errors name files and layouts."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader

from dmlkit.data import build_splits, dataset_info, datasets_table, eval_transform, write_manifest
from dmlkit.exceptions import DataError, InvalidParameterError


def _label_names(ds):
    return [ds.class_names[i] for i in ds.labels.tolist()]


def test_cub_split_by_class_id(cub_root):
    splits = build_splits("cub200", cub_root, image_size=32)
    assert splits.train.class_names == ["001.Bird_1", "002.Bird_2", "003.Bird_3"]
    assert splits.test.class_names == ["101.Bird_101", "102.Bird_102"]
    assert len(splits.train) == 9 and len(splits.test) == 6
    assert splits.train.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for ds in (splits.train, splits.test):  # each path lives in its class folder
        assert all(f"/{name}/" in path for name, path in zip(_label_names(ds), ds.paths))
    image, label = splits.test[5]
    assert image.shape == (3, 32, 32) and label == 1


def test_cub_accepts_the_inner_folder_as_root(cub_root):
    assert len(build_splits("cub200", cub_root / "CUB_200_2011").train) == 9


def test_cub_2010_layout_is_recognised(tmp_path):
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "files.txt").write_text("001.Black_footed_Albatross/x.jpg\n")
    with pytest.raises(DataError, match="CUB_200_2011/images.txt' was not found. This looks like CUB-200 \\(2010\\)"):
        build_splits("cub200", tmp_path)


def test_cub_malformed_line_names_file_and_line(cub_root):
    path = cub_root / "CUB_200_2011" / "image_class_labels.txt"
    path.write_text(path.read_text() + "16 3 extra\n")
    with pytest.raises(DataError, match=r"line 16 of '.*image_class_labels.txt' has 3 fields but 2 were expected"):
        build_splits("cub200", cub_root)


def test_cars_mat_split_by_class_not_official_flag(cars_root):
    splits = build_splits("cars196", cars_root)
    assert splits.train.class_names == ["001 Make Model 1 2012", "002 Make Model 2 2012", "098 Make Model 98 2012"]
    assert [n[:3] for n in splits.test.class_names] == ["099", "196"]
    assert len(splits.train) == 6 and len(splits.test) == 4
    assert all(p.startswith(str(cars_root / "car_ims")) for p in splits.train.paths)


def test_cars_missing_mat_names_file_and_layout(tmp_path):
    with pytest.raises(DataError, match="cars_annos.mat' was not found.*car_ims"):
        build_splits("cars196", tmp_path)


def test_sop_reads_header_and_product_ids(sop_root):
    splits = build_splits("sop", sop_root, fold=1, num_folds=3, seed=0)
    assert len(splits.test) == 4 and splits.test.class_names == ["00004", "00005"]
    assert len(splits.train) + len(splits.val) == 6
    assert len(splits.val.class_names) == 1
    assert splits.test.paths[0].endswith("Stanford_Online_Products/chair_final/22222_0.JPG")


def test_inshop_query_gallery_share_one_label_space(inshop_root):
    splits = build_splits("inshop", inshop_root)
    assert splits.eval_mode == "query_gallery" and splits.test is None
    assert len(splits.train) == 6 and len(splits.query) == 3 and len(splits.gallery) == 6
    assert splits.query.class_names == splits.gallery.class_names
    assert splits.query.labels.tolist() == [0, 1, 2]
    assert splits.gallery.labels.tolist() == [0, 0, 1, 1, 2, 2]
    for ds in (splits.query, splits.gallery):
        assert all(name in path for name, path in zip(_label_names(ds), ds.paths))


def test_inshop_bad_status(inshop_root):
    path = inshop_root / "Eval" / "list_eval_partition.txt"
    path.write_text(path.read_text().replace("gallery", "galery", 1))
    with pytest.raises(DataError, match="evaluation_status 'galery'"):
        build_splits("inshop", inshop_root)


def test_omniglot_character_and_alphabet_labels(omniglot_root):
    chars = build_splits("omniglot", omniglot_root)
    # 8 characters pooled and sorted: Alpha(2) Beta(2) | Delta(2) Epsilon(1) Gamma(1)
    assert chars.train.class_names == ["Alpha/character01", "Alpha/character02", "Beta/character01", "Beta/character02"]
    assert len(chars.train) == 8 and len(chars.test) == 8
    eps = build_splits("omniglot", omniglot_root, label="alphabet", eval_label="character")
    assert eps.train.class_names == ["Alpha", "Beta"]  # 5 alphabets, split unit = alphabet
    assert {n.split("/")[0] for n in eps.test.class_names} == {"Delta", "Epsilon", "Gamma"}
    image, _ = eps.train[0]
    assert image.shape == (1, 20, 20)


def test_omniglot_background_evaluation_split(omniglot_root):
    splits = build_splits("omniglot_background", omniglot_root, label="alphabet")
    assert splits.train.class_names == ["Alpha", "Beta", "Gamma"]
    assert splits.test.class_names == ["Delta", "Epsilon"]


def test_omniglot_alphabet_folds_keep_alphabets_together(omniglot_root):
    splits = build_splits("omniglot_background", omniglot_root, label="alphabet", eval_label="character",
                          fold=0, num_folds=3)
    val_alphabets = {n.split("/")[0] for n in splits.val.class_names}
    assert len(val_alphabets) == 1 and not val_alphabets & set(splits.train.class_names)


def test_folder_halves_and_train_test_subfolders(tmp_path, image_writer):
    for cls in ("ant", "bee", "cat", "dog"):
        for k in range(2):
            image_writer(tmp_path / "flat" / cls / f"{k}.png", k)
            image_writer(tmp_path / "nested" / ("train" if cls < "c" else "test") / cls / f"{k}.jpg", k)
    flat = build_splits("folder", tmp_path / "flat", class_split="sorted")
    assert flat.train.class_names == ["ant", "bee"] and flat.test.class_names == ["cat", "dog"]
    nested = build_splits("folder", tmp_path / "nested")
    assert nested.test.class_names == ["cat", "dog"] and len(nested.train) == 4


def test_csv_manifest_with_split_and_root_escape(tmp_path, image_writer):
    for name in ("a1", "a2", "b1", "c1"):
        image_writer(tmp_path / "imgs" / f"{name}.png", 1)
    (tmp_path / "m.csv").write_text(
        "path,label,split\nimgs/a1.png,7,train\nimgs/a2.png,7,train\nimgs/b1.png,3,train\nimgs/c1.png,9,test\n"
    )
    splits = build_splits("csv", tmp_path / "m.csv")
    assert splits.train.class_names == ["3", "7"] and splits.train.labels.tolist() == [1, 1, 0]
    (tmp_path / "bad.csv").write_text("path,label\n../outside.png,1\nimgs/a1.png,2\n")
    with pytest.raises(DataError, match="line 2 of .*bad.csv' points outside"):
        build_splits("csv", tmp_path / "bad.csv")
    ok = build_splits("csv", tmp_path / "bad.csv", allow_outside_root=True, class_split="sorted")
    assert ok.train.paths[0].endswith("outside.png")
    with pytest.raises(InvalidParameterError, match="does not take the options"):
        build_splits("sop", tmp_path, allow_outside_root=True)


def test_unreadable_image_is_named_or_skipped(cub_root):
    bad = cub_root / "CUB_200_2011" / "images" / "001.Bird_1" / "Bird_1_0001_2.jpg"
    bad.write_bytes(b"not a jpeg")
    strict = build_splits("cub200", cub_root, image_size=16)
    with pytest.raises(DataError, match="Cannot read image '.*Bird_1_0001_2.jpg' \\(item 1 of cub200/train\\)"):
        strict.train[1]
    loader = DataLoader(strict.train, batch_size=3, num_workers=1)
    with pytest.raises(Exception, match="Bird_1_0001_2.jpg"):
        list(loader)
    lenient = build_splits("cub200", cub_root, skip_bad_images=True, train_transform=eval_transform(image_size=16))
    with pytest.warns(RuntimeWarning, match="Skipping unreadable image.*Bird_1_0001_2.jpg"):
        image, label = lenient.train[1]
    assert image.shape == (3, 16, 16) and label == 0
    assert torch.equal(image, lenient.train[2][0])  # the next image of the same class stands in


def test_files_skipped_per_item_are_gathered_from_every_split_and_its_subsets(cub_root):
    bad = cub_root / "CUB_200_2011" / "images" / "001.Bird_1" / "Bird_1_0001_2.jpg"
    bad.write_bytes(b"not a jpeg")
    splits = build_splits("cub200", cub_root, skip_bad_images=True, train_transform=eval_transform(image_size=16))
    assert splits.skipped_per_item() == []
    part = splits.train.subset(torch.tensor([0, 1, 3]))  # e.g. a validation split cut from the training split
    with pytest.warns(RuntimeWarning, match="Bird_1_0001_2.jpg"):
        part[1]
    assert splits.skipped_per_item() == [str(bad)]  # the subset reports into its source's record
    splits.train = part
    assert splits.skipped_per_item() == [str(bad)]


def test_missing_image_file_is_named_at_load(cub_root):
    (cub_root / "CUB_200_2011" / "images" / "101.Bird_101" / "Bird_101_0000_10.jpg").unlink()
    splits = build_splits("cub200", cub_root)
    with pytest.raises(DataError, match="Bird_101_0000_10.jpg"):
        splits.test[0]


def test_dataset_info_counts_and_problems(cub_root):
    info = dataset_info("cub200", cub_root)
    assert info["splits"] == {"train": {"images": 9, "classes": 3}, "test": {"images": 6, "classes": 2}}
    assert info["matches_published"] is False
    assert any("published split has 5,864 images of 100 classes" in p for p in info["problems"])
    (cub_root / "CUB_200_2011" / "images" / "102.Bird_102" / "Bird_102_0002_15.jpg").unlink()
    info = dataset_info("cub200", cub_root)
    assert any("1 of 6 image files listed for test are missing" in p for p in info["problems"])
    json.dumps(info)


def test_dataset_info_matches_published_for_mnist_and_reports_missing_root(tmp_path):
    assert dataset_info("mnist")["matches_published"] is True
    info = dataset_info("inshop", tmp_path)
    assert info["matches_published"] is False and "list_eval_partition.txt' was not found" in info["problems"][0]
    assert {row["dataset"] for row in datasets_table()} >= {"cub200", "cars196", "sop", "inshop", "omniglot", "mnist"}


def test_dataset_info_true_when_counts_match(tmp_path, monkeypatch, cub_factory):
    from dmlkit.data.registry import get_dataset_spec

    root = cub_factory(tmp_path, classes=(1, 101), per_class=2)
    monkeypatch.setitem(get_dataset_spec("cub200").published, "train", (2, 1))
    monkeypatch.setitem(get_dataset_spec("cub200").published, "test", (2, 1))
    info = dataset_info("cub200", root)
    assert info["matches_published"] is True and info["problems"] == []


def test_manifest_lists_paths(cub_root, tmp_path):
    splits = build_splits("cub200", cub_root, fold=0, num_folds=3)
    doc = json.loads(write_manifest(splits, tmp_path / "manifest.json").read_text())
    assert doc["splits"]["test"]["paths"] == splits.test.paths
    assert doc["splits"]["val"]["num_classes"] == 1


def test_disk_dataset_needs_root():
    with pytest.raises(InvalidParameterError, match="pass root=<directory>"):
        build_splits("sop")
