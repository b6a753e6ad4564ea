"""Omniglot (Lake et al. 2015), ``omniglot-py`` layout; labels at character or alphabet level.

``omniglot``: background and evaluation sets pooled, classes sorted by name, first half train,
second half test (the split unit is the alphabet when either label is ``alphabet``, so test
alphabets are unseen; EPS Sec. 5 trains on alphabets and evaluates on characters).
``omniglot_background``: the official background (30 alphabets) / evaluation (20) split.
"""

from __future__ import annotations

import os
from pathlib import Path

from dmlkit.data._files import find_root
from dmlkit.data.registry import DatasetSpec, SplitSource, register_dataset
from dmlkit.exceptions import DataError

LAYOUT = "<root>/omniglot-py/images_background/<alphabet>/<character>/*.png and <root>/omniglot-py/images_evaluation/..."
SETS = ("images_background", "images_evaluation")


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


def _find_sets(root) -> dict[str, SplitSource]:
    base = find_root(root, "images_background", ("omniglot-py",))
    missing = [s for s in SETS if not (base / s).is_dir()]
    if missing:
        raise DataError(
            f"omniglot: expected folder '{Path(root) / 'omniglot-py' / missing[0]}' was not found. Expected layout: {LAYOUT}"
        )
    sets = {s: _scan_set(base, s) for s in SETS}
    for s, src in sets.items():
        if len(src) == 0:
            raise DataError(f"omniglot: '{base / s}' holds no <alphabet>/<character>/*.png images. Expected layout: {LAYOUT}")
    return sets


def _concat(a: SplitSource, b: SplitSource) -> SplitSource:
    return SplitSource(names={k: a.names[k] + b.names[k] for k in a.names}, paths=a.paths + b.paths)


def _select(src: SplitSource, keep: list[bool]) -> SplitSource:
    return SplitSource(
        names={k: [v for v, ok in zip(vals, keep) if ok] for k, vals in src.names.items()},
        paths=[p for p, ok in zip(src.paths, keep) if ok],
    )


def _group_kind(label: str, eval_label: str) -> str:
    return "alphabet" if "alphabet" in (label, eval_label) else "character"


def read_omniglot(root, label="character", eval_label="character") -> dict[str, SplitSource]:
    """Pool both sets; sorted split units, first half (rounded down) train, the rest test."""
    sets = _find_sets(root)
    pool = _concat(sets["images_background"], sets["images_evaluation"])
    unit = _group_kind(label, eval_label)
    units = sorted(set(pool.names[unit]))
    train_units = set(units[: len(units) // 2])
    in_train = [u in train_units for u in pool.names[unit]]
    return {"train": _select(pool, in_train), "test": _select(pool, [not t for t in in_train])}


def read_omniglot_background(root, label="character", eval_label="character") -> dict[str, SplitSource]:
    """Official split: images_background trains, images_evaluation tests."""
    sets = _find_sets(root)
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
