"""Users' own data: an image folder (``root/<class>/<image>``) or a CSV manifest (``path,label[,split]`` and
optional ``is_query,is_gallery,category`` columns)."""

from __future__ import annotations

import csv
import io
import logging
import os
import random
from pathlib import Path

from dmlkit.data._files import missing_file_error
from dmlkit.data.registry import DatasetSpec, SplitSource, register_dataset
from dmlkit.exceptions import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
FOLDER_LAYOUT = (
    "<root>/<class>/<image> (class-disjoint: a seeded random half of the classes tests, a third below 20 classes, "
    "the others train; data.class_split=sorted: the first classes by name train) or "
    "<root>/train/<class>/... + <root>/test/<class>/..."
)
CSV_LAYOUT = (
    "a CSV file with a header naming 'path', 'label' and optionally 'split' (train, or test / validation for "
    "the evaluated rows), 'is_query' and 'is_gallery' (0/1: query/gallery evaluation of the test rows) and "
    "'category' (per-category metrics), other columns ignored (open-metric-learning's format reads as it is); "
    "paths relative to the CSV's folder"
)
#: How the classes of one pool of images are divided into train and test classes (``data.class_split``).
CLASS_SPLITS = ("random", "sorted")
#: Below this many classes the test split takes a third of them, not half: half of few classes, less the
#: validation classes, leaves too few to train on (12 classes: 8 train and 4 test, not 6 and 6, of which the
#: recipe holds 2 out for validation with a pretrained backbone).
FEW_CLASSES = 20
logger = logging.getLogger("dmlkit.data")


def _scan_classes(base: Path) -> SplitSource:
    paths, names = [], []
    for cls in sorted(e.name for e in os.scandir(base) if e.is_dir() and not e.name.startswith(".")):
        for file in sorted(os.listdir(base / cls)):
            if file.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(str(base / cls / file))
                names.append(cls)
    if not paths:
        loose = sum(1 for e in os.scandir(base) if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS))
        if loose:
            raise DataError(f"folder: '{base}' holds {loose} images directly, and no class sub-folders: put each "
                            f"class's images in a sub-folder named after the class ({base}/<class>/<image>).")
        raise DataError(f"folder: no images found under '{base}'. Expected layout: {FOLDER_LAYOUT}")
    return SplitSource(names={"class": names}, paths=paths)


def classes_tested(num_classes: int) -> int:
    """How many of ``num_classes`` classes a class-disjoint split tests: half (rounded up) of
    :data:`FEW_CLASSES` or more, the benchmarks' protocol; a third of fewer (at least 2, at most all but one)."""
    if num_classes >= FEW_CLASSES:
        return num_classes - num_classes // 2
    return min(num_classes - 1, max(2, round(num_classes / 3)))


def class_disjoint_split(source: SplitSource, kind: str = "class", mode: str = "sorted",
                         seed: int = 0) -> dict[str, SplitSource]:
    """Class-disjoint split into train and test classes, :func:`classes_tested` of them testing (half of 20 or
    more classes, half rounded down training; a third of fewer).

    ``mode="sorted"``: the first classes by sorted name train (the benchmarks' protocols); ``"random"``: the
    training classes drawn with ``random.Random(seed)`` from the sorted names, so one seed gives one split anywhere."""
    if mode not in CLASS_SPLITS:
        raise DataError(f"data.class_split must be one of {CLASS_SPLITS}. Got {mode!r}.")
    classes = sorted(set(source.names[kind]))
    if len(classes) < 2:
        raise DataError(f"A class-disjoint train/test split needs at least 2 classes; found {len(classes)}.")
    chosen = classes if mode == "sorted" else random.Random(seed).sample(classes, len(classes))
    tested = classes_tested(len(classes))
    train = set(chosen[: len(classes) - tested])
    out = {}
    for split, want in (("train", True), ("test", False)):
        keep = [(n in train) == want for n in source.names[kind]]
        out[split] = SplitSource(
            names={k: [v for v, ok in zip(vals, keep) if ok] for k, vals in source.names.items()},
            paths=[p for p, ok in zip(source.paths, keep) if ok],
        )
    out["train"].class_split = {"mode": mode, "seed": seed} if mode == "random" else {"mode": mode}
    if len(classes) < FEW_CLASSES:  # said with the split before training (DataSplits.describe)
        out["train"].class_split["test_classes"] = (
            f"{tested} of the {len(classes)} classes test: a third, not half, below {FEW_CLASSES} classes, "
            "so that enough classes are left to train on")
    return out


