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
        "  # read back: pyarrow.parquet.read_table('test.parquet') or pandas.read_parquet('test.parquet')\n"
        "  torchrun --standalone --nproc_per_node=2 -m dmlkit embed runs/ms --out test.parquet\n"
        "  # under torchrun --out is a folder: one Parquet part per process (its rows of the split) and\n"
        "  # _manifest.json; run again after an interruption, only the missing parts are embedded"
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
        from dmlkit.engine.embed_parts import require_pyarrow

        require_pyarrow()
    return suffix


def write_embeddings(out: Path, embeddings, labels, paths, fmt: str | None = None) -> list[Path]:
    """Write ``.npz``, ``.npy`` (+ sidecars) or ``.parquet`` atomically; returns the files written."""
    import io

    import numpy as np

    from dmlkit.engine.checkpoint_files import atomic_write_bytes, atomic_write_text
    from dmlkit.engine.embed_parts import parquet_bytes

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
    from dmlkit.engine.distributed import torchrun_local_rank
    from dmlkit.engine.splits import build_splits
    from dmlkit.inference import RunEmbedder

    if torchrun_local_rank() is not None:
        return _run_parts(args)
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


def _run_parts(args: argparse.Namespace) -> int:
    """Under torchrun: this rank's rows of the split as one Parquet part; rank 0 writes the manifest at the end."""
    import torch

    from dmlkit.cli.common import require_split
    from dmlkit.engine import distributed as ddp
    from dmlkit.engine import embed_parts as parts
    from dmlkit.engine.splits import build_splits
    from dmlkit.exceptions import ConfigError
    from dmlkit.inference import RunEmbedder

    if output_format(args.out, args.format) != "parquet":
        raise ConfigError("under torchrun, embed writes one Parquet part per process into a folder: give --out "
                          "FOLDER.parquet (or --format parquet).")
    out = Path(args.out)
    info = ddp.init_distributed()
    parts.check_folder(out, info.world_size)
    device = f"cuda:{info.local_rank}" if info.backend == "nccl" else "cpu"
    embedder = RunEmbedder.from_run(args.run_dir, args.checkpoint, overrides=args.overrides, device=device)
    dataset = require_split(build_splits(embedder.cfg, embedder.model), args.split, embedder.cfg)
    job = parts.job_description(fingerprint=embedder.fingerprint, split=args.split, rows=len(dataset),
                                world_size=info.world_size)
    rows = parts.part_rows(len(dataset), info.rank, info.world_size)
    path = out / parts.part_name(info.rank, info.world_size)
    if parts.existing_part(path, job, rows):
        print(f"rank {info.rank}: {path} (rows {rows.start}-{rows.stop - 1}) is already written; kept")
    else:
        subset = parts.RowsOf(dataset, rows)
        if len(rows):
            emb, labels = embedder.embed_dataset(subset)
        else:  # more processes than images
            emb, labels = torch.zeros(0, embedder.embedding_size), torch.zeros(0, dtype=torch.int64)
        parts.write_part(path, job, rows, emb.numpy(), labels.numpy(), subset.paths)
        print(f"rank {info.rank}: {path} ({len(rows)} embeddings, rows {rows.start}-{rows.stop - 1})")
    ddp.barrier()  # every part is written before the manifest lists them
    if info.is_main:
        manifest = parts.write_manifest(out, job, str(args.run_dir))
        print(manifest)
        print(f"{len(dataset)} embeddings of size {embedder.embedding_size} ({args.split} split) in "
              f"{info.world_size} parts")
    return 0
