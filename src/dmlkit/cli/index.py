"""``dmlkit index build|add|query|classify|remove|export``: a saved faiss index over a gallery of image files,
and its export to a vector database."""

from __future__ import annotations

import argparse
import json
import os


def not_indexed(index, paths: list, labels: list | None) -> tuple[list, list | None, int]:
    """``paths`` (and their ``labels``) that ``index`` does not hold yet, compared as real paths, and how
    many it holds already: adding an image twice would give it two ids and count it twice in every query."""
    known = {os.path.realpath(p) for p in index.paths if p}
    keep = [os.path.realpath(p) not in known for p in paths]
    kept_labels = None if labels is None else [label for label, k in zip(labels, keep) if k]
    return [p for p, k in zip(paths, keep) if k], kept_labels, keep.count(False)


def print_neighbours(records: list[dict]) -> None:
    """Each query of :meth:`QueryResult.records` and its neighbours, one line each."""
    for record in records:
        print(record["query"])
        for n in record["neighbours"]:
            label = f" label={n['label']}" if n["label"] is not None else ""
            match = f" match={'yes' if n['match'] else 'no'}" if "match" in n else ""
            where = n["path"] if n["path"] is not None else f"#{n['id']}"
            print(f"  {n['rank']}. {where} id={n['id']}{label} score={n['score']:.4f} distance={n['distance']:.4f}{match}")


def labels_to_add(index, source, labels: list, label: str | None) -> tuple[list, str | None]:
    """The labels of images to add: each image's own (class folder or CSV column), else ``label``, else, for a
    folder holding images only whose name is a label of ``index``, that name; and a line saying which rule
    labelled them (None when every image had its own label or none got one)."""
    from pathlib import Path

    if None not in labels:
        return labels, None
    if label is not None:
        return ([label if v is None else v for v in labels],
                f"images without a label of their own are labelled {label!r} (--label)")
    name = Path(source).name
    if Path(source).is_dir() and all(v is None for v in labels) and name in set(index.labels):
        return [name] * len(labels), (f"labelled them {name!r}: the folder holds images only and its name is a "
                                      "label of the index (--label NAME gives another)")
    return labels, None


