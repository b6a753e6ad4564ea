"""``dmlkit report RUN_DIR``: (re)write the run's self-contained ``report.html``."""

from __future__ import annotations

import argparse

MAP_METHODS = ("pca", "tsne", "umap")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `dmlkit train`")
    p.add_argument("--map", choices=MAP_METHODS, default="pca",
                   help="how the embedding map reduces the test embeddings to 2-D (default: pca; "
                        "umap needs the umap-learn package)")
    p.add_argument("--no-proxies", action="store_true",
                   help="leave the training-class proxies out of the embedding map")


def run(args: argparse.Namespace) -> int:
    from dmlkit.report import write_report

    if args.map == "umap":
        import importlib.util

        from dmlkit.exceptions import ConfigError

        if importlib.util.find_spec("umap") is None:
            raise ConfigError("--map umap needs the umap-learn package, which is not installed "
                              "(pip install umap-learn); use --map pca or --map tsne.")
    print(write_report(args.run_dir, embedding_method=args.map, proxies=not args.no_proxies))
    return 0
