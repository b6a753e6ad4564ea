"""Cars196 (Krause et al. 2013) from cars_annos.mat: classes 1-98 train (8,054), 99-196 test (8,131).

The split is by class (zero-shot), not the official per-image train/test flag.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dmlkit.data._files import find_root, missing_file_error
from dmlkit.data.registry import DatasetSpec, SplitSource, register_dataset
from dmlkit.exceptions import DataError

LAYOUT = (
    "<root>/cars_annos.mat (struct array 'annotations' with fields relative_im_path, class, ...; "
    "optional 'class_names') and <root>/car_ims/*.jpg"
)


def read_cars(root, label="class", eval_label="class") -> dict[str, SplitSource]:
    """Parse cars_annos.mat; class ids <= 98 are training classes."""
    from scipy.io import loadmat

    base = find_root(root, "cars_annos.mat", ("cars196", "CARS196", "Cars196"))
    mat_path = base / "cars_annos.mat"
    if not mat_path.is_file():
        raise missing_file_error("cars196", Path(root) / "cars_annos.mat", LAYOUT)
    try:
        mat = loadmat(str(mat_path), squeeze_me=True)
        annotations = np.atleast_1d(mat["annotations"])
        rel_paths = [str(p) for p in np.atleast_1d(annotations["relative_im_path"])]
        class_ids = np.atleast_1d(annotations["class"]).astype(np.int64)
    except Exception as err:
        raise DataError(f"cars196: cannot read annotations from '{mat_path}' ({err}). Expected layout: {LAYOUT}") from err
    if class_ids.min() < 1 or class_ids.max() > 196:
        raise DataError(f"cars196: class ids in '{mat_path}' span {class_ids.min()}..{class_ids.max()}, expected 1..196.")
    names_field = [str(n) for n in np.atleast_1d(mat["class_names"])] if "class_names" in mat else []
    out: dict[str, tuple[list, list]] = {"train": ([], []), "test": ([], [])}
    for rel, cls in zip(rel_paths, class_ids.tolist()):
        paths, names = out["train" if cls <= 98 else "test"]
        paths.append(str(base / rel))
        suffix = f" {names_field[cls - 1]}" if len(names_field) >= cls else ""
        names.append(f"{cls:03d}{suffix}")
    return {k: SplitSource(names={"class": n}, paths=p) for k, (p, n) in out.items()}


CARS = register_dataset(
    DatasetSpec(
        name="cars196",
        read=read_cars,
        published={"train": (8054, 98), "test": (8131, 98)},
        layout=LAYOUT,
    )
)
