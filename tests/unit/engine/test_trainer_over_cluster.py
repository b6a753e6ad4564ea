"""NMI+ (EPS Tables 2-3: k-means with 30x the class count) is reachable from a run's config and `dmlkit evaluate`."""

from __future__ import annotations

import argparse

import torch

from dmlkit.cli import evaluate as evaluate_cli
from dmlkit.config import load_config
from dmlkit.evaluation import clustering_metrics
from dmlkit.recipe import Trainer


def test_the_trainer_scores_nmi_plus_with_eval_over_cluster(tmp_path):
    trainer = Trainer(load_config(overrides=["eval.over_cluster=3", "train.progress=false", "model.embedding_size=4"]),
                      tmp_path, echo=lambda _: None)
    g = torch.Generator().manual_seed(0)
    embeddings = torch.randn(40, 4, generator=g)
    labels = torch.arange(40) % 4
    metrics = trainer.score(embeddings, labels, clustering=True)
    expected = clustering_metrics(embeddings, labels, over_cluster=3, seed=trainer.cfg.seed)["nmi_plus"]
    assert metrics["nmi_plus"] == expected


def test_dmlkit_evaluate_takes_an_over_cluster_flag():
    parser = argparse.ArgumentParser()
    evaluate_cli.add_parser(parser)
    assert parser.parse_args(["runs/x", "--over-cluster", "30"]).over_cluster == 30
    assert parser.parse_args(["runs/x"]).over_cluster is None  # the run's eval.over_cluster
