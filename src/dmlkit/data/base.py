"""Split datasets: image files on disk or images held in memory, plus the DataSplits bundle."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import Dataset

from dmlkit.core.devices import host_to_device
from dmlkit.core.seeds import derive_seed
from dmlkit.core.validation import as_class_ids
from dmlkit.exceptions import DataError

Transform = Callable[[Any], torch.Tensor]


def contiguous_labels(names: Sequence[str]) -> tuple[torch.Tensor, list[str]]:
    """Map per-sample class names to int64 ids 0..C-1 in sorted-name order; return (labels, class_names)."""
    class_names = sorted(set(names))
    index = {name: i for i, name in enumerate(class_names)}
    labels = torch.tensor([index[n] for n in names], dtype=torch.int64)
    return labels, class_names


#: The most pixels an image file may have (PIL's own decompression-bomb limit, made an error).
MAX_IMAGE_PIXELS = 89_478_485
#: The most pixels the resized view of an image may have: views scale the shorter side to a fixed size,
#: so a thin strip (20000 x 2 px) would become gigabytes; such a file is refused before it is decoded.
MAX_VIEW_PIXELS = 1 << 25
#: The shorter side assumed for the view when the caller does not say (the largest photo views dmlkit makes).
DEFAULT_VIEW_SIDE = 512


def check_image_budget(width: int, height: int, path: str, view_side: int | None = None) -> None:
    """A DataError when an image of ``width x height`` px, or the view that scales its shorter side to
    ``view_side`` (default :data:`DEFAULT_VIEW_SIDE`), would exceed the pixel budgets above."""
    if width < 1 or height < 1:
        raise DataError(f"Image {str(path)!r} has size {width} x {height} px.")
    if width * height > MAX_IMAGE_PIXELS:
        raise DataError(f"Image {str(path)!r} has {width} x {height} = {width * height:,} pixels, more than an "
                        f"image may have ({MAX_IMAGE_PIXELS:,}); refused before decoding.")
    side = view_side or DEFAULT_VIEW_SIDE
    short, long = min(width, height), max(width, height)
    view_pixels = side * side * long / short
    if view_pixels > MAX_VIEW_PIXELS:
        raise DataError(
            f"Image {str(path)!r} is {width} x {height} px (aspect ratio {long / short:.0f}:1): scaling its shorter "
            f"side to {side} px would make {view_pixels:,.0f} pixels, more than {MAX_VIEW_PIXELS:,}; refused "
            "before decoding (crop it to a less extreme shape).")


def _eight_bit(img: Any) -> Any:
    """16-bit and 32-bit integer grey images scaled to 8-bit grey (``convert`` would clip them to white)."""
    if img.mode not in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        return img
    import numpy as np
    from PIL import Image

    scaled = np.asarray(img, dtype=np.float64) / 257.0  # 65535 -> 255
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8), mode="L")


def load_image(path: str, view_side: int | None = None) -> Any:
    """Decode one image file with PIL (fully read, so a truncated file fails here), as its pixels say:
    its EXIF orientation applied, 16-bit grey scaled (not clipped) to 8 bits. The size is checked
    against :func:`check_image_budget` from the header, before anything is decoded."""
    from PIL import Image, ImageOps

    with Image.open(path) as img:
        check_image_budget(img.width, img.height, path, view_side)
        img.load()
        return _eight_bit(ImageOps.exif_transpose(img))


def decode_image(path: str, mode: str | None, where: str) -> Any:
    """Decode ``path`` in PIL ``mode``; any failure is a :class:`DataError` naming the file, ``where`` and the cause.

    The one decoding path of image files, per item (:class:`ImageFileDataset`) or once into
    memory (:func:`dmlkit.data.splits.build_splits` with ``cache_in_memory=True``).
    """
    try:
        img = load_image(path)
        return img.convert(mode) if mode else img
    except Exception as err:  # PIL raises many types (OSError, UnidentifiedImageError, SyntaxError, ValueError, ...)
        raise DataError(f"Cannot read image {path!r} ({where}): {err}") from err


def unreadable_image_error(err: DataError) -> DataError:
    """``err`` (a file :func:`decode_image` could not read) with the setting that skips such files."""
    return DataError(f"{err} To leave unreadable images out (they are listed in the run), set "
                     "data.skip_bad_images=true (skip_bad_images=True in Python).")


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for the augmentation of item ``index`` in ``epoch`` (:func:`dmlkit.core.seeds.derive_seed`)."""
    return derive_seed(seed, epoch, index)