def read_folder(root, label="class", eval_label="class", *, class_split: str = "random",
                split_seed: int = 0) -> dict[str, SplitSource]:
    """``root/train`` + ``root/test`` when both exist, else a class-disjoint split of ``root/<class>``
    (:func:`class_disjoint_split` with ``class_split`` and ``split_seed``)."""
    base = Path(root)
    if not base.is_dir():
        raise DataError(f"folder: '{base}' is not a directory. Expected layout: {FOLDER_LAYOUT}")
    if (base / "train").is_dir() and (base / "test").is_dir():
        return {"train": _scan_classes(base / "train"), "test": _scan_classes(base / "test")}
    return class_disjoint_split(_scan_classes(base), mode=class_split, seed=split_seed)


def _inside(path: Path, root: Path) -> bool:
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) == os.path.realpath(root)


#: Columns a CSV manifest may have (in any order); the first two are required. Others (open-metric-learning's
#: bounding boxes x_1, y_1, x_2, y_2, ...) are ignored with a note.
CSV_COLUMNS = ("path", "label", "split", "is_query", "is_gallery", "category")
_TRUE, _FALSE = ("1", "true", "1.0"), ("0", "false", "0.0")
#: ``split`` values: dmlkit's, and open-metric-learning's ``validation`` for the evaluated rows.
CSV_SPLITS = {"train": "train", "test": "test", "validation": "test"}


class _Manifest:
    """Rows of a CSV manifest read by header, each value checked with the file, line and column named."""

    def __init__(self, csv_path: Path, rows: list[list[str]]):
        self.csv_path = csv_path
        header = [c.strip() for c in rows[0]] if rows else []
        missing = [c for c in ("path", "label") if c not in header]
        if not rows or missing or len(set(header)) != len(header):
            raise DataError(
                f"csv: the first line of '{csv_path}' must be a header naming the columns 'path' and 'label', "
                f"optionally 'split', 'is_query', 'is_gallery' and 'category' (any order, each once). "
                f"Got {','.join(header)!r}.")
        ignored = [c for c in header if c not in CSV_COLUMNS]
        if ignored:
            logger.warning("csv: '%s': columns %s are not read (dmlkit reads %s).", csv_path, ", ".join(ignored),
                           ", ".join(CSV_COLUMNS))
        if ("is_query" in header) != ("is_gallery" in header):
            raise DataError(f"csv: '{csv_path}' has only one of the columns 'is_query' and 'is_gallery'; "
                            "give both (1/true marks a test row as a query, a gallery item, or both).")
        self.header = header
        self.column = {name: i for i, name in enumerate(header)}
        self.rows = [(number, row) for number, row in enumerate(rows[1:], start=2) if row]
        for number, row in self.rows:
            if len(row) != len(header):
                raise DataError(f"csv: line {number} of '{csv_path}' has {len(row)} fields but the header has "
                                f"{len(header)}.")

    def has(self, column: str) -> bool:
        return column in self.column

    def value(self, row: list[str], column: str) -> str:
        return row[self.column[column]].strip()

    def flag(self, number: int, row: list[str], column: str, empty_allowed: bool) -> bool:
        """``is_query``/``is_gallery``: 0/1 or true/false (any case); empty reads as 0 where allowed."""
        text = self.value(row, column)
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE or (empty_allowed and not text):
            return False
        raise DataError(f"csv: line {number} of '{self.csv_path}', column {column!r}: expected 0, 1, true or "
                        f"false{' (or empty on a train row)' if empty_allowed else ''}. Got {text!r}.")


def _split_of(manifest: _Manifest, number: int, row: list[str]) -> str:
    """The row's split: its ``split`` column, else test when it is a query or gallery item, else train."""
    if manifest.has("split"):
        split = manifest.value(row, "split")
        if split not in CSV_SPLITS:
            raise DataError(f"csv: line {number} of '{manifest.csv_path}', column 'split': expected 'train', "
                            f"'test' or 'validation' (the same as test). Got {split!r}.")
        return CSV_SPLITS[split]
    flagged = any(manifest.flag(number, row, c, empty_allowed=True) for c in ("is_query", "is_gallery"))
    return "test" if flagged else "train"


