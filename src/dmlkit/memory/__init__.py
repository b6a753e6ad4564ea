"""Cross-batch memory: past embeddings as the reference set of a pair loss."""

from torch import nn

from dmlkit.core.registry import Registry
from dmlkit.memory.cross_batch import CrossBatchMemory

MEMORIES: Registry[nn.Module] = Registry("memory")
MEMORIES.register("cross_batch_memory")(CrossBatchMemory)

__all__ = ["CrossBatchMemory", "MEMORIES"]