def add_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "A search index over a gallery embedded by a run: build it once, add images as they arrive, query\n"
        "new images. Images are embedded with the run's own evaluation preprocessing (size, crop, colour,\n"
        "normalisation, autocast). Scores are cosine similarities, distance = 1 - score; with\n"
        "--query-expansion, --database-augmentation or --k-reciprocal the results are ordered by the re-ranked\n"
        "distance, which is the one printed (the score stays the plain cosine similarity). The index file\n"
        "keeps each item's id, path and label and the run's model fingerprint; queries from another model\n"
        "are refused. Writes are atomic: an interrupted add leaves the previous index intact."
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = sub.add_parser("build", help="embed a gallery with a run and write a new index",
                           description="Embed a gallery with a run and write a new index.")
    build.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `dmlkit train`")
    build.add_argument("--images", required=True, metavar="DIR_OR_CSV",
                       help="a folder (<class>/<image>: the label is the sub-folder; images directly inside are "
                            "unlabelled) or a CSV file with columns path[,label]")
    build.add_argument("--out", required=True, metavar="INDEX",
                       help="index file to write (a new file, or an index to replace; never a folder or another file)")
    build.add_argument("--kind", choices=["flat", "ivf", "hnsw", "compressed"], default="flat",
                       help="flat: exact; ivf (about sqrt(N) lists, 32 probed) / hnsw (M=20, efConstruction=64, "
                            "efSearch=256): approximate; compressed: IVF lists of product-quantised codes (OPQ when "
                            "measured to help), the shortlist re-ranked exactly from float vectors kept on disk in "
                            "INDEX.vectors (memory grows with the codes, for millions of images). Approximate kinds "
                            "print their recall@10 against exact search (default: flat)")
    tuning = build.add_argument_group("approximate kinds (default: chosen from the gallery size, recorded in the index)")
    tuning.add_argument("--nlist", type=int, metavar="N", help="ivf, compressed: inverted lists (default about sqrt(N))")
    tuning.add_argument("--nprobe", type=int, metavar="N",
                        help="ivf, compressed: lists scanned per query (default 32; compressed: nlist/64 when more)")
    tuning.add_argument("--code-size", type=int, metavar="BYTES",
                        help="compressed: PQ sub-quantisers = bytes per vector at 8-bit codes, a divisor of the "
                             "embedding size (default: the largest divisor up to min(64, size/4))")
    tuning.add_argument("--pq-bits", type=int, metavar="BITS", help="compressed: bits per PQ code, 4-8 (default 8)")
    tuning.add_argument("--opq", choices=["auto", "on", "off"], default="auto",
                        help="compressed: an OPQ rotation before quantising (auto: kept when it lowers the "
                             "quantisation error of the gallery by 5%%)")
    tuning.add_argument("--shortlist", type=int, metavar="N",
                        help="compressed: candidates re-ranked exactly per query (default one per 10,000 vectors, 100 to 2,000)")
    build.add_argument("--threshold-fmr", type=float, metavar="FMR",
                       help="store the cosine threshold at this false match rate on the labelled gallery's pairs "
                            "(e.g. 1e-3); queries then print match=yes/no")
    build.add_argument("--checkpoint", choices=["best", "last"], default="best")
    add = sub.add_parser("add", help="embed more images and add them to an index (new ids)",
                         description="Embed more images with the index's run and add them (new ids, never reused).")
    add.add_argument("index", metavar="INDEX", help="index file written by `dmlkit index build`")
    add.add_argument("--images", required=True, metavar="DIR_OR_CSV",
                     help="as for build: the label is the class sub-folder (or the CSV's label column); a folder "
                          "holding images only, named after a label of the index, gives them that label")
    add.add_argument("--label", metavar="NAME",
                     help="label of the images that get none from a class folder or a label column (e.g. a flat "
                          "folder of one class)")
    add.add_argument("--run", metavar="RUN_DIR", help="the run that built the index (default: the one it records)")
    query = sub.add_parser("query", help="nearest gallery items of query images",
                           description="Nearest gallery items of query images, best first.")
    query.add_argument("index", metavar="INDEX", help="index file written by `dmlkit index build`")
    query.add_argument("images", nargs="+", metavar="IMAGE", help="query image files")
    query.add_argument("-k", type=int, default=10, help="neighbours per query (default: 10)")
    query.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    query.add_argument("--run", metavar="RUN_DIR", help="the run that built the index (default: the one it records)")
    query.add_argument("--query-expansion", type=int, default=0, metavar="N",
                       help="alpha-query expansion with the N nearest gallery items (default: off)")
    query.add_argument("--database-augmentation", type=int, default=0, metavar="N",
                       help="database-side augmentation with each item's N nearest (default: off)")
    query.add_argument("--alpha", type=float, default=3.0, help="weight exponent of QE / DBA (default: 3)")
    query.add_argument("--k-reciprocal", action="store_true",
                       help="k-reciprocal re-ranking (Zhong et al. 2017; k1=20, k2=6, lambda=0.3)")
    classify = sub.add_parser(
        "classify", help="label query images by a vote of their nearest gallery items",
        description="Label query images by a distance-weighted vote of their k nearest labelled gallery items\n"
                    "(weight 1 / (cosine distance + 1e-6)); confidence is the winner's share of the vote. Items\n"
                    "below the threshold do not vote; a query with none above it is 'unknown'.")
    classify.add_argument("index", metavar="INDEX", help="index file written by `dmlkit index build` (labelled gallery)")
    classify.add_argument("images", nargs="+", metavar="IMAGE", help="query image files")
    classify.add_argument("-k", type=int, default=5, help="neighbours that vote (default: 5)")
    rejection = classify.add_mutually_exclusive_group()
    rejection.add_argument("--fmr", type=float, metavar="FMR",
                           help="reject below the cosine threshold at this false match rate on the gallery's pairs "
                                "(default: the index's --threshold-fmr threshold, else no rejection)")
    rejection.add_argument("--threshold", type=float, metavar="SCORE", help="reject below this cosine score")
    classify.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    classify.add_argument("--run", metavar="RUN_DIR", help="the run that built the index (default: the one it records)")
    export = sub.add_parser(
        "export", help="write an index (or a run's embedded gallery) into a vector database (Qdrant)",
        description="Write an index's items (vectors, ids, paths, labels, the model's fingerprint and threshold) into\n"
                    "a Qdrant collection, in batches, each request retried; an interrupted export run again\n"
                    "continues where it stopped (point id = item id: nothing is duplicated). A collection written\n"
                    "by another model or of another vector size is refused. Query it with\n"
                    "`dmlkit search --index URI`.")
    export.add_argument("source", metavar="RUN_OR_INDEX",
                        help="an index file written by `dmlkit index build`, or a run directory (with --images)")
    export.add_argument("--to", required=True, metavar="URI",
                        help="qdrant:PATH (Qdrant's local mode: a folder, no server) or http(s)://HOST:PORT (a Qdrant "
                             "server or cluster), each optionally with ?collection=NAME (default: dmlkit)")
    export.add_argument("--images", metavar="DIR_OR_CSV",
                        help="with a run directory: the gallery to embed and write, as for build (ids: positions in "
                             "the sorted listing; only images not yet written are embedded)")
    export.add_argument("--label", metavar="NAME", help="with --images: label of the images without one")
    export.add_argument("--batch-size", type=int, default=512, metavar="N", help="items per request (default: 512)")
    export.add_argument("--retries", type=int, default=3, metavar="N",
                        help="tries per request before giving up, waiting 1 s, 2 s, ... between them (default: 3)")
    export.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="time limit of each request to a server (default: 10)")
    export.add_argument("--checkpoint", choices=["best", "last"], default="best")
    remove = sub.add_parser("remove", help="remove items by id", description="Remove items from an index by id.")
    remove.add_argument("index", metavar="INDEX", help="index file written by `dmlkit index build`")
    remove.add_argument("ids", nargs="+", type=int, metavar="ID", help="ids to remove (as printed by query)")