class SeededAugmentation:
    """Mixin: run ``transform`` with torch's CPU generator seeded from ``(augmentation_seed, epoch, index)``.

    Random augmentations then depend only on the item, the epoch and the seed: identical for any
    number of DataLoader workers and after a mid-epoch resume. The caller's generator state is
    restored afterwards. Call ``set_epoch(e)`` each epoch (before the DataLoader iterator is
    created, so workers see it; use non-persistent workers). ``augmentation_seed=None`` leaves the
    global generator alone.
    """

    augmentation_seed: int | None = None
    epoch: int = 0
    transform: Transform | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _apply_transform(self, image: Any, index: int) -> Any:
        if self.transform is None:
            return image
        if self.augmentation_seed is None:
            return self.transform(image)
        generator = torch.default_generator
        saved = generator.get_state()
        generator.manual_seed(item_seed(self.augmentation_seed, self.epoch, index))
        try:
            return self.transform(image)
        finally:
            generator.set_state(saved)


class ImageFileDataset(SeededAugmentation, Dataset):
    """A split made of image files; item ``i`` is ``(transform(image), label)``.

    ``labels`` is an int64 tensor ``[N]`` with ids ``0..C-1`` indexing ``class_names``.
    An unreadable image raises :class:`DataError` naming the file, or, with
    ``skip_bad_images=True``, is replaced by the next readable image of the same class
    after a warning naming the file (so batch composition is kept).

    Such files are found when an item is read, and collected in ``bad_paths``, a set that
    :meth:`subset` shares with the splits it makes (a validation split cut from the training
    split reports into the same set); :meth:`DataSplits.skipped_per_item` gathers them and a
    run records them in ``log.jsonl`` and ``manifest.json`` when it finishes. Items read in
    DataLoader worker processes (``num_workers > 0``; the recipe picks workers only on a GPU)
    fill the workers' copies of the set, which never reach this process: those files are
    warned about by the worker but not counted (as are those read by ``torchrun`` ranks other
    than 0, which writes the run).
    """

    def __init__(
        self,
        paths: Sequence[str],
        labels: torch.Tensor,
        class_names: Sequence[str],
        transform: Transform | None = None,
        *,
        mode: str = "RGB",
        skip_bad_images: bool = False,
        name: str = "dataset",
        augmentation_seed: int | None = None,
    ):
        if len(paths) != len(labels):
            raise DataError(f"paths has {len(paths)} entries but labels has {len(labels)}.")
        self.paths = list(paths)
        self.labels = as_class_ids(labels, f"ImageFileDataset {name!r}")
        self.class_names = list(class_names)
        self.transform = transform
        self.mode = mode
        self.skip_bad_images = skip_bad_images
        self.name = name
        self.augmentation_seed = augmentation_seed
        self.bad_paths: set[str] = set()

    def __len__(self) -> int:
        return len(self.paths)

    def _decode(self, index: int) -> Any:
        return decode_image(self.paths[index], self.mode, f"item {index} of {self.name}")

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = int(self.labels[index])
        try:
            img = self._decode(index)
        except DataError as err:
            if not self.skip_bad_images:
                raise unreadable_image_error(err) from err.__cause__
            img = self._replacement(index, err)
        return self._apply_transform(img, index), label

    def _replacement(self, index: int, err: DataError) -> Any:
        """Warn about a bad file and decode the next readable image of the same class."""
        self.bad_paths.add(self.paths[index])
        warnings.warn(f"Skipping unreadable image: {err}", RuntimeWarning, stacklevel=3)
        same_class = torch.nonzero(self.labels == self.labels[index]).flatten().tolist()
        start = same_class.index(index)
        for j in same_class[start + 1 :] + same_class[:start]:
            if self.paths[j] in self.bad_paths:
                continue
            try:
                return self._decode(j)
            except DataError:
                self.bad_paths.add(self.paths[j])
        raise DataError(
            f"Every image of class {self.class_names[int(self.labels[index])]!r} in {self.name} is unreadable; "
            f"first failure: {err}"
        )

    def subset(self, indices: torch.Tensor, *, relabel: bool = True) -> "ImageFileDataset":
        """The rows ``indices`` as a new split (labels re-indexed to 0..C'-1 when ``relabel``)."""
        indices = torch.as_tensor(indices, dtype=torch.int64)
        labels, names = _relabel(self.labels[indices], self.class_names, relabel)
        subset = ImageFileDataset(
            [self.paths[i] for i in indices.tolist()], labels, names, self.transform,
            mode=self.mode, skip_bad_images=self.skip_bad_images, name=self.name,
            augmentation_seed=self.augmentation_seed,
        )
        subset.bad_paths = self.bad_paths  # one record of the bad files of a source, whichever part reads them
        return subset


