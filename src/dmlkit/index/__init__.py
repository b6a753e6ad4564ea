"""Search indexes over embedded galleries (faiss), their export to a vector database (Qdrant), query-time
re-ranking, a k-NN classifier, and pytorch-metric-learning's inference utilities under their PML names
(``InferenceModel``, ``MatchFinder``, ``FaissKNN``, ``CustomKNN``, ``FaissKMeans``; also importable from
:mod:`dmlkit.inference`, as PML's ``utils.inference``)."""

from dmlkit.index.classify import Classification
from dmlkit.index.database import QdrantCollection
from dmlkit.index.gallery import KINDS, Index, QueryResult
from dmlkit.index.inference_model import InferenceModel, MatchFinder
from dmlkit.index.knn_funcs import CustomKNN, FaissKMeans, FaissKNN
from dmlkit.index.rerank import alpha_query_expansion, database_augmentation, k_reciprocal_distance

__all__ = ["KINDS", "Classification", "CustomKNN", "FaissKMeans", "FaissKNN", "Index", "InferenceModel", "MatchFinder",
           "QdrantCollection", "QueryResult", "alpha_query_expansion", "database_augmentation", "k_reciprocal_distance"]
