"""``dmlkit embed RUN_DIR --out FILE``: write embeddings of a split with their labels and paths."""

from __future__ import annotations

import argparse
from pathlib import Path

FORMATS = ("npz", "npy", "parquet")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "examples:\n"
        "  dmlkit embed runs/ms --out test.parquet          # label, path, embedding per row\n"
        "  dmlkit embed runs/ms --out train.bin --format parquet --split train   # --format wins over the suffix\n"
        "  # read back: pyarrow.parquet.read_table('test.parquet') or pandas.read_parquet('test.parquet')"
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `dmlkit train`")
    p.add_argument("--out", required=True, help="FILE.npz (embeddings, labels, paths in one file), FILE.npy "
                   "(embeddings; labels in FILE.labels.npy and paths in FILE.paths.txt beside it) or "
                   "FILE.parquet (one row per image: label, path, embedding as a fixed-size list of float32; "
                   "needs pyarrow)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="file format (default: from the --out extension)")
    p.add_argument("--split", choices=["test", "val", "train", "query", "gallery"], default="test")
    p.add_argument("--checkpoint", choices=["best", "last"], default="best")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides",
                   help="override data fields, e.g. --set data.root=/data/SOP")


def output_format(out: str | Path, fmt: str | None = None) -> str:
    """``fmt``, else the format named by ``out``'s extension; a ConfigError when neither says."""
    from dmlkit.exceptions import ConfigError

    if fmt is not None:
        if fmt not in FORMATS:
            raise ConfigError(f"--format must be one of {', '.join(FORMATS)}. Got {fmt!r}.")
        return fmt
    suffix = Path(out).suffix.lstrip(".")
    if suffix not in FORMATS:
        raise ConfigError(f"--out must end in .npz or .npy or .parquet (or name the format with --format). Got {str(out)!r}.")
    if suffix == "parquet":
        require_pyarrow()
    return suffix


def require_pyarrow():
    """The ``pyarrow`` module (with ``pyarrow.parquet`` loaded), or a ConfigError naming the package to install."""
    from dmlkit._validation import require_module

    require_module("pyarrow.parquet", "pyarrow", "Parquet output", "parquet")
    return require_module("pyarrow", "pyarrow", "Parquet output", "parquet")


def parquet_bytes(embeddings, labels, paths) -> bytes:
    """A Parquet file with one row per sample: ``label`` (int64), ``path`` (string, null without
    files) and ``embedding`` (fixed-size list of float32)."""
    import numpy as np

    pa = require_pyarrow()
    emb = np.ascontiguousarray(embeddings, dtype=np.float32)
    n, dim = emb.shape
    table = pa.table({
        "label": pa.array(np.asarray(labels, dtype=np.int64)),
        "path": pa.array([str(p) for p in paths] if paths else [None] * n, type=pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), dim),
    })
    sink = pa.BufferOutputStream()
    pa.parquet.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def write_embeddings(out: Path, embeddings, labels, paths, fmt: str | None = None) -> list[Path]:
    """Write ``.npz``, ``.npy`` (+ sidecars) or ``.parquet`` atomically; returns the files written."""
    import io

    import numpy as np

    from dmlkit.engine.checkpoint_files import atomic_write_bytes, atomic_write_text

    fmt = output_format(out, fmt)
    emb = np.asarray(embeddings, dtype=np.float32)
    lab = np.asarray(labels, dtype=np.int64)
    if fmt == "parquet":
        atomic_write_bytes(out, parquet_bytes(emb, lab, paths))
        return [out]
    if fmt == "npz":
        buf = io.BytesIO()
        arrays = {"embeddings": emb, "labels": lab}
        if paths:
            arrays["paths"] = np.asarray([str(p) for p in paths])
        np.savez(buf, **arrays)
        atomic_write_bytes(out, buf.getvalue())
        return [out]
    if paths:
        broken = next((str(p) for p in paths if "\n" in str(p) or "\r" in str(p)), None)
        if broken is not None:  # one line per path: a line break would shift every later row
            from dmlkit.exceptions import DataError

            raise DataError(f"the file name {broken[:80]!r} holds a line break, so FILE.paths.txt (one path per "
                            "line) cannot list the paths row by row; write .npz or .parquet instead (they store "
                            "each path as one value). Nothing was written.")
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


def run(args: argparse.Namespace) -> int:
    from dmlkit.cli.common import require_split
    from dmlkit.engine.builders import build_splits
    from dmlkit.inference import RunEmbedder

    fmt = output_format(args.out, args.format)  # fail before the (slow) embedding pass
    embedder = RunEmbedder.from_run(args.run_dir, args.checkpoint, overrides=args.overrides)  # on a GPU if any
    cfg = embedder.cfg
    splits = build_splits(cfg, embedder.model)
    dataset = require_split(splits, args.split, cfg)
    emb, labels = embedder.embed_dataset(dataset)
    paths = getattr(dataset, "paths", None)
    for path in write_embeddings(Path(args.out), emb.numpy(), labels.numpy(), paths, fmt):
        print(path)
    print(f"{emb.shape[0]} embeddings of size {emb.shape[1]} ({args.split} split)")
    return 0
