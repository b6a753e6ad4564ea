"""Build the train / val / test splits of a data set under the class-disjoint protocol.

Class-disjoint k-fold of the training classes (ASAP, Appendix A.2, after Musgrave et al. 2020):
the training classes are shuffled with ``seed`` and cut into ``num_folds`` folds; fold ``f`` is
validation, the others are training. Test classes are never touched.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from dmlkit.core.validation import BOOL, NONE, InstanceOf, Interval, validate_params
from dmlkit.data.base import DataSplits, ImageFileDataset, TensorImageDataset, contiguous_labels, unreadable_image_error
from dmlkit.data.registry import DatasetSpec, SplitSource, get_dataset_spec
from dmlkit.exceptions import DataError, InvalidParameterError


def class_disjoint_folds(class_names: Sequence[str], num_folds: int, seed: int) -> list[list[str]]:
    """Partition the distinct ``class_names`` into ``num_folds`` folds of near-equal size.

    ASAP Appendix A.2 / Musgrave et al. (2020): classes sorted, shuffled by ``seed``, cut in order.
    Fold sizes differ by at most one; the result depends only on the class set and ``seed``.
    """
    names = sorted(set(class_names))
    if num_folds < 2:
        raise InvalidParameterError(f"The 'num_folds' parameter must be an int >= 2. Got {num_folds} instead.")
    if num_folds > len(names):
        raise InvalidParameterError(
            f"num_folds={num_folds} needs at least {num_folds} training classes but there are {len(names)}."
        )
    order = torch.randperm(len(names), generator=torch.Generator().manual_seed(int(seed))).tolist()
    shuffled = [names[i] for i in order]
    base, extra = divmod(len(names), num_folds)
    folds, start = [], 0
    for f in range(num_folds):
        size = base + (1 if f < extra else 0)
        folds.append(sorted(shuffled[start : start + size]))
        start += size
    return folds


def member_fold_count(val_class_fraction: float) -> int:
    """Folds of the training classes that ``protocol.member_folds`` deals an ensemble's members (one held out by each
    member): ``round(1 / val_class_fraction)``, at least 2."""
    return max(2, round(1.0 / val_class_fraction))


def split_classes(class_names: Sequence[str], train_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Split distinct classes into (train, val) with ``round(fraction * C)`` training classes."""
    names = sorted(set(class_names))
    n_train = int(round(train_fraction * len(names)))
    if not 0 < n_train < len(names):
        raise InvalidParameterError(
            f"train_fraction={train_fraction} leaves {n_train} of {len(names)} classes for training; "
            "both train and val need at least one class."
        )
    order = torch.randperm(len(names), generator=torch.Generator().manual_seed(int(seed))).tolist()
    shuffled = [names[i] for i in order]
    return sorted(shuffled[:n_train]), sorted(shuffled[n_train:])


