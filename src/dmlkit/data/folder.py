"""Users' own data: an image folder (``root/<class>/<image>``) or a CSV manifest (``path,label[,split]``)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from dmlkit.data._files import missing_file_error
from dmlkit.data.registry import DatasetSpec, SplitSource, register_dataset
from dmlkit.exceptions import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
FOLDER_LAYOUT = (
    "<root>/<class>/<image> (class-disjoint halves by sorted class name) "
    "or <root>/train/<class>/... + <root>/test/<class>/..."
)
CSV_LAYOUT = (
    "a CSV file with header 'path,label' or 'path,label,split' (split: train or test); "
    "paths relative to the CSV's folder"
)


def _scan_classes(base: Path) -> SplitSource:
    paths, names = [], []
    for cls in sorted(e.name for e in os.scandir(base) if e.is_dir() and not e.name.startswith(".")):
        for file in sorted(os.listdir(base / cls)):
            if file.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(str(base / cls / file))
                names.append(cls)
    if not paths:
        raise DataError(f"folder: no images found under '{base}'. Expected layout: {FOLDER_LAYOUT}")
    return SplitSource(names={"class": names}, paths=paths)


def half_split(source: SplitSource, kind: str = "class") -> dict[str, SplitSource]:
    """Class-disjoint split: sorted class names, first half (rounded down) train, the rest test."""
    classes = sorted(set(source.names[kind]))
    if len(classes) < 2:
        raise DataError(f"A class-disjoint train/test split needs at least 2 classes; found {len(classes)}.")
    train = set(classes[: len(classes) // 2])
    out = {}
    for split, want in (("train", True), ("test", False)):
        keep = [(n in train) == want for n in source.names[kind]]
        out[split] = SplitSource(
            names={k: [v for v, ok in zip(vals, keep) if ok] for k, vals in source.names.items()},
            paths=[p for p, ok in zip(source.paths, keep) if ok],
        )
    return out


def read_folder(root, label="class", eval_label="class") -> dict[str, SplitSource]:
    """``root/train`` + ``root/test`` when both exist, else class-disjoint halves of ``root/<class>``."""
    base = Path(root)
    if not base.is_dir():
        raise DataError(f"folder: '{base}' is not a directory. Expected layout: {FOLDER_LAYOUT}")
    if (base / "train").is_dir() and (base / "test").is_dir():
        return {"train": _scan_classes(base / "train"), "test": _scan_classes(base / "test")}
    return half_split(_scan_classes(base))


def _inside(path: Path, root: Path) -> bool:
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) == os.path.realpath(root)


def read_csv_manifest(root, label="class", eval_label="class", *, allow_outside_root: bool = False) -> dict[str, SplitSource]:
    """Rows ``path,label[,split]``; paths resolve against the CSV's folder and may not leave it.

    Without a ``split`` column the classes are split class-disjointly in sorted halves.
    """
    csv_path = Path(root)
    if csv_path.is_dir():
        csv_path = csv_path / "manifest.csv"
    if not csv_path.is_file():
        raise missing_file_error("csv", csv_path, CSV_LAYOUT)
    base = csv_path.parent
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or [c.strip() for c in rows[0][:2]] != ["path", "label"]:
        raise DataError(f"csv: the first line of '{csv_path}' must be the header 'path,label[,split]'. Got {rows[:1]}.")
    header = [c.strip() for c in rows[0]]
    has_split = header == ["path", "label", "split"]
    if not has_split and header != ["path", "label"]:
        raise DataError(f"csv: header of '{csv_path}' must be 'path,label' or 'path,label,split'. Got {','.join(header)!r}.")
    splits: dict[str, tuple[list, list]] = {"train": ([], []), "test": ([], [])}
    everything: tuple[list, list] = ([], [])
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise DataError(f"csv: line {number} of '{csv_path}' has {len(row)} fields but the header has {len(header)}.")
        path = Path(row[0].strip())
        full = path if path.is_absolute() else base / path
        if not allow_outside_root and not _inside(full, base):
            raise DataError(
                f"csv: line {number} of '{csv_path}' points outside the manifest's folder ('{row[0]}' is not under "
                f"'{base}'); pass allow_outside_root=True to allow it."
            )
        target = everything
        if has_split:
            split = row[2].strip()
            if split not in splits:
                raise DataError(f"csv: line {number} of '{csv_path}' has split {split!r}; expected 'train' or 'test'.")
            target = splits[split]
        target[0].append(str(full))
        target[1].append(row[1].strip())
    if has_split:
        empty = [k for k, (p, _) in splits.items() if not p]
        if empty:
            raise DataError(f"csv: '{csv_path}' has no rows with split {empty[0]!r}.")
        return {k: SplitSource(names={"class": n}, paths=p) for k, (p, n) in splits.items()}
    if not everything[0]:
        raise DataError(f"csv: '{csv_path}' has no rows.")
    return half_split(SplitSource(names={"class": everything[1]}, paths=everything[0]))


FOLDER = register_dataset(DatasetSpec(name="folder", read=read_folder, layout=FOLDER_LAYOUT))
CSV = register_dataset(DatasetSpec(name="csv", read=read_csv_manifest, layout=CSV_LAYOUT))
