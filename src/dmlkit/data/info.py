"""``dmlkit datasets info``: image and class counts per split, checked against the published ones; root checks."""

from __future__ import annotations

import os
from typing import Any

from dmlkit.data.registry import get_dataset_spec, list_datasets
from dmlkit.exceptions import DataError, InvalidParameterError

HINTS = {
    "cub200": "CUB-200 (2010) has 6,033 images; CUB-200-2011 has 11,788.",
    "cars196": "Cars196 has 16,185 images in cars_annos.mat (both official halves).",
    "sop": "SOP has 120,053 images in Ebay_train.txt + Ebay_test.txt.",
    "inshop": "In-Shop's list_eval_partition.txt lists 52,712 images.",
    "omniglot": "Omniglot has 32,460 images of 1,623 characters (both sets).",
}


def root_problems(name: str, root: str | os.PathLike | None, label: str = "class") -> list[str]:
    """Why data set ``name`` cannot be read from ``root`` (empty when it can): no root, a missing path, a bad layout.

    Reads the annotation files or the folder listing, not the images.
    """
    spec = get_dataset_spec(name)
    if spec.in_memory:
        return []
    if root is None:
        return [f"data.root is not set: data set {name!r} is read from disk. Expected layout: {spec.layout}"]
    if not os.path.exists(root):
        return [f"data.root {str(root)!r} does not exist (data set {name!r}). Expected layout: {spec.layout}"]
    try:
        label = spec.resolve_label(label, "label")
        spec(root=str(root), label=label, eval_label=label)
    except (DataError, InvalidParameterError) as err:
        return [f"data.root {str(root)!r}: {err}"]
    return []


def dataset_info(name: str, root: str | os.PathLike | None = None, *, check_files: bool = True,
                 published: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """Counts per split of data set ``name`` at ``root`` and whether they match the published ones.

    Returns ``{"dataset", "root", "splits": {split: {"images", "classes"}}, "matches_published",
    "problems": [...]}``. ``matches_published`` is None for data sets without published counts
    (folder, csv). Missing annotation files and missing image files are reported in
    ``problems`` rather than raised, so a half-extracted archive is diagnosed in one call.
    ``published`` (``{split: (images, classes)}``) replaces the registered counts to check against.
    """
    spec = get_dataset_spec(name)
    published_counts = spec.published if published is None else published
    result: dict[str, Any] = {
        "dataset": name,
        "root": None if root is None else str(root),
        "splits": {},
        "matches_published": None if not published_counts else False,
        "problems": [],
    }
    if root is None and not spec.in_memory:
        result["problems"].append(f"{name} is read from disk; pass --root DIR. Expected layout: {spec.layout}")
        return result
    label = spec.label_kinds[0]
    try:
        sources = spec(root=None if root is None else str(root), label=label, eval_label=label)
    except DataError as err:
        result["problems"].append(str(err))
        return result
    problems = result["problems"]
    for split, source in sources.items():
        images, classes = len(source), len(set(source.names[label]))
        result["splits"][split] = {"images": images, "classes": classes}
        expected = published_counts.get(split)
        if expected is not None and (images, classes) != expected:
            problems.append(
                f"{split} has {images:,} images of {classes:,} classes but the published split has "
                f"{expected[0]:,} images of {expected[1]:,} classes."
            )
        if check_files and source.paths is not None:
            missing = [p for p in source.paths if not os.path.isfile(p)]
            if missing:
                problems.append(
                    f"{len(missing):,} of {len(source.paths):,} image files listed for {split} are missing "
                    f"(first: '{missing[0]}'); is the archive fully extracted?"
                )
    if published_counts:
        count_ok = all(
            (result["splits"].get(k, {}).get("images"), result["splits"].get(k, {}).get("classes")) == v
            for k, v in published_counts.items()
        )
        result["matches_published"] = count_ok
        if not count_ok and name in HINTS:
            problems.append(HINTS[name])
    return result


def datasets_table() -> list[dict[str, Any]]:
    """One row per registered data set: name, label kinds, evaluation mode, published counts, layout."""
    rows = []
    for name in list_datasets():
        spec = get_dataset_spec(name)
        rows.append(
            {
                "dataset": name,
                "labels": list(spec.label_kinds),
                "eval_mode": spec.eval_mode,
                "published": {k: {"images": v[0], "classes": v[1]} for k, v in spec.published.items()},
                "layout": spec.layout,
            }
        )
    return rows
