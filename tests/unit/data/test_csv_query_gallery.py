"""CSV manifests with is_query/is_gallery and category: read by header, checked, evaluated query -> gallery."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from dmlkit.config import load_config
from dmlkit.data.splits import build_splits
from dmlkit.exceptions import DataError
from dmlkit.losses import ContrastiveLoss
from dmlkit.recipe import Trainer
from dmlkit.report import write_report

# the rows of tests/unit/evaluation/test_query_gallery_overlap.py (hand-computed there), as image files
ROWS = [(0.0, "A", 1, 1, "shoes"), (1.0, "A", 1, 1, "shoes"), (1.6, "B", 0, 1, "bags"), (3.0, "B", 1, 1, "bags"),
        (2.1, "A", 0, 1, "shoes"), (3.5, "B", 1, 0, "bags")]
TRAIN = [("C", 0.2), ("C", 0.4), ("D", 2.6), ("D", 2.8)]


def solid(path, position: float) -> str:
    """A grey image whose red level encodes ``position`` (the test model's 1-D embedding)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.zeros((8, 8, 3), dtype=np.uint8)
    pixels[..., 0] = int(round(20 + 40 * position))
    Image.fromarray(pixels).save(path)
    return path.name


def manifest(root, flags=("1", "0")) -> str:
    yes, no = flags
    lines = ["category,is_gallery,path,label,is_query,split"]  # any column order
    for i, (label, x) in enumerate(TRAIN):
        lines.append(f"misc,,{solid(root / f't{i}.png', x)},{label},,train")
    for i, (x, label, q, g, cat) in enumerate(ROWS):
        lines.append(f"{cat},{yes if g else no},{solid(root / f'r{i}.png', x)},{label},{yes if q else no},test")
    (root / "manifest.csv").write_text("\n".join(lines) + "\n")
    return str(root / "manifest.csv")


@pytest.mark.parametrize("flags", [("1", "0"), ("true", "False")])
def test_flags_make_query_and_gallery_splits(tmp_path, flags):
    splits = build_splits("csv", manifest(tmp_path, flags), eval_transform=lambda img: img)
    assert splits.eval_mode == "query_gallery" and splits.test is None
    assert [p.rsplit("/", 1)[1] for p in splits.query.paths] == ["r0.png", "r1.png", "r3.png", "r5.png"]
    assert [p.rsplit("/", 1)[1] for p in splits.gallery.paths] == ["r0.png", "r1.png", "r2.png", "r3.png", "r4.png"]
    assert splits.query.class_names == splits.gallery.class_names == ["A", "B"]
    assert splits.categories == ["shoes", "shoes", "bags", "bags"]
    assert splits.train.class_names == ["C", "D"]


def test_without_split_column_flagged_rows_are_the_test_split(tmp_path):
    solid(tmp_path / "a.png", 0.0)
    (tmp_path / "m.csv").write_text("path,label,is_query,is_gallery\na.png,x,0,0\na.png,y,0,0\na.png,x,1,1\n"
                                    "a.png,x,0,1\na.png,y,0,1\n")
    splits = build_splits("csv", tmp_path / "m.csv")
    assert (len(splits.train), len(splits.query), len(splits.gallery)) == (2, 1, 3)
    assert splits.categories is None


class RedLevel(torch.nn.Module):
    """Embeds an image as its mean red level ``[B, 1]`` (plus a weight that training cannot move)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, images):
        return images[:, :1].mean(dim=(2, 3)) + 0 * self.weight


def test_run_scores_the_hand_computed_example_with_categories(tmp_path):
    root = manifest(tmp_path / "data")
    cfg = load_config(overrides=[
        "data.name=csv", f"data.root={root}", "data.image_size=8", "sampler.batch_size=4", "sampler.m=2",
        "train.max_steps=1", "train.progress=false", "train.mixed_precision=none", "model.shift_average=0",
        "model.ensemble=1", "eval.ks=[1, 2]", "eval.clustering=false", "eval.save_embeddings=false",
        "protocol.val_fraction=0",
    ])
    splits = build_splits("csv", root, image_size=8)
    Trainer(cfg, tmp_path / "run", model=RedLevel(), loss=ContrastiveLoss(), data=splits, echo=lambda _: None).fit()
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["map_at_r"] == pytest.approx(1.25 / 4) and metrics["precision_at_1"] == pytest.approx(0.5)
    assert metrics["r_precision"] == pytest.approx(1.5 / 4)
    assert metrics["num_genuine_pairs"] + metrics["num_impostor_pairs"] == 6 * 5 // 2  # each image once
    assert metrics["per_category"]["shoes"]["map_at_r"] == pytest.approx(0.375)
    assert metrics["per_category"]["bags"]["map_at_r"] == pytest.approx(0.25)
    page = write_report(tmp_path / "run").read_text()
    assert "Per category" in page and "<th>shoes</th>" in page


@pytest.mark.parametrize("text, message", [
    ("path,label,is_query\na.png,x,1\n", "only one of the columns 'is_query' and 'is_gallery'"),
    ("path,colour\na.png,red\n", "must be a header naming the columns 'path' and 'label'.*Got 'path,colour'"),
    ("path,label,split,is_query,is_gallery\na.png,x,train,,\na.png,x,test,yes,0\n",
     r"line 3 of '.*m\.csv', column 'is_query': expected 0, 1, true or false\. Got 'yes'"),
    ("path,label,split,is_query,is_gallery\na.png,x,train,,\na.png,x,test,0,0\n",
     "line 3 of .* is a test row but neither a query nor a gallery item"),
    ("path,label,split,is_query,is_gallery\na.png,x,train,,\na.png,x,test,1,0\n", r"no rows with gallery rows \(is_gallery = 1\)"),
])
def test_bad_manifests_name_file_line_column_and_expectation(tmp_path, text, message):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(DataError, match=message):
        build_splits("csv", tmp_path / "m.csv")


def test_dmlkit_evaluate_reproduces_the_runs_query_gallery_metrics(tmp_path, capsys):
    from dmlkit.cli.main import main

    root = manifest(tmp_path / "data")
    cfg = load_config(overrides=[
        "data.name=csv", f"data.root={root}", "data.image_size=8", "model.args={width: 4}", "sampler.batch_size=4",
        "sampler.m=2", "train.max_steps=1", "train.progress=false", "train.mixed_precision=none",
        "model.shift_average=0", "model.ensemble=1", "eval.clustering=false", "protocol.val_fraction=0",
    ])
    Trainer(cfg, tmp_path / "run", echo=lambda _: None).fit()
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    (written,) = (tmp_path / "run" / "evaluations").iterdir()
    again = json.loads(written.read_text())
    for key in ("map_at_r", "precision_at_1", "num_genuine_pairs", "num_impostor_pairs"):
        assert again[key] == pytest.approx(saved[key]), key
    assert saved["num_genuine_pairs"] + saved["num_impostor_pairs"] == 6 * 5 // 2
    assert set(again["per_category"]) == set(saved["per_category"]) == {"bags", "shoes"}
    for name, values in saved["per_category"].items():
        assert again["per_category"][name]["map_at_r"] == pytest.approx(values["map_at_r"]), name


def test_category_without_flags_labels_the_leave_one_out_test_rows(tmp_path):
    solid(tmp_path / "a.png", 0.0)
    (tmp_path / "m.csv").write_text("label,category,path,split\nx,c1,a.png,train\ny,c1,a.png,train\n"
                                    "z,c2,a.png,test\nw,c3,a.png,test\nz,c3,a.png,test\n")
    splits = build_splits("csv", tmp_path / "m.csv", cache_in_memory=True, image_size=8)
    assert splits.eval_mode == "leave_one_out" and splits.categories == ["c2", "c3", "c3"]
    assert splits.test.class_names == ["w", "z"] and splits.test.labels.tolist() == [1, 0, 1]
