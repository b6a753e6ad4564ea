"""Omniglot (Lake et al. 2015), ``omniglot-py`` layout; labels at character or alphabet level.

``omniglot``: background and evaluation sets pooled, classes sorted by name, first half train,
second half test (the split unit is the alphabet when either label is ``alphabet``, so test
alphabets are unseen; EPS Sec. 5 trains on alphabets and evaluates on characters).
``omniglot_background``: the official background (30 alphabets) / evaluation (20) split.
"""

from __future__ import annotations

import os
from pathlib import Path

from dmlkit.data.registry import DatasetSpec, SplitSource, register_dataset
from dmlkit.exceptions import DataError

LAYOUT = (
    "<root>/[omniglot-py/]images_background/<alphabet>/<character>/*.png and/or images_evaluation/..., "
    "or one set folder alone (images_background, images_evaluation, images_background_small1, ...), "
    "or the set zip files (images_background.zip, images_background_small1.zip, ...) in <root> or as <root>"
)
SETS = ("images_background", "images_evaluation")
#: Set folders/zips torchvision and the original release use, in pooling order.
SET_NAMES = (
    "images_background", "images_evaluation",
    "images_background_small1", "images_background_small2",
)


def _subdirs(path: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))


def _scan_set(base: Path, set_name: str) -> SplitSource:
    """Every png under ``base/set_name/<alphabet>/<character>/`` with its character and alphabet names."""
    paths, characters, alphabets = [], [], []
    for alphabet in _subdirs(base / set_name):
        for character in _subdirs(base / set_name / alphabet):
            folder = base / set_name / alphabet / character
            for file in sorted(f for f in os.listdir(folder) if f.lower().endswith(".png")):
                paths.append(str(folder / file))
                characters.append(f"{alphabet}/{character}")
                alphabets.append(alphabet)
    return SplitSource(names={"character": characters, "alphabet": alphabets}, paths=paths)


def _read_zip(path: Path) -> SplitSource:
    """Decode every ``<set>/<alphabet>/<character>/*.png`` in a zip into memory (uint8 ``[N, 1, H, W]``)."""
    import zipfile

    import numpy as np
    import torch
    from PIL import Image

    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as err:
        raise DataError(f"omniglot: cannot open zip file '{path}': {err}") from err
    entries = []
    with archive:
        for name in archive.namelist():
            parts = name.split("/")
            if len(parts) >= 3 and parts[-1].lower().endswith(".png"):
                entries.append((parts[-3], parts[-2], name))
        entries.sort()
        images = []
        for _, _, name in entries:
            with archive.open(name) as f, Image.open(f) as img:
                images.append(np.asarray(img.convert("L"), dtype=np.uint8))
    if not images:
        raise DataError(f"omniglot: zip file '{path}' holds no <set>/<alphabet>/<character>/*.png images. "
                        f"Expected layout: {LAYOUT}")
    shapes = {im.shape for im in images}
    if len(shapes) != 1:
        raise DataError(f"omniglot: images in '{path}' have different sizes {sorted(shapes)}; expected one size.")
    stacked = torch.from_numpy(np.stack(images))[:, None]
    return SplitSource(
        names={"character": [f"{a}/{c}" for a, c, _ in entries], "alphabet": [a for a, _, _ in entries]},
        images=stacked,
    )


def _find_sets(root) -> dict[str, SplitSource]:
    """Every set found under ``root``: folders (under ``omniglot-py/`` or not), zip files, or ``root`` as a zip."""
    root = Path(root)
    if root.is_file() and root.suffix.lower() == ".zip":
        return {root.stem: _read_zip(root)}
    found: dict[str, SplitSource] = {}
    for base in (root, root / "omniglot-py"):
        for name in SET_NAMES:
            if name in found:
                continue
            if (base / name).is_dir():
                src = _scan_set(base, name)
                if len(src) == 0:
                    raise DataError(f"omniglot: '{base / name}' holds no <alphabet>/<character>/*.png images. "
                                    f"Expected layout: {LAYOUT}")
                found[name] = src
            elif (base / f"{name}.zip").is_file():
                found[name] = _read_zip(base / f"{name}.zip")
    if not found:
        looked = ", ".join(f"{n}[.zip]" for n in SET_NAMES)
        raise DataError(f"omniglot: none of {looked} was found in '{root}' or '{root / 'omniglot-py'}'. "
                        f"Expected layout: {LAYOUT}")
    return found


def _concat(sources: list[SplitSource]) -> SplitSource:
    """Pool sets; image files stay files, and when any set was read from a zip every set is decoded into memory."""
    import torch

    names = {k: [v for src in sources for v in src.names[k]] for k in sources[0].names}
    if all(src.images is None for src in sources):
        return SplitSource(names=names, paths=[p for src in sources for p in src.paths])
    return SplitSource(names=names, images=torch.cat([_decoded(src) for src in sources]))


def _decoded(src: SplitSource):
    """The images of ``src`` as uint8 ``[N, 1, H, W]`` (decoding its files when needed)."""
    import numpy as np
    import torch
    from PIL import Image

    if src.images is not None:
        return src.images
    arrays = []
    for path in src.paths:
        with Image.open(path) as img:
            arrays.append(np.asarray(img.convert("L"), dtype=np.uint8))
    return torch.from_numpy(np.stack(arrays))[:, None]


def _select(src: SplitSource, keep: list[bool]) -> SplitSource:
    import torch

    names = {k: [v for v, ok in zip(vals, keep) if ok] for k, vals in src.names.items()}
    if src.images is not None:
        return SplitSource(names=names, images=src.images[torch.tensor(keep, dtype=torch.bool)])
    return SplitSource(names=names, paths=[p for p, ok in zip(src.paths, keep) if ok])


def _group_kind(label: str, eval_label: str) -> str:
    return "alphabet" if "alphabet" in (label, eval_label) else "character"


def read_omniglot(root, label="character", eval_label="character") -> dict[str, SplitSource]:
    """Pool every set found; sorted split units, first half (rounded down) train, the rest test."""
    sets = _find_sets(root)
    pool = _concat(list(sets.values()))
    unit = _group_kind(label, eval_label)
    units = sorted(set(pool.names[unit]))
    train_units = set(units[: len(units) // 2])
    in_train = [u in train_units for u in pool.names[unit]]
    return {"train": _select(pool, in_train), "test": _select(pool, [not t for t in in_train])}


def read_omniglot_background(root, label="character", eval_label="character") -> dict[str, SplitSource]:
    """Official split: images_background trains, images_evaluation tests."""
    sets = _find_sets(root)
    missing = [s for s in SETS if s not in sets]
    if missing:
        raise DataError(f"omniglot_background needs both official sets; '{missing[0]}' (folder or zip) was not "
                        f"found in '{root}'. Expected layout: {LAYOUT}")
    return {"train": sets["images_background"], "test": sets["images_evaluation"]}


OMNIGLOT = register_dataset(
    DatasetSpec(
        name="omniglot",
        read=read_omniglot,
        label_kinds=("character", "alphabet"),
        image_mode="L",
        published={"train": (16220, 811), "test": (16240, 812)},
        layout=LAYOUT,
        group_kind=_group_kind,
    )
)

OMNIGLOT_BACKGROUND = register_dataset(
    DatasetSpec(
        name="omniglot_background",
        read=read_omniglot_background,
        label_kinds=("character", "alphabet"),
        image_mode="L",
        published={"train": (19280, 964), "test": (13180, 659)},
        layout=LAYOUT,
        group_kind=_group_kind,
    )
)
