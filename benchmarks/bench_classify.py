"""Index.classify on Pets: accuracy on known breeds and rejection of breeds the gallery lacks, per false match rate.

Run:  .venv/bin/python benchmarks/bench_classify.py RUN_DIR [--images ../shared/data/pets/images] [--k 5]

``RUN_DIR`` is a run trained on the image folder with the default class-disjoint split (e.g.
``dmlkit train --set data.name=folder --set data.root=../shared/data/pets/images --set train.max_steps=1``:
the pretrained photo backbone, one step). Its *test* breeds (the second half of the sorted breed names,
never trained on) are the known classes: the gallery holds the first half of each breed's sorted
photos, the queries are the other half. The *training* breeds are the unknown classes: every photo
of them is a query whose right answer is "unknown". For each rejection rule the table prints the
share of known queries labelled correctly (a rejected known query counts as wrong), the share of
known queries accepted, the accuracy among those accepted, and the share of unknown queries rejected.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np


def breeds(root: Path) -> dict[str, list[str]]:
    """Sorted photo paths of every breed folder under ``root``."""
    from dmlkit.data.folder import IMAGE_EXTENSIONS

    out = {}
    for breed in sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")):
        files = sorted(f for f in os.listdir(root / breed) if f.lower().endswith(IMAGE_EXTENSIONS))
        out[breed] = [str(root / breed / f) for f in files]
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--images", default=str(Path(__file__).resolve().parents[2] / "shared/data/pets/images"))
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args(argv)

    from dmlkit.index import Index
    from dmlkit.inference import RunEmbedder

    photos = breeds(Path(args.images))
    names = sorted(photos)
    known, unknown = names[len(names) // 2:], names[: len(names) // 2]  # folder's half split: test = second half
    gallery, gallery_labels, queries, query_labels = [], [], [], []
    for breed in known:
        half = len(photos[breed]) // 2
        gallery += photos[breed][:half]
        gallery_labels += [breed] * half
        queries += photos[breed][half:]
        query_labels += [breed] * (len(photos[breed]) - half)
    strangers = [p for breed in unknown for p in photos[breed]]

    embedder = RunEmbedder.from_run(args.run_dir)
    index = Index.from_embeddings(embedder.embed(gallery), labels=gallery_labels, paths=gallery)
    known_x, strangers_x = embedder.embed(queries), embedder.embed(strangers)
    truth = np.array(query_labels, dtype=object)
    print(f"run {args.run_dir}: gallery {len(gallery)} photos of {len(known)} breeds, {len(queries)} known "
          f"queries, {len(strangers)} unknown queries of {len(unknown)} breeds, k={args.k}")
    print("| rejection | threshold | accuracy (known) | accepted (known) | accuracy of accepted | unknown rejected |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for fmr in (None, 1e-1, 1e-2, 1e-3):  # 95 gallery photos give 4,275 impostor pairs: 1e-4 is not measurable
        options = {"threshold": None} if fmr is None else {"fmr": fmr}
        k_result = index.classify_embeddings(known_x, args.k, **options)
        u_result = index.classify_embeddings(strangers_x, args.k, **options)
        labels = np.array(k_result.labels, dtype=object)
        accepted = ~k_result.unknown
        right = labels == truth
        accuracy_accepted = right[accepted].mean() if accepted.any() else float("nan")
        rule = "none" if fmr is None else f"FMR {fmr:g}"
        threshold = "-" if k_result.threshold is None else f"{k_result.threshold:.4f}"
        print(f"| {rule} | {threshold} | {right.mean():.4f} | {accepted.mean():.4f} | {accuracy_accepted:.4f} "
              f"| {u_result.unknown.mean():.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
