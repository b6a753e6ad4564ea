"""``dmlkit search``: nearest neighbours of query images (or stored embeddings) in an embedded gallery."""

from __future__ import annotations

import argparse


def add_parser(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--gallery", help="gallery .npz written by `dmlkit embed` (embeddings, labels, paths)")
    where.add_argument("--index", metavar="URI",
                       help="a vector database written by `dmlkit index export`: qdrant:PATH or http(s)://HOST:PORT, "
                            "optionally with ?collection=NAME")
    p.add_argument("--run", metavar="RUN_DIR", help="run whose model embeds the query images (with --index: "
                   "default the run the database records; another model is refused)")
    p.add_argument("--query-embeddings", help="query .npz instead of images")
    p.add_argument("images", nargs="*", help="query image files (need --run)")
    p.add_argument("-k", type=int, default=5, help="neighbours per query (default: 5)")
    p.add_argument("--backend", choices=["torch", "faiss"], default="torch", help="with --gallery (default: torch)")
    p.add_argument("--exact", action="store_true",
                   help="with --index on a server: exact search instead of its HNSW index (local mode is always exact)")
    p.add_argument("--json", action="store_true", help="with --index: print one JSON document instead of text")


def _load_npz(path: str) -> dict:
    """A gallery/query ``.npz``: ``embeddings [N, D]`` (floats), and when present ``labels [N]`` (integers) and
    ``paths [N]``; a DataError names the file and what does not fit."""
    import numpy as np

    from dmlkit.data._files import read_npz
    from dmlkit.exceptions import DataError

    data = read_npz(path, "gallery/query file")
    where = f"{path!r}"
    if "embeddings" not in data:
        raise DataError(f"{where} has no 'embeddings' array (write it with `dmlkit embed --out FILE.npz`).")
    emb = data["embeddings"]
    if emb.ndim != 2 or emb.dtype.kind not in "fiu" or emb.shape[0] == 0:
        raise DataError(f"{where}: 'embeddings' must be a non-empty [N, D] array of numbers. "
                        f"Got shape {emb.shape}, dtype {emb.dtype}.")
    if not np.isfinite(emb).all():
        raise DataError(f"{where}: 'embeddings' contains NaN or infinite values.")
    for key in ("labels", "paths"):
        if key in data and (data[key].ndim != 1 or len(data[key]) != emb.shape[0]):
            raise DataError(f"{where}: 'embeddings' has {emb.shape[0]} rows but '{key}' has shape {data[key].shape}; "
                            "they must describe the same items.")
    if "labels" in data and data["labels"].dtype.kind not in "iu":
        raise DataError(f"{where}: 'labels' must hold integer class ids. Got dtype {data['labels'].dtype}.")
    return data


def embed_images(run_dir: str, image_paths: list[str], progress: bool = False):
    """Embed image files with a run's model and its evaluation preprocessing (:class:`RunEmbedder`)."""
    from dmlkit.inference import RunEmbedder

    return RunEmbedder.from_run(run_dir, progress=progress).embed(image_paths)


def run(args: argparse.Namespace) -> int:
    import torch

    from dmlkit.evaluation import knn
    from dmlkit.exceptions import ConfigError

    if args.index is not None:
        return _search_database(args)
    gallery = _load_npz(args.gallery)
    if args.query_embeddings:
        query = torch.from_numpy(_load_npz(args.query_embeddings)["embeddings"]).float()
        names = [f"query[{i}]" for i in range(len(query))]
    elif args.images:
        if not args.run:
            raise ConfigError("query images need --run RUN_DIR (the model that embedded the gallery).")
        query = embed_images(args.run, args.images)
        names = list(args.images)
    else:
        raise ConfigError("give query image files (with --run) or --query-embeddings FILE.npz.")
    ref = torch.from_numpy(gallery["embeddings"]).float()
    if query.shape[1] != ref.shape[1]:
        raise ConfigError(f"query embeddings have size {query.shape[1]} but the gallery has {ref.shape[1]}.")
    k = min(args.k, len(ref))
    scores, idx = knn(query, ref, k, backend=args.backend)
    labels = gallery.get("labels")
    paths = gallery.get("paths")
    for qi, name in enumerate(names):
        print(name)
        for rank, (j, s) in enumerate(zip(idx[qi].tolist(), scores[qi].tolist()), start=1):
            where = str(paths[j]) if paths is not None else f"#{j}"
            lab = f" label={int(labels[j])}" if labels is not None else ""
            print(f"  {rank}. {where}{lab} distance={s:.4f}")
    return 0


def _search_database(args: argparse.Namespace) -> int:
    """``--index URI``: the nearest items of the queries in a vector database written by `dmlkit index export`."""
    import json

    import torch

    from dmlkit.exceptions import ConfigError
    from dmlkit.index.database import QdrantCollection

    with QdrantCollection(args.index) as collection:
        if args.query_embeddings:
            queries = torch.from_numpy(_load_npz(args.query_embeddings)["embeddings"]).float()
            names = [f"query[{i}]" for i in range(len(queries))]
            result = collection.query_embeddings(queries, args.k, exact=args.exact)
        elif args.images:
            from dmlkit.inference import RunEmbedder

            run_dir = args.run or collection.require_header().get("run_dir")
            if run_dir is None:
                raise ConfigError(f"{collection.describe()} records no run directory; pass --run RUN_DIR (the run "
                                  "that wrote it).")
            embedder = RunEmbedder.from_run(run_dir)
            names = list(args.images)
            result = collection.query(embedder, names, args.k, exact=args.exact)
        else:
            raise ConfigError("give query image files or --query-embeddings FILE.npz.")
    records = result.records(names)
    if args.json:
        print(json.dumps({"index": args.index, "queries": records}, indent=2))
        return 0
    from dmlkit.cli.index import print_neighbours

    print_neighbours(records)
    return 0
