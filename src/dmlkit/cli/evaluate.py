"""``dmlkit evaluate RUN_DIR``: re-evaluate a run's selected checkpoint, optionally on other data."""

from __future__ import annotations

import argparse
import json

from dmlkit.cli.common import new_output_file, require_split


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `dmlkit train`")
    p.add_argument("--split", choices=["test", "val", "train"], default="test", help="which split to evaluate (default: test)")
    p.add_argument("--checkpoint", choices=["best", "last"], default="best", help="which weights (default: best)")
    p.add_argument(
        "--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides",
        help="override data fields, e.g. --set data.root=/data/CUB_200_2011 --set protocol.fold=1",
    )
    p.add_argument("--backend", choices=["torch", "faiss"], help="nearest-neighbour backend")
    p.add_argument("--over-cluster", type=int, metavar="K", dest="over_cluster",
                   help="also report NMI+ (k-means with K times the class count; EPS uses 30); "
                        "default: the run's eval.over_cluster")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dmlkit.engine.checkpoint_files import atomic_write_json
    from dmlkit.engine.run_layout import EVALUATIONS_DIR
    from dmlkit.engine.splits import build_splits
    from dmlkit.engine.trainer import _floats, format_metrics_table, own_rows, per_category_metrics
    from dmlkit.evaluation import evaluate
    from dmlkit.evaluation.metrics import TABLE_KEYS
    from dmlkit.exceptions import ConfigError
    from dmlkit.inference import RunEmbedder
    from dmlkit.models.embedder import shift_radius

    bad = [o for o in args.overrides if not o.split("=", 1)[0].startswith(("data.", "protocol.", "eval."))]
    if bad:
        raise ConfigError(f"evaluate only overrides data.*, protocol.* and eval.* fields. Got {', '.join(bad)}.")
    embedder = RunEmbedder.from_run(args.run_dir, args.checkpoint, overrides=args.overrides)  # on a GPU if any
    cfg = embedder.cfg
    splits = build_splits(cfg, embedder.model)
    backend = args.backend or cfg.eval.backend
    ks = tuple(cfg.eval.ks)
    embed = embedder.embed_dataset  # under the run's training autocast, as the run embedded its own splits

    over_cluster = cfg.eval.over_cluster if args.over_cluster is None else args.over_cluster
    if cfg.eval.clustering and over_cluster < 1:
        raise ConfigError(f"--over-cluster must be an int >= 1. Got {over_cluster}.")
    gallery = gallery_labels = own = None
    if args.split == "test" and splits.eval_mode == "query_gallery":
        emb, labels = embed(splits.query)
        gallery, gallery_labels = embed(splits.gallery)
        own = own_rows(splits)  # a query's own image is not in its gallery (CSV rows both query and gallery)
    else:
        if args.split == "val" and cfg.protocol.member_folds and (cfg.model.ensemble or 1) > 1:
            raise ConfigError(
                "this run's ensemble members each held out their own fold of the training classes "
                "(protocol.member_folds): all members but one trained on every validation class, so no split is held "
                "out from the whole ensemble. Its validation (each member on its own fold) is in the run's log.jsonl; "
                "use --split test or --split train."
            )
        with shift_radius(embedder.model, cfg.eval.val_shift_average if args.split == "val" else None):
            emb, labels = embed(require_split(splits, args.split, cfg))  # the validation's shifts, as the run's own
    # the run's own scoring (Trainer.score): clustering over queries and gallery together when eval.clustering
    groups = ("retrieval", "verification", "clustering") if cfg.eval.clustering else ("retrieval", "verification")
    metrics = evaluate(emb, labels, reference=gallery, reference_labels=gallery_labels, own_reference=own,
                       metrics=groups, ks=ks, backend=backend, over_cluster=over_cluster, ami=True, seed=cfg.seed)
    metrics = _floats(metrics)
    print(format_metrics_table(metrics, [k for k in TABLE_KEYS if k in metrics]))
    out = new_output_file(Path(args.run_dir) / EVALUATIONS_DIR, args.split, ".json")
    record = {"split": args.split, "checkpoint": args.checkpoint, "overrides": args.overrides, **metrics}
    if args.split == "test" and splits.categories is not None:  # a CSV 'category' column, as the run scored it
        reference = None if gallery is None else (gallery, gallery_labels)
        record["per_category"] = per_category_metrics(emb, labels, splits.categories, reference, own, ks, backend)
    # data.skip_bad_images: files left out when decoding into memory, and files found unreadable while reading per item
    skipped = sorted({str(p) for p in splits.info.get("skipped_images", [])} | set(splits.skipped_per_item()))
    if skipped:
        record["skipped_images"] = {"count": len(skipped), "paths": skipped}
        print(f"skipped {len(skipped)} unreadable image(s); listed in the evaluation file")
    atomic_write_json(out, record)
    print(f"written: {out}")
    print(json.dumps({k: metrics[k] for k in TABLE_KEYS if k in metrics}))
    return 0