def _embedder(index, run_dir: str | None):
    from dmlkit.exceptions import ConfigError
    from dmlkit.inference import RunEmbedder

    run_dir = run_dir or index.run_dir
    if run_dir is None:
        raise ConfigError("the index records no run directory; pass --run RUN_DIR (the run that built it).")
    embedder = RunEmbedder.from_run(run_dir)
    index.check_model(embedder)
    return embedder


def _is_index_file(path) -> bool:
    from dmlkit.exceptions import DataError
    from dmlkit.index.gallery import Index

    try:
        Index.load(path)
    except DataError:
        return False
    return True


def _kind_options(args: argparse.Namespace) -> dict:
    """The build's index parameters given on the command line; one given for a kind that has no use
    for it is refused rather than ignored."""
    from dmlkit.exceptions import InvalidParameterError

    given = {"nlist": args.nlist, "nprobe": args.nprobe, "code_size": args.code_size, "pq_bits": args.pq_bits,
             "opq": {"auto": None, "on": True, "off": False}[args.opq], "shortlist": args.shortlist}
    given = {key: value for key, value in given.items() if value is not None}
    takes = {"flat": (), "hnsw": (), "ivf": ("nlist", "nprobe"), "compressed": tuple(given)}[args.kind]
    unused = [f"--{key.replace('_', '-')}" for key in given if key not in takes]
    if unused:
        raise InvalidParameterError(f"{', '.join(unused)}: not used by --kind {args.kind} (--nlist and --nprobe are "
                                    "for ivf and compressed, --code-size, --pq-bits, --opq and --shortlist for compressed).")
    return given


