"""Search indexes over embedded galleries (faiss) and query-time re-ranking."""

from dmlkit.index.gallery import KINDS, Index, QueryResult
from dmlkit.index.rerank import alpha_query_expansion, database_augmentation, k_reciprocal_distance

__all__ = ["KINDS", "Index", "QueryResult", "alpha_query_expansion", "database_augmentation", "k_reciprocal_distance"]