def shuffle_within_classes(
    labels: torch.Tensor, generator: torch.Generator, eligible: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows sorted by class in a seeded random order within each class, and each row's rank there.

    Returns ``(order [N], rank [N])``: ``order`` lists dataset rows class by class (random within
    a class; rows where ``eligible`` is False come after the eligible ones of their class) and
    ``rank[i]`` is the position of ``order[i]`` inside its class. One sort, no loop over classes.
    """
    keys = torch.rand(len(labels), generator=generator, dtype=torch.float64)
    if eligible is not None:
        keys = keys + (~eligible).double() * 2.0
    order = torch.argsort(labels.double() * 4.0 + keys)
    sorted_labels = labels[order]
    counts = torch.bincount(labels)
    starts = torch.cumsum(counts, 0) - counts
    return order, torch.arange(len(labels)) - starts[sorted_labels]


def _rows_in(names: Sequence[str], keep: set[str]) -> torch.Tensor:
    return torch.tensor([i for i, n in enumerate(names) if n in keep], dtype=torch.int64)


def _resize_images(images: torch.Tensor, image_size: int | Sequence[int] | None) -> torch.Tensor:
    """Resize an in-memory uint8 ``[N, C, H, W]`` batch once (bilinear) to ``image_size`` (side or
    ``(H, W)``), so items need no per-item work."""
    if image_size is None:
        return images
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(int(v) for v in image_size)
    if tuple(images.shape[-2:]) == size:
        return images
    x = F.interpolate(images.float(), size=size, mode="bilinear", align_corners=False, antialias=True)
    return x.round_().clamp_(0, 255).to(torch.uint8)


#: Image-file splits whose decoded pixels fit in this many bytes are decoded once into memory.
MEMORY_CACHE_BYTES = 2 * 2**30


def _decode_into_memory(
    source: SplitSource, mode: str, image_size: int | None, *, split: str, skip_bad_images: bool = False,
    center_crop: bool = False, interpolation: str = "bilinear", view=None,
) -> SplitSource | None:
    """``source`` with its image files decoded (and resized to ``image_size``) into a uint8 tensor.

    Returns None when the decoded split would exceed :data:`MEMORY_CACHE_BYTES` or when the images
    differ in size and no ``image_size`` makes them uniform: such splits stay on disk with per-item
    transforms. Small glyph and digit sets (Omniglot, a user's folder of icons) then train with the
    same batched augmentation as MNIST, without decoding a PNG per item per epoch. Glyphs are resized
    whole to ``image_size`` squares; with ``center_crop`` (photos) every image is stored as its
    :func:`~dmlkit.data.transforms.photo_view` (with the backbone's ``interpolation``), whatever its
    size and aspect. Files are decoded by :func:`~dmlkit.data.base.decode_image`, as per item: an
    unreadable file is a ``DataError`` naming it, or, with ``skip_bad_images``, left out and listed
    in ``skipped``. The paths are kept. ``view`` (PIL -> PIL; a :class:`~dmlkit.data.transforms.PhotoPipeline`'s
    stored view) replaces the recipe's photo view.
    """
    import numpy as np
    from PIL import Image

    from dmlkit.data.base import decode_image
    from dmlkit.data.transforms import photo_view

    if source.paths is None or not source.paths:
        return None
    if center_crop and not image_size:
        raise InvalidParameterError("Decoding photos as centre crops needs an image_size.")
    channels = 1 if mode == "L" else 3
    if image_size and len(source.paths) * channels * image_size * image_size > MEMORY_CACHE_BYTES:
        return None
    if view is None and center_crop:
        view = photo_view(image_size, interpolation)
    arrays, kept, skipped, size = [], [], [], None
    for index, path in enumerate(source.paths):
        try:
            img = decode_image(path, mode, f"item {index} of the {split} split")
        except DataError as err:
            if not skip_bad_images:
                raise unreadable_image_error(err) from err.__cause__
            warnings.warn(f"Skipping unreadable image: {err}", RuntimeWarning, stacklevel=3)
            skipped.append(path)
            continue
        if view is not None:
            img = view(img)
        elif image_size:
            img = img.resize((image_size, image_size), Image.BILINEAR)
        if size is None:
            size = img.size[::-1]
            if len(source.paths) * channels * size[0] * size[1] > MEMORY_CACHE_BYTES:
                return None
        elif img.size[::-1] != size:
            return None
        arr = np.asarray(img, dtype=np.uint8)
        arrays.append(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1))
        kept.append(index)
    if not arrays:
        raise DataError(f"Every image of the {split} split is unreadable ({len(skipped)} files; first: {skipped[0]!r}).")
    names = {kind: [values[i] for i in kept] for kind, values in source.names.items()}
    return SplitSource(names=names, paths=[source.paths[i] for i in kept], images=torch.from_numpy(np.stack(arrays)),
                       skipped=skipped)


def decode_resized(image, mode: str, size: Sequence[int] | None):
    """A PIL image as uint8 ``[C, H, W]`` in colour ``mode`` (``"L"``/``"RGB"``), resized (bilinear) to
    ``size = (H, W)`` when it differs: how image files become the pixels of an in-memory split."""
    import numpy as np
    from PIL import Image

    img = image.convert(mode)
    if size is not None and img.size[::-1] != tuple(size):
        img = img.resize((int(size[1]), int(size[0])), Image.BILINEAR)
    arr = np.array(img, dtype=np.uint8)  # a writable copy
    return arr[None] if arr.ndim == 2 else np.ascontiguousarray(arr.transpose(2, 0, 1))


def _make_split(
    spec: DatasetSpec,
    source: SplitSource,
    rows: torch.Tensor | None,
    label: str,
    transform,
    image_size: int | None,
    skip_bad_images: bool,
    split_name: str,
    augmentation_seed: int | None = None,
):
    names = source.names[label]
    if rows is not None:
        names = [names[i] for i in rows.tolist()]
    labels, class_names = contiguous_labels(names)
    tag = f"{spec.name}/{split_name}"
    paths = source.paths if rows is None or source.paths is None else [source.paths[i] for i in rows.tolist()]
    if source.images is not None:
        images = source.images if rows is None else source.images[rows]
        return TensorImageDataset(_resize_images(images, image_size), labels, class_names, transform, name=tag,
                                  augmentation_seed=augmentation_seed, paths=paths)
    return ImageFileDataset(
        paths, labels, class_names, transform, mode=spec.image_mode, skip_bad_images=skip_bad_images, name=tag,
        augmentation_seed=augmentation_seed,
    )


def build_splits(
    name: str,
    root: str | os.PathLike | None = None,
    *,
    label: str = "class",
    eval_label: str | None = None,
    image_size: int | None = None,
    fold: int | None = None,
    num_folds: int = 4,
    train_fraction: float | None = None,
    seed: int = 0,
    train_transform=None,
    eval_transform=None,
    skip_bad_images: bool = False,
    preprocessing: Mapping[str, Any] | None = None,
    cache_in_memory: bool = False,
    center_crop: bool = False,
    crop_size: int | None = None,
    pipeline: str = "recipe",
    **dataset_options: Any,
) -> DataSplits:
    """Read data set ``name`` from ``root`` and return its class-disjoint splits.

    ``label`` labels the training split, ``eval_label`` (default: ``label``) the val/test/query/
    gallery splits. With ``fold`` in ``[0, num_folds)``, training classes are cut into class-disjoint
    folds (ASAP App. A.2): ``train`` keeps the other folds and ``val`` is fold ``fold``. With
    ``train_fraction`` instead, one seeded class-disjoint train/val cut is made. Test classes are
    never used for either. ``preprocessing`` (a backbone's ``pretrained_cfg``-like dict with
    ``mean``, ``std``, ``input_size``, ``color``, ``scale``) normalises the default transforms.
    ``cache_in_memory=True`` decodes small image-file splits once into memory (see
    :func:`_decode_into_memory`; a data set read from a zip is in memory anyway).
    ``center_crop=True`` (photos) decodes every split as its :func:`photo_view` at ``image_size``;
    splits too large for memory then stay on disk, training on random resized crops of
    ``crop_size`` and evaluating on that same view. ``pipeline`` (``data.pipeline``) names the
    :func:`~dmlkit.data.transforms.photo_pipeline` that decides, for both storages, the stored view,
    the training crops and the evaluation crop of photos (``recipe``: the view just described).
    ``dataset_options`` go to the reader (e.g. ``allow_outside_root=True``
    for ``name="csv"``). Labels of every split are int64 ids ``0..C-1`` over its own classes,
    except query and gallery, which share one label space. Transforms default to
    :func:`dmlkit.data.transforms.default_transforms` for image files and to none for in-memory
    data (``image_size`` then resizes the tensors once). The training split's random augmentation
    is seeded per item from ``(seed, epoch, index)``; call ``splits.train.set_epoch(e)`` each epoch.
    """
    _check_split_arguments(name, label, eval_label, image_size, fold, num_folds, train_fraction, seed, skip_bad_images)
    spec = get_dataset_spec(name)
    label = spec.resolve_label(label, "label")
    eval_label = spec.resolve_label(eval_label if eval_label is not None else label, "eval_label")
    sources = _read_sources(spec, name, root, label, eval_label, dataset_options)

    class_split = sources["train"].class_split  # kept before decoding, which makes new sources
    # a reader may return query and gallery sources for any data set (a CSV with is_query/is_gallery)
    eval_mode = "query_gallery" if "query" in sources else spec.eval_mode
    decoded_here = False  # image files decoded (and resized) with PIL by _decode_into_memory
    interpolation = str((preprocessing or {}).get("interpolation", "bilinear"))
    photos = None
    if center_crop:
        from dmlkit.data.transforms import photo_pipeline

        photos = photo_pipeline(pipeline, image_size, crop_size, interpolation)
    if cache_in_memory and (train_transform is None or eval_transform is None) and eval_mode != "query_gallery":
        sources, decoded_here = _decoded_sources(sources, spec.image_mode, image_size, skip_bad_images, center_crop,
                                                 interpolation, photos)
    in_memory = all(src.images is not None for src in sources.values())
    record_eval_input = eval_transform is None  # new images can be prepared as the default evaluation is
    if train_transform is None or eval_transform is None:
        default_train, default_eval = _default_transforms(spec, photos, in_memory, decoded_here, image_size,
                                                          preprocessing)
        train_transform = default_train if train_transform is None else train_transform
        eval_transform = default_eval if eval_transform is None else eval_transform
    stored = photos.view if photos is not None and decoded_here else image_size  # photos: their stored view
    tensor_size = stored if in_memory else None

    train_source = sources["train"]
    group = spec.group_of(label, eval_label)
    info: dict[str, Any] = {"label": label, "eval_label": eval_label, "group": group, "seed": seed}
    if class_split is not None:
        info["class_split"] = class_split
    skipped = [path for src in sources.values() for path in src.skipped]
    if skipped:
        info["skipped_images"] = skipped
    train_rows, val_rows, held_out = _validation_rows(train_source.names[group], fold, num_folds, train_fraction, seed)
    info.update(held_out)

    def make(source, rows, lab, tf, split_name, augmentation_seed=None):
        return _make_split(spec, source, rows, lab, tf, tensor_size, skip_bad_images, split_name, augmentation_seed)

    splits = DataSplits(
        name=name,
        train=make(train_source, train_rows, label, train_transform, "train", augmentation_seed=seed),
        val=None if val_rows is None else make(train_source, val_rows, eval_label, eval_transform, "val"),
        eval_mode=eval_mode,
        info=info,
    )
    if splits.val is not None and int(splits.val.labels.unique().numel()) < 2:
        _warn_single_validation_class(name, eval_label, fold, num_folds, train_fraction)
    if eval_mode == "query_gallery":
        splits.query, splits.gallery = _query_gallery(spec, sources, eval_label, eval_transform, skip_bad_images)
    else:
        splits.test = make(sources["test"], None, eval_label, eval_transform, "test")
    evaluated_source = sources["query" if eval_mode == "query_gallery" else "test"]
    if "category" in evaluated_source.names:
        splits.categories = list(evaluated_source.names["category"])
    if record_eval_input:
        splits.info["eval_input"] = _eval_input(splits, spec, in_memory, decoded_here, image_size, tensor_size)
        if center_crop:  # photos: the centre-crop view, with the backbone's interpolation
            splits.info["eval_input"].update(view="photo", crop_size=crop_size or image_size,
                                             interpolation=interpolation, pipeline=pipeline)
    return splits


def _check_split_arguments(name, label, eval_label, image_size, fold, num_folds, train_fraction, seed,
                           skip_bad_images) -> None:
    """:func:`build_splits`' parameters checked against their constraints, and ``fold`` against ``num_folds``."""
    validate_params(
        "build_splits",
        dict(name=name, label=label, eval_label=eval_label, image_size=image_size, fold=fold,
             num_folds=num_folds, train_fraction=train_fraction, seed=seed, skip_bad_images=skip_bad_images),
        dict(
            name=[InstanceOf((str,))],
            label=[InstanceOf((str,))],
            eval_label=[InstanceOf((str,)), NONE],
            image_size=[Interval(int, 1, None), NONE],
            fold=[Interval(int, 0, None), NONE],
            num_folds=[Interval(int, 2, None)],
            train_fraction=[Interval(float, 0, 1, closed="neither"), NONE],
            seed=[Interval(int, 0, None)],
            skip_bad_images=[BOOL],
        ),
    )
    if fold is not None and fold >= num_folds:
        raise InvalidParameterError(
            f"The 'fold' parameter of build_splits must be an int in the range [0, {num_folds - 1}] "
            f"for num_folds={num_folds}. Got {fold} instead."
        )
    if fold is not None and train_fraction is not None:
        raise InvalidParameterError("build_splits takes either 'fold' or 'train_fraction', not both.")


def _read_sources(spec: DatasetSpec, name: str, root, label: str, eval_label: str,
                  dataset_options: Mapping[str, Any]) -> dict[str, SplitSource]:
    """The reader's sources of each split (``train``, ``test`` or ``query`` / ``gallery``) of data set ``name``."""
    if not spec.in_memory and root is None:
        raise InvalidParameterError(f"Dataset {name!r} is read from disk: pass root=<directory>. Layout: {spec.layout}")
    try:
        return spec(root=None if root is None else str(root), label=label, eval_label=eval_label, **dataset_options)
    except TypeError as err:
        if dataset_options and "unexpected keyword" in str(err):
            raise InvalidParameterError(f"Dataset {name!r} does not take the options {sorted(dataset_options)}.") from err
        raise


def _decoded_sources(sources: dict[str, SplitSource], mode: str, image_size: int | None, skip_bad_images: bool,
                     center_crop: bool, interpolation: str, photos) -> tuple[dict[str, SplitSource], bool]:
    """Every split's images decoded once into memory (:func:`_decode_into_memory`) and True; the sources as they
    were and False when one split is too large for it."""
    cached = {k: _decode_into_memory(v, mode, image_size, split=k, skip_bad_images=skip_bad_images,
                                     center_crop=center_crop, interpolation=interpolation,
                                     view=photos.view_transform() if photos is not None else None)
              for k, v in sources.items()}
    if all(c is not None for c in cached.values()):
        return cached, True
    return sources, False


def _default_transforms(spec: DatasetSpec, photos, in_memory: bool, decoded_here: bool, image_size: int | None,
                        preprocessing: Mapping[str, Any] | None):
    """The default ``(training, evaluation)`` transforms for where the images are: photos decoded into memory or
    read per item (their pipeline's), other data in memory (normalisation only) or image files."""
    from dmlkit.data.transforms import default_transforms, tensor_transform

    if in_memory and photos is not None and decoded_here:
        return photos.tensor_transforms(preprocessing)
    if in_memory:
        normalise = tensor_transform(preprocessing)
        return normalise, normalise
    if photos is not None:
        return photos.item_transforms(preprocessing)
    return default_transforms(spec, image_size, preprocessing)


def _validation_rows(groups: Sequence[str], fold: int | None, num_folds: int, train_fraction: float | None,
                     seed: int) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, Any]]:
    """``(train rows, val rows, what the splits' info records)`` of the training source: fold ``fold`` of the
    class-disjoint folds, or a seeded ``train_fraction`` cut of the classes; no validation rows without either."""
    if fold is not None:
        folds = class_disjoint_folds(groups, num_folds, seed)
        held_out = set(folds[fold])
        return (_rows_in(groups, set().union(*folds) - held_out), _rows_in(groups, held_out),
                dict(fold=fold, num_folds=num_folds, val_classes=folds[fold]))
    if train_fraction is not None:
        kept, held = split_classes(groups, train_fraction, seed)
        return (_rows_in(groups, set(kept)), _rows_in(groups, set(held)),
                dict(train_fraction=train_fraction, val_classes=held))
    return None, None, {}


def _warn_single_validation_class(name: str, eval_label: str, fold: int | None, num_folds: int,
                                  train_fraction: float | None) -> None:
    """Warn (at :func:`build_splits`' caller) that a validation split of one class cannot select or stop."""
    where = f"fold={fold} of num_folds={num_folds}" if fold is not None else f"train_fraction={train_fraction}"
    warnings.warn(
        f"The validation split ({where}) of {name!r} holds a single {eval_label!r} class: its MAP@R is "
        "always 1, so validation cannot select a checkpoint or stop early. Use fewer folds or a data set "
        "with more training classes.",
        stacklevel=3,
    )


def _eval_input(splits: DataSplits, spec: DatasetSpec, in_memory: bool, decoded_here: bool,
                image_size: int | None, tensor_size: int | None) -> dict[str, Any]:
    """How the evaluation splits turn an image into the model's input (saved in the run's manifest,
    read back by :func:`query_split` so new images are prepared exactly as the test split was).

    ``in_memory``: a uint8 tensor of ``size = [H, W]``, resized by PIL while decoding the files
    (``resize="pil"``) or as a tensor after the reader decoded them (``"tensor"``), then the
    in-memory normalisation; otherwise per-file with the default evaluation transform at
    ``image_size``. ``input_size`` is the ``[C, H, W]`` the model saw. Photos (``view="photo"``) are
    read as their :func:`~dmlkit.data.transforms.photo_view` at ``image_size`` in both cases.
    """
    evaluated = splits.test if splits.test is not None else splits.query
    size = list(evaluated.images.shape[-2:]) if in_memory else None
    if size is not None and tensor_size is not None:
        size = [tensor_size, tensor_size]
    return {
        "in_memory": in_memory,
        "resize": "pil" if decoded_here else "tensor",
        "mode": ("L" if evaluated.images.shape[1] == 1 else "RGB") if in_memory else spec.image_mode,
        "size": size,
        "image_size": image_size,
        "input_size": _input_size(evaluated, in_memory, spec.image_mode, image_size),
    }


def _input_size(evaluated, in_memory: bool, mode: str, image_size: int | None) -> list[int]:
    """``[C, H, W]`` of the model's input for this split, without reading an image file: an in-memory
    item, or the evaluation transform applied to a blank image (resize/crop pipelines give a fixed size)."""
    if in_memory:
        return list(evaluated.get_batch([0])[0].shape[1:])
    from PIL import Image

    side = image_size or 256
    return list(evaluated.transform(Image.new(mode, (side, side))).shape)


def query_split(images: Sequence[Any], name: str, eval_input: Mapping[str, Any], preprocessing=None):
    """New images (paths or PIL images) as a split prepared exactly as a run's evaluation splits:
    ``eval_input`` is what :func:`build_splits` recorded (``splits.info["eval_input"]``); labels are -1.

    In-memory runs decode and resize the images into a uint8 tensor and normalise it as the
    test split's tensor was; image-file runs apply the data set's default evaluation transform.
    """
    spec = get_dataset_spec(name)
    n = len(images)
    labels = torch.full((n,), -1, dtype=torch.int64)
    if eval_input["in_memory"]:
        from dmlkit.data.transforms import tensor_transform

        size = eval_input["size"]
        pixels = []
        view = _photo_view_of(eval_input)
        for x in images:
            img = _read_query_image(x, _view_side(eval_input))
            if view is not None:
                pixels.append(torch.from_numpy(decode_resized(view(img.convert(eval_input["mode"])), eval_input["mode"],
                                                              None)))
            elif eval_input["resize"] == "tensor":  # decoded at native size, resized as _resize_images does
                pixels.append(_resize_images(torch.from_numpy(decode_resized(img, eval_input["mode"], None))[None],
                                             size)[0])
            else:
                pixels.append(torch.from_numpy(decode_resized(img, eval_input["mode"], size)))
        photos = _photo_pipeline_of(eval_input)
        transform = tensor_transform(preprocessing) if photos is None else photos.tensor_transforms(preprocessing)[1]
        return TensorImageDataset(torch.stack(pixels), labels, ["?"], transform, name=f"{name}/query")
    from dmlkit.data.transforms import default_transforms

    if eval_input.get("view") == "photo":
        transform = _photo_pipeline_of(eval_input).item_transforms(preprocessing)[1]
    else:
        transform = default_transforms(spec, eval_input["image_size"], preprocessing)[1]
    query = _QueryImages(list(images), labels, ["?"], transform, mode=spec.image_mode, name=f"{name}/query")
    query.view_side = _view_side(eval_input)
    return query


def _view_side(eval_input: Mapping[str, Any]) -> int | None:
    """The shorter side a run's evaluation view scales an image to (None: the default budget applies)."""
    if eval_input.get("image_size") is None:
        return None
    return int(round(int(eval_input["image_size"]) * 256 / 224))


def _photo_pipeline_of(eval_input: Mapping[str, Any]):
    """The :class:`~dmlkit.data.transforms.PhotoPipeline` of a run's photos, or None (not photos)."""
    if eval_input.get("view") != "photo":
        return None
    from dmlkit.data.transforms import photo_pipeline

    return photo_pipeline(str(eval_input.get("pipeline", "recipe")), int(eval_input["image_size"]),
                          eval_input.get("crop_size"), str(eval_input.get("interpolation", "bilinear")))


def _photo_view_of(eval_input: Mapping[str, Any]):
    """The photo view a run's in-memory evaluation splits were decoded as, or None (not photos)."""
    photos = _photo_pipeline_of(eval_input)
    return None if photos is None else photos.view_transform()


def _read_query_image(image, view_side: int | None = None):
    """A path decoded with PIL (a DataError naming an unreadable file), or a PIL image as given."""
    from dmlkit.data.base import load_image
    from dmlkit.exceptions import DataError

    if not isinstance(image, (str, os.PathLike)):
        return image
    try:
        return load_image(image, view_side)
    except Exception as err:  # PIL raises many types (OSError, SyntaxError, ValueError, ...)
        raise DataError(f"Cannot read query image {str(image)!r}: {err}") from err


class _QueryImages(ImageFileDataset):
    """Query images given as paths or PIL images, transformed like an image-file split."""

    view_side: int | None = None

    def _decode(self, index: int):
        img = _read_query_image(self.paths[index], self.view_side)
        return img.convert(self.mode) if self.mode else img


def _query_gallery(spec, sources, eval_label, transform, skip_bad_images):
    """Query and gallery splits re-indexed jointly so equal ids mean the same item."""
    query, gallery = sources["query"], sources["gallery"]
    labels, class_names = contiguous_labels(query.names[eval_label] + gallery.names[eval_label])
    n_query = len(query)
    out = []
    for src, lab, tag in ((query, labels[:n_query], "query"), (gallery, labels[n_query:], "gallery")):
        out.append(
            ImageFileDataset(src.paths, lab, class_names, transform, mode=spec.image_mode,
                             skip_bad_images=skip_bad_images, name=f"{spec.name}/{tag}")
        )
    return out


def write_manifest(splits: DataSplits, path: str | os.PathLike) -> Path:
    """Write every split's paths, labels and class names to ``path`` as JSON (atomically).

    In-memory splits have ``"paths": null``; their labels and class names are still written.
    """
    doc = {"dataset": splits.name, "eval_mode": splits.eval_mode, "info": splits.info, "splits": {}}
    for split_name, ds in splits.items():
        doc["splits"][split_name] = {
            "num_images": len(ds),
            "num_classes": len(ds.class_names),
            "class_names": list(ds.class_names),
            "labels": ds.labels.tolist(),
            "paths": None if ds.paths is None else list(ds.paths),
        }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return path
