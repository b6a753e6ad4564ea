"""Search indexes over embedded galleries (faiss), their export to a vector database (Qdrant), query-time
re-ranking and a k-NN classifier."""

from dmlkit.index.classify import Classification
from dmlkit.index.database import QdrantCollection
from dmlkit.index.gallery import KINDS, Index, QueryResult
from dmlkit.index.rerank import alpha_query_expansion, database_augmentation, k_reciprocal_distance

__all__ = ["KINDS", "Classification", "Index", "QdrantCollection", "QueryResult", "alpha_query_expansion",
           "database_augmentation", "k_reciprocal_distance"]
