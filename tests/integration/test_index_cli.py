"""`dmlkit index` and `dmlkit search` end to end on three runs: a small CNN at 28 px, a folder run
trained at 16 px, and a pretrained photo backbone. A gallery image queried comes back first at
distance < 1e-3 and its query embedding equals the run's saved test embedding."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image, ImageOps

from dmlkit.cli.main import main
from dmlkit.inference import RunEmbedder

QUIET = ["--quiet", "--no-report", "--set", "eval.clustering=false"]


def _images(root, classes, per_class, size, mode, seed, vary=False):
    rng = np.random.default_rng(seed)
    for c in range(classes):
        base = np.array([c * 30, 255 - c * 30, (c * 70) % 255], dtype=np.int64)
        for k in range(per_class):
            h, w = (rng.integers(size, size + 30, 2) if vary else (size, size))
            img = (base + rng.integers(0, 50, (h, w, 3))).clip(0, 255).astype(np.uint8)
            path = root / f"class{c}" / f"{k}.{'jpg' if vary else 'png'}"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).convert(mode).save(path)
    return root


RUNS = {
    # small CNN at the images' own 28 px (grey files decoded into memory); the recipe's ensemble of 5, each member
    # embedding as the mean over 9 shifts (the recipe's 25 made every embedding of this run 25 times a plain one)
    "cnn28": (dict(classes=6, per_class=5, size=28, mode="L", seed=0),
              ["--set", "train.max_steps=3", "--set", "model.shift_average=1"]),
    # a folder of 24-px colour images trained at data.image_size=16: the recipe's ensemble of 5, without shifts
    "folder16": (dict(classes=8, per_class=5, size=24, mode="RGB", seed=1),  # 3 test classes: a gallery of 15
                 ["--set", "data.image_size=16", "--set", "train.max_steps=3", "--set", "model.shift_average=0"]),
    # a pretrained photo backbone on photos of different sizes (read per file, resize + centre crop)
    "photo": (dict(classes=4, per_class=3, size=40, mode="RGB", seed=2, vary=True),
              ["--set", "model.name=efficientnet_lite0", "--set", "model.pretrained=true", "--set", "model.args={}",
               "--set", "train.max_steps=1"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, (data, extra) in RUNS.items():
        base = tmp_path_factory.mktemp(name)
        root = _images(base / "data", **data)
        run_dir = base / "run"
        assert main(["train", "--set", "data.name=folder", "--set", f"data.root={root}", *QUIET, *extra,
                     "--out", str(run_dir)]) == 0
        saved = np.load(run_dir / "embeddings" / "test.npz")
        gallery = base / "gallery.csv"
        gallery.write_text("path,label\n" + "".join(
            f"{p},{os.path.basename(os.path.dirname(p))}\n" for p in saved["paths"]))
        out[name] = (run_dir, gallery, saved)
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_a_gallery_image_finds_itself_and_embeds_as_the_run_did(name, runs, tmp_path, capsys):
    run_dir, gallery, saved = runs[name]
    paths = [str(p) for p in saved["paths"]]
    embedder = RunEmbedder.from_run(run_dir)
    np.testing.assert_allclose(embedder.embed(paths).numpy(), saved["embeddings"], atol=1e-5)
    np.testing.assert_allclose(embedder.embed(paths[4:5]).numpy(), saved["embeddings"][4:5], atol=1e-5)  # alone

    index = tmp_path / "g.index"
    assert main(["index", "build", str(run_dir), "--images", str(gallery), "--out", str(index)]) == 0
    capsys.readouterr()
    assert main(["index", "query", str(index), paths[4], paths[0], "-k", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for query, want in zip(doc["queries"], (paths[4], paths[0])):
        first = query["neighbours"][0]
        assert query["query"] == want and first["path"] == want and first["distance"] < 1e-3
        assert first["label"] == os.path.basename(os.path.dirname(want)) and "match" not in first

    npz = tmp_path / "g.npz"
    assert main(["embed", str(run_dir), "--out", str(npz)]) == 0
    capsys.readouterr()
    assert main(["search", "--gallery", str(npz), "--run", str(run_dir), paths[4], "-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"  1. {paths[4]} ") and float(lines[1].rsplit("distance=", 1)[1]) < 1e-3


def test_build_add_query_remove_with_threshold_and_text_output(runs, tmp_path, capsys):
    run_dir, gallery, saved = runs["folder16"]
    paths = [str(p) for p in saved["paths"]]
    index = tmp_path / "g.index"
    first_half = tmp_path / "first.csv"
    first_half.write_text("\n".join(gallery.read_text().splitlines()[:11]) + "\n")  # header + 10 images
    assert main(["index", "build", str(run_dir), "--images", str(first_half), "--out", str(index),
                 "--threshold-fmr", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "indexed 10 images (flat" in out and "threshold at FMR 0.1" in out
    assert main(["index", "add", str(index), "--images", str(gallery)]) == 0  # the 10 indexed ones are skipped
    out = capsys.readouterr().out
    assert f"added {len(paths) - 10} images (ids 10-{len(paths) - 1}); 10 images already in the index were skipped" in out
    assert main(["index", "add", str(index), "--images", str(gallery)]) == 0
    assert f"nothing added: all {len(paths)} images are already in the index" in capsys.readouterr().out
    assert main(["index", "remove", str(index), "0", "1"]) == 0
    assert "removed 2 items" in capsys.readouterr().out
    assert main(["index", "query", str(index), paths[12], "-k", "2"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == paths[12]
    assert text[1].startswith(f"  1. {paths[12]} id=12 ") and "match=yes" in text[1]


def test_an_interrupted_add_leaves_the_previous_index_intact(runs, tmp_path, monkeypatch, capsys):
    run_dir, gallery, _ = runs["cnn28"]
    index = tmp_path / "g.index"
    first = tmp_path.parent / f"{tmp_path.name}-first.csv"  # outside tmp_path, whose listing is checked below
    first.write_text("\n".join(gallery.read_text().splitlines()[:6]) + "\n")  # header + 5 images: the add has new ones
    assert main(["index", "build", str(run_dir), "--images", str(first), "--out", str(index)]) == 0
    before = index.read_bytes()

    def fail(fd):  # the new index is written to a temp file; the failure comes before the rename
        raise OSError("power cut (injected)")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="injected"):
        main(["index", "add", str(index), "--images", str(gallery)])
    monkeypatch.undo()
    assert index.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["g.index"]
    capsys.readouterr()
    assert main(["index", "query", str(index), str(gallery.parent / "data"), "-k", "1"]) == 2  # a folder is no image
    assert "Cannot read query image" in capsys.readouterr().err


def test_a_query_from_another_run_is_refused(runs, tmp_path, capsys):
    run_dir, gallery, saved = runs["cnn28"]
    other, _, _ = runs["folder16"]
    index = tmp_path / "g.index"
    assert main(["index", "build", str(run_dir), "--images", str(gallery), "--out", str(index)]) == 0
    capsys.readouterr()
    assert main(["index", "query", str(index), str(saved["paths"][0]), "--run", str(other)]) == 2
    assert "the model does not match the index" in capsys.readouterr().err


def test_classify_labels_a_gallery_image_by_its_own_class(runs, tmp_path, capsys):
    run_dir, gallery, saved = runs["folder16"]
    paths = [str(p) for p in saved["paths"]]
    index = tmp_path / "g.index"
    assert main(["index", "build", str(run_dir), "--images", str(gallery), "--out", str(index)]) == 0
    capsys.readouterr()
    assert main(["index", "classify", str(index), paths[4], "-k", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (query,) = doc["queries"]
    assert query["label"] == os.path.basename(os.path.dirname(paths[4])) and query["confidence"] == 1.0
    assert doc["threshold"] is None and query["unknown"] is False
    assert main(["index", "classify", str(index), paths[4], "--threshold", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{paths[4]}: {query['label']} confidence=") and lines[1].startswith("threshold: cosine")
    with pytest.raises(SystemExit):
        main(["index", "classify", str(index), paths[4], "--fmr", "0.1", "--threshold", "0.5"])


def test_add_labels_a_class_folder_and_classify_names_an_unlabelled_nearest_item(runs, tmp_path, capsys):
    import shutil

    run_dir, gallery, saved = runs["folder16"]
    paths = [str(p) for p in saved["paths"]]
    index = tmp_path / "g.index"
    assert main(["index", "build", str(run_dir), "--images", str(gallery), "--out", str(index)]) == 0
    label = os.path.basename(os.path.dirname(paths[0]))
    copies = {}
    for name, source in ((label, paths[0]), ("newitems", paths[1]), ("fresh", paths[2])):
        folder = tmp_path / name  # a flat folder: images directly inside, no class sub-folders
        folder.mkdir()
        copies[name] = shutil.copy(source, folder / "copy.png")
    # the unlabelled item is an image the gallery lacks (inverted colours), so its nearest item is itself
    ImageOps.invert(Image.open(copies["newitems"]).convert("RGB")).save(copies["newitems"])
    capsys.readouterr()
    assert main(["index", "add", str(index), "--images", str(tmp_path / label)]) == 0
    assert f"labelled them {label!r}: the folder holds images only" in capsys.readouterr().out
    assert main(["index", "add", str(index), "--images", str(tmp_path / "fresh"), "--label", "fresh"]) == 0
    assert "labelled 'fresh' (--label)" in capsys.readouterr().out
    assert main(["index", "add", str(index), "--images", str(tmp_path / "newitems")]) == 0
    assert "1 of them have no label" in capsys.readouterr().out
    from dmlkit.index import Index

    labels = dict(zip(Index.load(index).paths, Index.load(index).labels))
    assert labels[str(copies[label])] == label and labels[str(copies["fresh"])] == "fresh"
    assert labels[str(copies["newitems"])] is None

    assert main(["index", "classify", str(index), str(copies["newitems"]), "-k", "1"]) == 0
    line = capsys.readouterr().out.strip()
    assert line == f"{copies['newitems']}: no label: nearest item is unlabelled, score 1.0000, and no labelled item " \
                   "among the 1 nearest voted" and "unknown" not in line
    assert main(["index", "classify", str(index), str(copies["newitems"]), "-k", "3", "--json"]) == 0
    (query,) = json.loads(capsys.readouterr().out)["queries"]
    assert query["nearest_unlabelled"] is True and query["unknown"] is False and query["label"] is not None


def test_export_to_a_database_and_search_it_as_the_index(runs, tmp_path, capsys):
    run_dir, gallery, saved = runs["folder16"]
    other, _, _ = runs["cnn28"]
    paths = [str(p) for p in saved["paths"]]
    index = tmp_path / "g.index"
    assert main(["index", "build", str(run_dir), "--images", str(gallery), "--out", str(index)]) == 0
    before = index.read_bytes()
    uri = f"qdrant:{tmp_path / 'db'}?collection=gallery"
    capsys.readouterr()
    assert main(["index", "export", str(index), "--to", uri, "--batch-size", "7"]) == 0
    assert f"exported {len(paths)} items to collection 'gallery'" in capsys.readouterr().out
    assert main(["index", "export", str(index), "--to", uri]) == 0  # again: nothing written twice
    assert f"exported 0 items to collection 'gallery' at qdrant:{tmp_path / 'db'}; {len(paths)} were already there; " \
           f"it holds {len(paths)}" in capsys.readouterr().out
    assert index.read_bytes() == before

    assert main(["index", "query", str(index), paths[4], "-k", "3", "--json"]) == 0
    want = json.loads(capsys.readouterr().out)["queries"][0]["neighbours"]
    assert main(["search", "--index", uri, paths[4], "-k", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["queries"][0]["neighbours"]
    assert [n["id"] for n in got] == [n["id"] for n in want] and got[0]["path"] == paths[4]
    assert [n["label"] for n in got] == [n["label"] for n in want]
    assert got[0]["score"] == pytest.approx(want[0]["score"], abs=1e-5)

    assert main(["search", "--index", uri, "--run", str(other), paths[4]]) == 2
    assert "was written by another model" in capsys.readouterr().err
    assert main(["index", "export", str(other), "--images", str(gallery), "--to", uri]) == 2
    assert "was written by another model" in capsys.readouterr().err
    assert main(["index", "export", str(run_dir), "--images", str(gallery), "--to", f"qdrant:{tmp_path / 'db'}"]) == 0
    assert f"exported {len(paths)} items to collection 'dmlkit'" in capsys.readouterr().out
    assert main(["index", "export", str(run_dir), "--to", uri]) == 2
    assert "give --images DIR_OR_CSV" in capsys.readouterr().err