def read_csv_rows(csv_path: Path) -> list[list[str]]:
    """The rows of ``csv_path``: UTF-8 with or without a byte-order mark (spreadsheet programs write one); another
    encoding, a NUL byte or a field past the csv module's limit is a DataError naming the file and the line."""
    try:
        data = csv_path.read_bytes()
    except OSError as err:
        raise DataError(f"csv: '{csv_path}' cannot be read ({err.strerror or err}).") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        found = "UTF-16 (it starts with UTF-16's byte-order mark)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else \
            f"another encoding (byte 0x{data[err.start]:02x} on line {line}; Latin-1 or a Windows code page?)"
        raise DataError(f"csv: '{csv_path}' is not UTF-8 text: it is {found}. dmlkit reads CSV files as UTF-8, with "
                        "or without a byte-order mark: save it as UTF-8 (a spreadsheet's 'CSV UTF-8').") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return list(reader)
    except csv.Error as err:  # a field over csv.field_size_limit(), a NUL byte
        raise DataError(f"csv: line {reader.line_num} of '{csv_path}' cannot be read: {err} (fields hold at most "
                        f"{csv.field_size_limit():,} characters; a path or a label is far shorter).") from None


def read_csv_manifest(root, label="class", eval_label="class", *, allow_outside_root: bool = False,
                      class_split: str = "random", split_seed: int = 0) -> dict[str, SplitSource]:
    """Rows ``path,label[,split][,is_query,is_gallery][,category]`` (any column order, by header); paths
    resolve against the CSV's folder and may not leave it.

    Without a ``split`` column the classes are split class-disjointly (:func:`class_disjoint_split` with
    ``class_split`` and ``split_seed``), or, with
    ``is_query``/``is_gallery``, rows flagged as either are the test split and the others train. With
    those flags the test split becomes ``query`` and ``gallery`` sources (a row flagged both is in both);
    ``category`` is kept as the label kind ``"category"`` for per-category metrics.
    """
    csv_path = Path(root)
    if csv_path.is_dir():
        csv_path = csv_path / "manifest.csv"
    if not csv_path.is_file():
        raise missing_file_error("csv", csv_path, CSV_LAYOUT)
    base = csv_path.parent
    manifest = _Manifest(csv_path, read_csv_rows(csv_path))
    query_gallery = manifest.has("is_query")
    parts = ("train", "query", "gallery") if query_gallery else ("train", "test")
    kinds = ("class", "category") if manifest.has("category") else ("class",)
    out = {part: SplitSource(names={k: [] for k in kinds}, paths=[]) for part in parts}
    for number, row in manifest.rows:
        raw = manifest.value(row, "path")
        path = Path(raw)
        full = path if path.is_absolute() else base / path
        if not allow_outside_root and not _inside(full, base):
            raise DataError(
                f"csv: line {number} of '{csv_path}' points outside the manifest's folder ('{raw}' is not under "
                f"'{base}'); set data.allow_outside_root=true (allow_outside_root=True in Python) to allow it."
            )
        split = _split_of(manifest, number, row) if manifest.has("split") or query_gallery else "train"
        targets = [split]
        if query_gallery and split == "test":
            targets = [c[3:] for c in ("is_query", "is_gallery") if manifest.flag(number, row, c, empty_allowed=False)]
            if not targets:
                raise DataError(f"csv: line {number} of '{csv_path}' is a test row but neither a query nor a "
                                "gallery item: set is_query, is_gallery or both to 1.")
        for target in targets:
            out[target].paths.append(str(full))
            out[target].names["class"].append(manifest.value(row, "label"))
            if manifest.has("category"):
                out[target].names["category"].append(manifest.value(row, "category"))
    if not manifest.has("split") and not query_gallery:
        if not out["train"].paths:
            raise DataError(f"csv: '{csv_path}' has no rows.")
        return class_disjoint_split(out["train"], mode=class_split, seed=split_seed)
    empty = [part for part in parts if not out[part].paths]
    if empty:
        what = f"split {empty[0]!r}" if empty[0] in ("train", "test") else f"{empty[0]} rows (is_{empty[0]} = 1)"
        raise DataError(f"csv: '{csv_path}' has no rows with {what}.")
    return out


FOLDER = register_dataset(DatasetSpec(name="folder", read=read_folder, layout=FOLDER_LAYOUT))
CSV = register_dataset(DatasetSpec(name="csv", read=read_csv_manifest, layout=CSV_LAYOUT))