class TensorImageDataset(SeededAugmentation, Dataset):
    """A split held in memory: ``images`` ``[N, C, H, W]`` (uint8 0..255 or float), ``labels`` ``[N]`` int64.

    Item ``i`` is ``(transform(image_float01), label)`` with no PIL decoding. ``paths`` names the
    file each image was decoded from (image files decoded once into memory), or is None (data that
    has no files, e.g. MNIST).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        class_names: Sequence[str],
        transform: Transform | None = None,
        *,
        name: str = "dataset",
        augmentation_seed: int | None = None,
        paths: Sequence[str] | None = None,
    ):
        if images.dim() != 4:
            raise DataError(f"images must be [N, C, H, W]. Got shape {tuple(images.shape)}.")
        if images.shape[0] != len(labels):
            raise DataError(f"images has {images.shape[0]} rows but labels has {len(labels)}.")
        if paths is not None and len(paths) != len(labels):
            raise DataError(f"paths has {len(paths)} entries but labels has {len(labels)}.")
        self.paths = None if paths is None else list(paths)
        self.images = images
        self.labels = as_class_ids(labels, f"TensorImageDataset {name!r}")
        self.class_names = list(class_names)
        self.transform = transform
        self.name = name
        self.augmentation_seed = augmentation_seed

    def __len__(self) -> int:
        return self.images.shape[0]

    def float_images(self, indices: torch.Tensor | slice | None = None) -> torch.Tensor:
        """Images as float32 in [0, 1], ``[n, C, H, W]`` (whole split when ``indices`` is None)."""
        x = self.images if indices is None else self.images[indices]
        return torch.div(x, 255.0) if x.dtype == torch.uint8 else x.float()  # one kernel: uint8 / 255 is float32

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img = self.float_images(slice(index, index + 1))[0]
        return self._apply_transform(img, index), int(self.labels[index])

    def get_batch(self, indices: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images ``[n, C', H', W']`` (float32, transformed) and labels ``[n]`` (int64) of ``indices`` in one go.

        A batch-capable transform (``transform.batched = True``, e.g. ``BackboneNormalize``) is applied
        to the whole batch; any other transform per item, with the same per-item seeding as ``[i]``.
        """
        rows = torch.as_tensor(indices, dtype=torch.int64)
        images = self.float_images(host_to_device(rows, self.images.device))  # images on a card: a queued copy
        if self.transform is not None:
            if getattr(self.transform, "batched", False):
                images = self.transform(images)
            else:
                images = torch.stack([self._apply_transform(img, int(i)) for img, i in zip(images, rows.tolist())])
        return images, self.labels[rows]

    def thumbnails(self, max_size: int = 64) -> Any:
        """uint8 ``[N, H, W]`` (grey) or ``[N, H, W, 3]`` pictures for reports, at most ``max_size`` pixels a side."""
        import numpy as np
        import torch.nn.functional as F

        x = self.images if self.images.dtype == torch.uint8 else (self.images.float().clamp(0, 1) * 255).round()
        h, w = x.shape[-2:]
        if max(h, w) > max_size:
            x = F.interpolate(x.float(), scale_factor=max_size / max(h, w), mode="area").round()
        x = x.to(torch.uint8)
        if x.shape[1] == 1:
            return x[:, 0].numpy()
        return x[:, :3].permute(0, 2, 3, 1).contiguous().numpy() if x.shape[1] >= 3 else np.asarray(x[:, 0])

    def subset(self, indices: torch.Tensor, *, relabel: bool = True) -> "TensorImageDataset":
        """The rows ``indices`` as a new split (labels re-indexed to 0..C'-1 when ``relabel``)."""
        indices = torch.as_tensor(indices, dtype=torch.int64)
        labels, names = _relabel(self.labels[indices], self.class_names, relabel)
        paths = None if self.paths is None else [self.paths[i] for i in indices.tolist()]
        return TensorImageDataset(self.images[indices], labels, names, self.transform, name=self.name,
                                  augmentation_seed=self.augmentation_seed, paths=paths)


