"""pytorch-metric-learning's data set classes under their names, for users who bring PML code.

``CUB``, ``Cars196``, ``StanfordOnlineProducts`` and ``INaturalist2018`` take PML's constructor
``(root, split="train+test", transform=None, target_transform=None, download=False)`` and hold what
PML's hold: ``paths`` and ``labels`` (the data set's own class ids, e.g. 1..200 for CUB, not
re-indexed) in the files' order, item ``i`` being ``(transform(image), target_transform(label))``.
Splits are PML's: CUB classes 1-100 / 101-200, Cars196 classes 1-98 / 99-196, SOP and iNaturalist
their official list files; ``"train+test"`` is both, train first.

Where dmlkit differs: ``download=True`` runs :func:`dmlkit.data.download.download_dataset` (terms
printed, published checksums verified, links and paths leaving ``root`` refused, counts checked)
instead of PML's unverified fetch, and only when ``root`` is missing or empty, as PML; an image is
read by :func:`dmlkit.data.base.load_image` (fully decoded and closed, EXIF orientation applied,
size budget checked) rather than left open lazily; a bad ``split`` or a missing ``root`` is an
:class:`~dmlkit.exceptions.InvalidParameterError` / :class:`~dmlkit.exceptions.DataError`, both
``ValueError`` as PML's. ``Cars196`` reads PML's layout (the Kaggle copy: ``names.csv``,
``anno_train.csv``, ``anno_test.csv``, ``car_data/car_data/<split>/<class name>/``) and also the
``cars_annos.mat`` + ``car_ims/`` layout that dmlkit downloads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from torch.utils.data import Dataset

from dmlkit.data._files import read_table
from dmlkit.data.base import load_image
from dmlkit.exceptions import DataError, InvalidParameterError

SPLITS = ("train", "test", "train+test")


class BaseDataset(Dataset):
    """PML's ``BaseDataset``: a list of image ``paths`` and int ``labels`` chosen by ``split``.

    Subclasses define ``generate_split`` (fill ``self.paths`` and ``self.labels``) and name their
    entry of :data:`dmlkit.data.sources.DOWNLOADS` in ``download_name``; ``source`` replaces that
    entry (a private mirror, tests).
    """

    download_name: str = ""
    source: Any = None

    def __init__(self, root: str | os.PathLike, split: str = "train+test", transform: Callable | None = None,
                 target_transform: Callable | None = None, download: bool = False):
        if split not in self.get_available_splits():
            raise InvalidParameterError(
                f"The 'split' parameter of {type(self).__name__} must be one of "
                f"{{{', '.join(repr(s) for s in self.get_available_splits())}}}. Got {split!r} instead.")
        self.root = str(root)
        if download:
            if not os.path.isdir(self.root) or not _listing(self.root):
                self.download_and_remove()
        elif os.path.exists(self.root) and not os.path.isdir(self.root):
            raise DataError(f"{type(self).__name__}: root {self.root!r} is a file, not a folder; point root at the "
                            "folder holding the data set in its official layout.")
        elif not os.path.isdir(self.root):
            raise DataError(f"{type(self).__name__}: root {self.root!r} does not exist; pass download=True to "
                            "fetch the data set there, or point root at a copy in its official layout.")
        self.transform = transform
        self.target_transform = target_transform
        self.split = split
        self.paths: list[str] = []
        self.labels: list[int] = []
        self.generate_split()

    def get_available_splits(self) -> list[str]:
        return list(SPLITS)

    def generate_split(self) -> None:
        raise NotImplementedError

    def download_and_remove(self) -> None:
        """Fetch, verify and extract the data set into ``root``; the archives are removed afterwards."""
        from dmlkit.data.download import download_dataset

        download_dataset(self.download_name, self.root, source=self.source)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> tuple[Any, Any]:
        image = load_image(self.paths[idx])
        label = self.labels[idx]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def _keep(self, paths: list[str], labels: list[int], train_classes: range, test_classes: range) -> None:
        """Keep the items whose label is in this split's classes (PML's class-disjoint split)."""
        wanted = {"train": set(train_classes), "test": set(test_classes)}.get(self.split)
        for path, label in zip(paths, labels):
            if wanted is None or label in wanted:
                self.paths.append(path)
                self.labels.append(label)


def _listing(root: str) -> list[str]:
    try:
        return os.listdir(root)
    except OSError as err:
        raise DataError(f"root {root!r} cannot be listed ({err.strerror or err}); check its permissions.") from None


def _read_text(path: Path, who: str) -> str:
    """The UTF-8 text of annotation file ``path``; a DataError names it when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{who}: '{path}' cannot be read as UTF-8 text ({err}).") from None


def _read_json(path: Path, who: str) -> Any:
    try:
        return json.loads(_read_text(path, who))
    except json.JSONDecodeError as err:
        raise DataError(f"{who}: '{path}' is not valid JSON ({err}); is it damaged or cut short? Download it "
                        "again.") from None


