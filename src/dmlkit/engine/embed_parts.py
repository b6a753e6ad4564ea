"""A split embedded by several processes (torchrun ranks): one Parquet part per rank and a manifest.

Rank ``r`` of ``W`` embeds the contiguous rows ``[r N / W, (r + 1) N / W)`` of the split (integer
division), so the parts read in order are the one-process embedding in its order. Each part is a
Parquet file ``part-RRRRR-of-WWWWW.parquet`` (columns ``row``, ``label``, ``path``, ``embedding``;
the job's description in its schema metadata), written to a temporary name and renamed: a part
that exists is complete. A rank whose part already exists for the same job (model fingerprint,
split, rows) skips it, so a job run again after an interruption embeds only the missing parts.
When every part is there, rank 0 writes ``_manifest.json`` (the job and each part's file and rows).
The folder reads as one table: ``pyarrow.parquet.read_table(folder)`` (files starting with ``_``
are not read as data).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dmlkit.exceptions import ConfigError, DataError

FORMAT = "dmlkit-embedding-parts-1"
MANIFEST = "_manifest.json"
METADATA_KEY = b"dmlkit"


def part_rows(n: int, rank: int, world_size: int) -> range:
    """The rows of an ``n``-row split that rank ``rank`` of ``world_size`` embeds (contiguous, in order)."""
    return range(rank * n // world_size, (rank + 1) * n // world_size)


def part_name(rank: int, world_size: int) -> str:
    return f"part-{rank:05d}-of-{world_size:05d}.parquet"


class RowsOf:
    """The rows ``rows`` of a split, read as the split reads them (``get_batch`` where it has one)."""

    def __init__(self, dataset, rows: range):
        self.dataset, self.rows = dataset, rows
        paths = getattr(dataset, "paths", None)
        self.paths = None if paths is None else [paths[i] for i in rows]
        if hasattr(dataset, "get_batch"):
            self.get_batch = lambda indices: dataset.get_batch([rows[i] for i in indices])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.dataset[self.rows[i]]


def job_description(*, fingerprint: dict, split: str, rows: int, world_size: int) -> dict[str, Any]:
    """What identifies an embedding job (the model, the split, its rows, the processes): a part written for
    another one is not reused."""
    return {"format": FORMAT, "fingerprint": dict(fingerprint), "split": split, "rows": int(rows),
            "world_size": int(world_size)}


def check_folder(out: Path, world_size: int) -> None:
    """``out`` may hold this job's parts: a folder (or nothing yet) with no parts of a job split otherwise."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; under torchrun --out names a folder that gets one Parquet part "
                          "per process and a manifest (e.g. embeddings.parquet/). Choose another --out.")
    if out.is_dir():
        other = sorted(p.name for p in out.glob("part-*-of-*.parquet") if not p.name.endswith(f"-of-{world_size:05d}.parquet"))
        if other:
            raise ConfigError(f"--out {str(out)!r} holds parts of a job split over another number of processes "
                              f"({other[0]}, ...); run it with that many processes or choose another --out.")


def existing_part(path: Path, job: dict[str, Any], rows: range) -> bool:
    """Whether ``path`` is this job's complete part for ``rows`` (a part of another job is a DataError)."""
    if not path.exists():
        return False
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
        found = json.loads(meta[METADATA_KEY])
    except Exception as exc:  # not Parquet, or no dmlkit description
        raise DataError(f"{str(path)!r} is not a part written by `dmlkit embed` ({type(exc).__name__}); move it away "
                        "or choose another --out.") from None
    if found.get("job") != job or found.get("rows") != [rows.start, rows.stop]:
        raise DataError(f"{str(path)!r} is a part of another embedding job (model, split or rows differ: "
                        f"{found.get('job')}); choose another --out, or remove the folder to embed again.")
    return True


def require_pyarrow():
    """The ``pyarrow`` module (with ``pyarrow.parquet`` loaded), or a ConfigError naming the package to install."""
    from dmlkit.core.validation import require_module

    require_module("pyarrow.parquet", "pyarrow", "Parquet output", "parquet")
    return require_module("pyarrow", "pyarrow", "Parquet output", "parquet")


def parquet_bytes(embeddings, labels, paths, *, rows: range | None = None, metadata: dict | None = None) -> bytes:
    """A Parquet file with one row per sample: ``row`` (with ``rows``: the split's row numbers), ``label`` (int64),
    ``path`` (string, null without files) and ``embedding`` (fixed-size list of float32); ``metadata`` (JSON) goes
    in the schema's metadata under ``dmlkit``."""
    import numpy as np

    pa = require_pyarrow()
    emb = np.ascontiguousarray(embeddings, dtype=np.float32)
    n, dim = emb.shape
    columns = {} if rows is None else {"row": pa.array(np.arange(rows.start, rows.stop, dtype=np.int64))}
    table = pa.table({
        **columns,
        "label": pa.array(np.asarray(labels, dtype=np.int64)),
        "path": pa.array([str(p) for p in paths] if paths else [None] * n, type=pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), dim),
    })
    if metadata is not None:
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata)})
    sink = pa.BufferOutputStream()
    pa.parquet.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def write_part(path: Path, job: dict[str, Any], rows: range, embeddings, labels, paths) -> None:
    """Write one rank's part atomically, the job and its rows in the schema's metadata."""
    from dmlkit.engine.checkpoint_files import atomic_write_bytes

    atomic_write_bytes(path, parquet_bytes(embeddings, labels, paths, rows=rows,
                                           metadata={"job": job, "rows": [rows.start, rows.stop]}))


def write_manifest(out: Path, job: dict[str, Any], run_dir: str) -> Path:
    """``out/_manifest.json``: the job, the run, each part's file and rows, and the embedding size; every part must
    be there."""
    import pyarrow.parquet as pq

    from dmlkit.engine.checkpoint_files import atomic_write_text

    parts, dim = [], None
    for rank in range(job["world_size"]):
        rows = part_rows(job["rows"], rank, job["world_size"])
        path = out / part_name(rank, job["world_size"])
        if not existing_part(path, job, rows):
            raise DataError(f"{str(path)!r} is missing: rank {rank} did not finish; run the same command again.")
        schema = pq.read_schema(path)
        dim = schema.field("embedding").type.list_size
        parts.append({"file": path.name, "rows": [rows.start, rows.stop]})
    manifest = {**job, "run_dir": str(run_dir), "dim": dim, "parts": parts}
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return out / MANIFEST