def _relabel(labels: torch.Tensor, class_names: Sequence[str], relabel: bool) -> tuple[torch.Tensor, list[str]]:
    if not relabel:
        return labels.clone(), list(class_names)
    present, new_labels = torch.unique(labels, sorted=True, return_inverse=True)
    return new_labels.to(torch.int64), [class_names[i] for i in present.tolist()]


SplitDataset = ImageFileDataset | TensorImageDataset


@dataclass
class DataSplits:
    """The splits of one data set under one protocol.

    ``train`` is always set. ``val`` is the held-out fold of the training classes (None
    without a fold). Leave-one-out data sets set ``test``; In-Shop sets ``query`` and
    ``gallery`` (which share one label space) and ``eval_mode="query_gallery"``, as does a CSV manifest
    with ``is_query``/``is_gallery`` (where a row may be both). ``categories`` names the category of every
    evaluated row (``test``, or ``query``) when the data has one (a CSV ``category`` column), for
    per-category metrics. ``before_holdout`` is the training split before its validation classes were held out
    (set when they were: ensemble members with their own folds train on parts of it).
    """

    name: str
    train: SplitDataset
    val: SplitDataset | None = None
    test: SplitDataset | None = None
    query: SplitDataset | None = None
    gallery: SplitDataset | None = None
    eval_mode: str = "leave_one_out"
    info: dict = field(default_factory=dict)
    categories: list[str] | None = None
    before_holdout: SplitDataset | None = None

    def items(self) -> list[tuple[str, SplitDataset]]:
        """(split name, dataset) for every split that is present, in a fixed order."""
        order = ("train", "val", "test", "query", "gallery")
        return [(k, getattr(self, k)) for k in order if getattr(self, k) is not None]

    def describe(self) -> str:
        """Classes and images of every split in one line, with the share of the images that train and why a
        folder's test split took the classes it took: ``6 classes (150 images) train, 2 classes (50 images)
        validate, 4 classes (100 images) test; 50% of the 300 images train``."""
        verbs = {"train": "train", "val": "validate", "test": "test", "query": "query", "gallery": "gallery"}
        parts = [f"{len(torch.unique(ds.labels))} classes ({len(ds):,} images) {verbs[name]}" for name, ds in self.items()]
        line = ", ".join(parts)
        if self.eval_mode != "query_gallery":  # query and gallery may share images: no share of a total
            total = sum(len(ds) for _, ds in self.items())
            line += f"; {len(self.train) / max(total, 1):.0%} of the {total:,} images train"
        reason = (self.info.get("class_split") or {}).get("test_classes")
        return line + (f" ({reason})" if reason else "")

    def skipped_per_item(self) -> list[str]:
        """Sorted paths of the unreadable files that splits read per item have skipped so far
        (``skip_bad_images``; see :class:`ImageFileDataset`). Files left out when decoding into
        memory are in ``info["skipped_images"]`` instead."""
        found: set[str] = set()
        for _, dataset in self.items():
            found.update(str(p) for p in getattr(dataset, "bad_paths", ()))
        return sorted(found)
