"""``dmlkit embed RUN_DIR --out FILE``: write embeddings of a split with their labels and paths."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `dmlkit train`")
    p.add_argument("--out", required=True, help="FILE.npz (embeddings, labels, paths in one file) or FILE.npy "
                   "(embeddings; labels in FILE.labels.npy and paths in FILE.paths.txt beside it)")
    p.add_argument("--split", choices=["test", "val", "train", "query", "gallery"], default="test")
    p.add_argument("--checkpoint", choices=["best", "last"], default="best")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides",
                   help="override data fields, e.g. --set data.root=/data/SOP")


def write_embeddings(out: Path, embeddings, labels, paths) -> list[Path]:
    """Write ``.npz`` or ``.npy`` (+ sidecars) atomically; returns the files written."""
    import io

    import numpy as np

    from dmlkit.engine.checkpoint import atomic_write_bytes, atomic_write_text
    from dmlkit.exceptions import ConfigError

    emb = np.asarray(embeddings, dtype=np.float32)
    lab = np.asarray(labels, dtype=np.int64)
    if out.suffix == ".npz":
        buf = io.BytesIO()
        arrays = {"embeddings": emb, "labels": lab}
        if paths:
            arrays["paths"] = np.asarray([str(p) for p in paths])
        np.savez(buf, **arrays)
        atomic_write_bytes(out, buf.getvalue())
        return [out]
    if out.suffix == ".npy":
        written = []
        for target, array in ((out, emb), (out.with_suffix(".labels.npy"), lab)):
            buf = io.BytesIO()
            np.save(buf, array)
            atomic_write_bytes(target, buf.getvalue())
            written.append(target)
        if paths:
            target = out.with_suffix(".paths.txt")
            atomic_write_text(target, "".join(f"{p}\n" for p in paths))
            written.append(target)
        return written
    raise ConfigError(f"--out must end in .npz or .npy. Got {str(out)!r}.")


def run(args: argparse.Namespace) -> int:
    from dmlkit.engine.builders import build_splits, embed_dataset
    from dmlkit.engine.loading import load_run
    from dmlkit.exceptions import ConfigError

    if Path(args.out).suffix not in (".npz", ".npy"):  # fail before the (slow) embedding pass
        raise ConfigError(f"--out must end in .npz or .npy. Got {args.out!r}.")
    cfg, model = load_run(args.run_dir, args.checkpoint, args.overrides)
    splits = build_splits(cfg, model)
    dataset = getattr(splits, args.split, None)
    if dataset is None:
        raise ConfigError(f"split {args.split!r} does not exist for data set {cfg.data.name!r} with this protocol.")
    emb, labels = embed_dataset(model, dataset, cfg.eval.batch_size, cfg.data.num_workers)
    paths = getattr(dataset, "paths", None)
    for path in write_embeddings(Path(args.out), emb.numpy(), labels.numpy(), paths):
        print(path)
    print(f"{emb.shape[0]} embeddings of size {emb.shape[1]} ({args.split} split)")
    return 0
