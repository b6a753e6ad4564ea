"""CUB-200-2011 (Wah et al. 2011): classes 1-100 train (5,864 images), 101-200 test (5,924)."""

from __future__ import annotations

from pathlib import Path

from dmlkit.data._files import find_root, missing_file_error, read_table, to_int
from dmlkit.data.registry import DatasetSpec, SplitSource, register_dataset
from dmlkit.exceptions import DataError

LAYOUT = (
    "<root>/CUB_200_2011/images.txt ('<image_id> <class_dir>/<file>.jpg'), "
    "<root>/CUB_200_2011/image_class_labels.txt ('<image_id> <class_id 1..200>'), <root>/CUB_200_2011/images/<class_dir>/*.jpg"
)


def read_cub(root, label="class", eval_label="class") -> dict[str, SplitSource]:
    """Parse images.txt + image_class_labels.txt; split by class id (<= 100 train)."""
    base = find_root(root, "images.txt", ("CUB_200_2011",))
    if not (base / "images.txt").exists():
        hint = ""
        if (Path(root) / "lists" / "files.txt").exists() or (Path(root) / "CUB_200" / "lists").exists():
            hint = "This looks like CUB-200 (2010), not CUB-200-2011."
        raise missing_file_error("cub200", Path(root) / "CUB_200_2011" / "images.txt", LAYOUT, hint)
    images = read_table(base / "images.txt", "cub200", LAYOUT, 2)
    classes = read_table(base / "image_class_labels.txt", "cub200", LAYOUT, 2)
    class_of = {row[0]: to_int(row[1], base / "image_class_labels.txt", "cub200", "class id") for row in classes}
    out: dict[str, tuple[list, list]] = {"train": ([], []), "test": ([], [])}
    for image_id, rel in images:
        if image_id not in class_of:
            raise DataError(f"cub200: image id {image_id} of '{base / 'images.txt'}' has no row in "
                            f"'{base / 'image_class_labels.txt'}'.")
        cls = class_of[image_id]
        if not 1 <= cls <= 200:
            raise DataError(f"cub200: class id {cls} in '{base / 'image_class_labels.txt'}' is outside 1..200.")
        paths, names = out["train" if cls <= 100 else "test"]
        paths.append(str(base / "images" / rel))
        names.append(rel.split("/")[0] if "/" in rel else f"{cls:03d}")
    return {k: SplitSource(names={"class": n}, paths=p) for k, (p, n) in out.items()}


CUB = register_dataset(
    DatasetSpec(
        name="cub200",
        read=read_cub,
        published={"train": (5864, 100), "test": (5924, 100)},
        layout=LAYOUT,
    )
)
