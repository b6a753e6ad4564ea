"""Exceptions raised by dmlkit.

Every exception derives from :class:`DmlkitError`; those about bad arguments are also the
built-in type a caller would catch (``ValueError`` / ``TypeError``), as in scikit-learn.
"""

from __future__ import annotations


class DmlkitError(Exception):
    """Base class of every error dmlkit raises on purpose."""


class InvalidParameterError(DmlkitError, ValueError, TypeError):
    """A constructor or function argument violates its declared constraint."""


class DataError(DmlkitError, ValueError):
    """A data set, manifest, embedding array or label array is malformed."""


class ConfigError(DmlkitError, ValueError):
    """A run configuration has one or more problems; all of them are listed in the message."""

    def __init__(self, problems: list[str] | str):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        if len(self.problems) == 1:
            msg = self.problems[0]
        else:
            msg = f"{len(self.problems)} problems in the configuration:\n" + "\n".join(
                f"  - {p}" for p in self.problems
            )
        super().__init__(msg)


class RecordError(DmlkitError, ValueError):
    """A file dmlkit wrote and reads back (a run's records, a kept plan, ``train.log``) is not what it wrote:
    unreadable, outside its schema (types, finite numbers in range, known keys, nesting depth), a folder, or a
    symbolic link where dmlkit writes a file of its own. The message names the file and what was expected."""


class CheckpointError(DmlkitError, RuntimeError):
    """A checkpoint is missing, truncated, or does not belong to this run's configuration."""


class NonFiniteError(DmlkitError, FloatingPointError):
    """A loss or gradient became NaN or infinite during training."""


class BatchCompositionError(InvalidParameterError, DataError, AssertionError):
    """A sampler's settings cannot build the batches asked for (``batch_size`` not a multiple of
    ``m``, fewer classes than a batch needs, an epoch shorter than a batch). Also an
    ``AssertionError``, the type pytorch-metric-learning's samplers raise for the same settings."""


class AssertedParameterError(InvalidParameterError, AssertionError):
    """An argument that pytorch-metric-learning checks with ``assert``: also an ``AssertionError``,
    so code written for PML (its own tests included) catches it where it caught PML's."""


class StorageError(DmlkitError, OSError):
    """A result could not be written: the disk (or the file-size limit) is full. Names the path and the
    space needed; the previous version of the file is intact (writes are atomic)."""


class DatabaseError(DmlkitError, ConnectionError):
    """A vector database did not answer (after its retries) or refused a request. Names the database and
    what was asked; whatever it already holds stays written."""
