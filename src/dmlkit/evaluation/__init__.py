"""Evaluation: exact k-NN (torch or faiss), retrieval, verification and clustering metrics, geometry, ensembles.

:class:`AccuracyCalculator` is pytorch-metric-learning's interface on the same exact k-NN.
"""

from dmlkit.evaluation.accuracy_calculator import AccuracyCalculator
from dmlkit.evaluation.clustering import clustering_metrics, kmeans_assignments
from dmlkit.evaluation.ensemble import concatenate_embeddings, ensemble_retrieval_metrics
from dmlkit.evaluation.evaluate import evaluate
from dmlkit.evaluation.geometry import (
    class_centroids,
    class_collapse,
    covering_radius,
    geometry_metrics,
    interclass_distance,
)
from dmlkit.evaluation.knn import iter_knn_blocks, knn
from dmlkit.evaluation.retrieval import (
    map_at_r_per_query,
    own_reference_rows,
    query_gallery_union,
    retrieval_metrics,
    retrieval_metrics_per_group,
    true_reference_counts,
)
from dmlkit.evaluation.verification import threshold_at_fmr, verification_metrics

__all__ = [
    "AccuracyCalculator",
    "class_centroids",
    "class_collapse",
    "clustering_metrics",
    "concatenate_embeddings",
    "covering_radius",
    "ensemble_retrieval_metrics",
    "map_at_r_per_query",
    "own_reference_rows",
    "query_gallery_union",
    "evaluate",
    "geometry_metrics",
    "interclass_distance",
    "iter_knn_blocks",
    "kmeans_assignments",
    "knn",
    "retrieval_metrics",
    "retrieval_metrics_per_group",
    "threshold_at_fmr",
    "true_reference_counts",
    "verification_metrics",
]