def _int(value: str, path: Path, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DataError(f"'{path}' has {what} {value!r}, which is not an integer.") from None


class CUB(BaseDataset):
    """CUB-200-2011 as PML reads it: ``root/CUB_200_2011``; train = classes 1-100, test = 101-200."""

    download_name = "cub200"

    def generate_split(self) -> None:
        base = Path(self.root) / "CUB_200_2011"
        layout = "root/CUB_200_2011/images.txt, image_class_labels.txt and images/<class_dir>/*.jpg"
        images = read_table(base / "images.txt", "CUB", layout, 2)
        classes = read_table(base / "image_class_labels.txt", "CUB", layout, 2)
        label_of = {row[0]: _int(row[1], base / "image_class_labels.txt", "class id") for row in classes}
        paths = [str(base / "images" / rel) for image_id, rel in images if image_id in label_of]
        labels = [label_of[image_id] for image_id, _ in images if image_id in label_of]
        self._keep(paths, labels, range(1, 101), range(101, 201))


class Cars196(BaseDataset):
    """Cars196 as PML splits it: train = classes 1-98, test = 99-196, over both official halves."""

    download_name = "cars196"

    def generate_split(self) -> None:
        root = Path(self.root)
        if (root / "names.csv").is_file():
            paths, labels = self._read_csv_layout(root)
        else:
            paths, labels = self._read_mat_layout(root)
        self._keep(paths, labels, range(1, 99), range(99, 197))

    @staticmethod
    def _read_csv_layout(root: Path) -> tuple[list[str], list[int]]:
        """PML's layout: ``anno_<split>.csv`` rows ``file,x1,y1,x2,y2,class``; images under the class name."""
        names = [line.strip() for line in _read_text(root / "names.csv", "Cars196").splitlines()]
        paths, labels = [], []
        for half in ("train", "test"):
            csv = root / f"anno_{half}.csv"
            if not csv.is_file():
                raise DataError(f"Cars196: '{csv}' is missing (PML's layout: names.csv, anno_train.csv, "
                                "anno_test.csv, car_data/car_data/<train|test>/<class name>/*.jpg).")
            for line in _read_text(csv, "Cars196").splitlines():
                if not line.strip():
                    continue
                fields = line.split(",")
                label = _int(fields[-1].strip(), csv, "class id")
                if not 1 <= label <= len(names):
                    raise DataError(f"Cars196: '{csv}' has class id {label}; names.csv names {len(names)} classes.")
                folder = names[label - 1].replace("/", "-")
                paths.append(str(root / "car_data" / "car_data" / half / folder / fields[0]))
                labels.append(label)
        return paths, labels

    @staticmethod
    def _read_mat_layout(root: Path) -> tuple[list[str], list[int]]:
        """dmlkit's download: ``cars_annos.mat`` (every image, in its order) and ``car_ims/``."""
        from dmlkit.data.cars import read_cars

        sources = read_cars(root)
        paths = sources["train"].paths + sources["test"].paths  # type: ignore[operator]
        labels = [int(n[:3]) for n in sources["train"].names["class"] + sources["test"].names["class"]]
        order = sorted(range(len(paths)), key=lambda i: paths[i])  # car_ims/000001.jpg ... is the .mat order
        return [paths[i] for i in order], [labels[i] for i in order]


class StanfordOnlineProducts(BaseDataset):
    """Stanford Online Products from ``root/Stanford_Online_Products/Ebay_{train,test}.txt``; labels are class_id."""

    download_name = "sop"

    def generate_split(self) -> None:
        base = Path(self.root) / "Stanford_Online_Products"
        layout = "root/Stanford_Online_Products/Ebay_train.txt and Ebay_test.txt (header, then 'image_id class_id " \
                 "super_class_id path')"
        for half in ("train", "test") if self.split == "train+test" else (self.split,):
            path = base / f"Ebay_{half}.txt"
            for row in read_table(path, "StanfordOnlineProducts", layout, 4, skip=1):
                self.paths.append(str(base / row[3]))
                self.labels.append(_int(row[1], path, "class_id"))


class INaturalist2018(BaseDataset):
    """iNaturalist 2018 with the Smooth-AP retrieval splits (``Inat_dataset_splits/Inaturalist_<split>_set1.txt``)."""

    download_name = "inaturalist2018"

    def generate_split(self) -> None:
        root = Path(self.root)
        annotations: dict[str, int] = {}
        for file in ("val2018.json", "train2018.json"):
            path = root / file
            if not path.is_file():
                raise DataError(f"INaturalist2018: '{path}' is missing (ROOT must hold train2018.json, val2018.json, "
                                "train_val2018/ and Inat_dataset_splits/).")
            annotations.update(_inat_labels(path))
        for half in ("train", "test") if self.split == "train+test" else (self.split,):
            listing = root / "Inat_dataset_splits" / f"Inaturalist_{half}_set1.txt"
            if not listing.is_file():
                raise DataError(f"INaturalist2018: '{listing}' is missing (the Smooth-AP split files).")
            for line in _read_text(listing, "INaturalist2018").splitlines():
                name = line.strip()
                if not name:
                    continue
                if name not in annotations:
                    raise DataError(f"INaturalist2018: '{listing}' lists {name!r}, which no annotation file has.")
                self.paths.append(str(root / name))
                self.labels.append(annotations[name])


def _inat_labels(path: Path) -> dict[str, int]:
    """``file_name -> category_id`` from an iNaturalist annotation file (COCO style: ``images``, ``annotations``)."""
    data = _read_json(path, "INaturalist2018")
    try:
        label_of = {a["image_id"]: a["category_id"] for a in data["annotations"]}
        return {img["file_name"]: label_of[img["id"]] for img in data["images"]}
    except (KeyError, TypeError) as err:
        fault = f"lacks the key {err}" if isinstance(err, KeyError) else f"has an entry of the wrong type ({err})"
        raise DataError(f"INaturalist2018: '{path}' {fault}; an iNaturalist 2018 annotation file has "
                        "'images' (id, file_name) and 'annotations' (image_id, category_id). Download it again."
                        ) from None


__all__ = ["CUB", "BaseDataset", "Cars196", "INaturalist2018", "StanfordOnlineProducts"]
