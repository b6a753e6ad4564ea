"""Tiny fixture trees in each benchmark's exact on-disk layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def write_image(path: Path, value: int = 128, mode: str = "RGB", size: tuple[int, int] = (12, 10)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(value)
    channels = 3 if mode == "RGB" else 1
    pixels = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode=mode).save(path)


def make_cub(root: Path, classes=(1, 2, 3, 101, 102), per_class: int = 3) -> Path:
    base = root / "CUB_200_2011"
    images, labels, class_lines = [], [], []
    image_id = 0
    for cls in classes:
        folder = f"{cls:03d}.Bird_{cls}"
        class_lines.append(f"{cls} {folder}")
        for k in range(per_class):
            image_id += 1
            rel = f"{folder}/Bird_{cls}_{k:04d}_{image_id}.jpg"
            write_image(base / "images" / rel, image_id)
            images.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {cls}")
    (base / "images.txt").write_text("\n".join(images) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (base / "classes.txt").write_text("\n".join(class_lines) + "\n")
    return root


def make_cars(root: Path, classes=(1, 2, 98, 99, 196), per_class: int = 2) -> Path:
    from scipy.io import savemat

    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    rows = []
    image_id = 0
    for cls in classes:
        for k in range(per_class):
            image_id += 1
            rel = f"car_ims/{image_id:06d}.jpg"
            write_image(root / rel, image_id)
            rows.append((np.array([rel]), *[np.array([[v]], dtype=np.uint16) for v in (1, 1, 9, 9)],
                         np.array([[cls]], dtype=np.uint8), np.array([[k % 2]], dtype=np.uint8)))
    annotations = np.zeros((1, len(rows)), dtype=[(f, "O") for f in fields])
    for i, row in enumerate(rows):
        annotations[0, i] = row
    names = np.array([f"Make Model {c} 2012" for c in range(1, 197)], dtype=object).reshape(1, -1)
    savemat(str(root / "cars_annos.mat"), {"annotations": annotations, "class_names": names})
    return root


def make_sop(root: Path) -> Path:
    base = root / "Stanford_Online_Products"
    header = "image_id class_id super_class_id path"
    train = [(1, 1, "bicycle_final/111085122871_0.JPG"), (2, 1, "bicycle_final/111085122871_1.JPG"),
             (3, 2, "bicycle_final/111265328556_0.JPG"), (4, 2, "bicycle_final/111265328556_1.JPG"),
             (5, 3, "cabinet_final/11111_0.JPG"), (6, 3, "cabinet_final/11111_1.JPG")]
    test = [(7, 4, "chair_final/22222_0.JPG"), (8, 4, "chair_final/22222_1.JPG"),
            (9, 5, "chair_final/33333_0.JPG"), (10, 5, "chair_final/33333_1.JPG")]
    for name, rows in (("Ebay_train.txt", train), ("Ebay_test.txt", test)):
        lines = [header] + [f"{i} {c} {1 if 'bicycle' in p else 2} {p}" for i, c, p in rows]
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text("\n".join(lines) + "\n")
        for i, _, p in rows:
            write_image(base / p, i)
    return root


def make_inshop(root: Path) -> Path:
    rows = []
    for item in range(1, 4):  # train items
        for view in ("1_front", "2_side"):
            rows.append((f"img/WOMEN/Dresses/id_{item:08d}/0{item}_{view}.jpg", f"id_{item:08d}", "train"))
    for item in range(10, 13):  # test items: one query, two gallery images each
        rows.append((f"img/MEN/Denim/id_{item:08d}/01_1_front.jpg", f"id_{item:08d}", "query"))
        rows.append((f"img/MEN/Denim/id_{item:08d}/01_2_side.jpg", f"id_{item:08d}", "gallery"))
        rows.append((f"img/MEN/Denim/id_{item:08d}/01_3_back.jpg", f"id_{item:08d}", "gallery"))
    lines = [str(len(rows)), "image_name item_id evaluation_status"] + [" ".join(r) for r in rows]
    (root / "Eval").mkdir(parents=True, exist_ok=True)
    (root / "Eval" / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    for k, (path, _, _) in enumerate(rows):
        write_image(root / path, k)
    return root


OMNIGLOT_SETS = {
    "images_background": {"Alpha": 2, "Beta": 2, "Gamma": 1},
    "images_evaluation": {"Delta": 2, "Epsilon": 1},
}


def make_omniglot(root: Path, per_character: int = 2) -> Path:
    base = root / "omniglot-py"
    k = 0
    for set_name, alphabets in OMNIGLOT_SETS.items():
        for alphabet, num_chars in alphabets.items():
            for c in range(1, num_chars + 1):
                for j in range(per_character):
                    k += 1
                    write_image(base / set_name / alphabet / f"character{c:02d}" / f"{k:04d}_{j:02d}.png", k,
                                mode="L", size=(20, 20))
    return root




@pytest.fixture
def cub_root(tmp_path):
    return make_cub(tmp_path / "cub")


@pytest.fixture
def cars_root(tmp_path):
    return make_cars(tmp_path / "cars")


@pytest.fixture
def sop_root(tmp_path):
    return make_sop(tmp_path / "sop")


@pytest.fixture
def inshop_root(tmp_path):
    return make_inshop(tmp_path / "inshop")


@pytest.fixture
def omniglot_root(tmp_path):
    return make_omniglot(tmp_path / "omni")


@pytest.fixture
def image_writer():
    return write_image


@pytest.fixture
def cub_factory():
    return make_cub


@pytest.fixture
def layout_makers():
    """Builders of each downloadable benchmark's official tree, by data set name."""
    return {"cub200": make_cub, "cars196": make_cars, "sop": make_sop, "inshop": make_inshop}