def run(args: argparse.Namespace) -> int:
    from dmlkit.index.gallery import Index, gallery_images
    from dmlkit.inference import RunEmbedder

    if args.action == "build":
        from dmlkit.cli.common import check_output_file

        check_output_file(args.out, "--out", replaceable=_is_index_file, what="a dmlkit index file")
        paths, labels = gallery_images(args.images)
        embedder = RunEmbedder.from_run(args.run_dir, args.checkpoint, progress=True)
        index = Index.build(embedder, paths, labels=labels, kind=args.kind, **_kind_options(args))
        print(f"indexed {len(index)} images ({index.kind}, embeddings of size {index.dim})")
        if index.build_recall_at_10 is not None:
            print(f"recall@10 against exact search: {index.build_recall_at_10:.4f}")
        if args.threshold_fmr is not None:
            threshold = index.set_threshold_at_fmr(args.threshold_fmr)
            print(f"threshold at FMR {args.threshold_fmr:g}: cosine score >= {threshold:.6f} is a match")
        print(f"written: {index.save(args.out)}")
        return 0
    if args.action == "export":
        return _export(args)
    index = Index.load(args.index)
    if args.action == "add":
        paths, labels = gallery_images(args.images)
        labels, labelled = labels_to_add(index, args.images, labels, args.label)
        paths, labels, already = not_indexed(index, paths, labels)
        note = f"; {already} images already in the index were skipped" if already else ""
        if not paths:
            print(f"nothing added: all {already} images are already in the index; it holds {len(index)}")
            return 0
        ids = index.add(_embedder(index, args.run), paths, labels=labels)
        index.save(args.index)
        print(f"added {len(ids)} images (ids {ids[0]}-{ids[-1]}){note}; the index holds {len(index)}")
        unlabelled = labels.count(None)
        if labelled:
            print(labelled)
        if unlabelled:
            print(f"{unlabelled} of them have no label (images directly in the folder, or CSV rows without one): "
                  "they come back in queries but do not vote in classify; --label NAME labels them")
        return 0
    if args.action == "remove":
        removed = index.remove(args.ids)
        index.save(args.index)
        print(f"removed {removed} items; the index holds {len(index)}")
        return 0
    if args.action == "classify":
        return _classify(index, args)
    result = index.query(_embedder(index, args.run), list(args.images), args.k,
                         query_expansion=args.query_expansion, database_augmentation=args.database_augmentation,
                         alpha=args.alpha, k_reciprocal=args.k_reciprocal)
    records = result.records(args.images)
    if args.json:
        print(json.dumps({"index": str(args.index), "threshold": index.threshold, "queries": records}, indent=2))
        return 0
    print_neighbours(records)
    return 0


def _classify(index, args: argparse.Namespace) -> int:
    result = index.classify(_embedder(index, args.run), list(args.images), args.k, fmr=args.fmr,
                            threshold=args.threshold)
    records = result.records(args.images)
    if args.json:
        print(json.dumps({"index": str(args.index), "threshold": result.threshold, "queries": records}, indent=2))
        return 0
    for r in records:
        nearest = f"nearest score {r['nearest_score']:.4f}"
        if r["nearest_unlabelled"]:
            nearest = f"nearest item is unlabelled, score {r['nearest_score']:.4f}"
        if r["label"] is not None:
            print(f"{r['query']}: {r['label']} confidence={r['confidence']:.3f} ({nearest})")
        elif r["nearest_unlabelled"]:
            print(f"{r['query']}: no label: {nearest}, and no labelled item among the {args.k} nearest voted")
        else:
            print(f"{r['query']}: unknown ({nearest})")
    if result.threshold is not None:
        print(f"threshold: cosine score >= {result.threshold:.6f}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dmlkit.exceptions import ConfigError
    from dmlkit.index.database import QdrantCollection, parse_uri
    from dmlkit.index.gallery import Index, gallery_images

    parse_uri(args.to)  # a wrong URI fails before anything is read or embedded
    source = Path(args.source)
    if source.is_dir() and args.images is None:
        raise ConfigError(f"{args.source!r} is a run directory: give --images DIR_OR_CSV, the gallery to embed and "
                          "export (or export an index file written by `dmlkit index build`).")
    if not source.is_dir() and args.images is not None:
        raise ConfigError("--images goes with a run directory; an index file already holds its items.")
    with QdrantCollection(args.to, timeout=args.timeout, retries=args.retries) as collection:
        if source.is_dir():
            from dmlkit.inference import RunEmbedder

            paths, labels = gallery_images(args.images)
            if args.label is not None:
                labels = [args.label if v is None else v for v in labels]
            embedder = RunEmbedder.from_run(source, args.checkpoint, progress=True)
            summary = collection.export_images(embedder, paths, labels, batch_size=args.batch_size, progress=True)
        else:
            summary = collection.export_index(Index.load(source), batch_size=args.batch_size, progress=True)
        where = collection.describe()
    already = f"; {summary.already} were already there" if summary.already else ""
    print(f"exported {summary.written} items to {where}{already}; it holds {summary.total}")
    return 0
