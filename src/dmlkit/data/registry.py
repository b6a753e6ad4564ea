"""The DATASETS registry: what each benchmark is, where its files are, how its labels are named."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from dmlkit.core.registry import Registry
from dmlkit.exceptions import InvalidParameterError


@dataclass
class SplitSource:
    """One official split before any protocol is applied.

    ``names[kind]`` holds, for every sample, its class name under the label ``kind``
    (e.g. ``{"character": [...], "alphabet": [...]}``). ``paths`` (image files), ``images``
    (``[N, C, H, W]`` uint8 in memory) or both (files decoded into memory, the paths kept to name
    them) are set; ``skipped`` lists unreadable files left out (``skip_bad_images``); ``class_split`` says how
    a reader chose the classes of its train split, where it chose them.
    """

    names: dict[str, list[str]]
    paths: list[str] | None = None
    images: torch.Tensor | None = None
    skipped: list[str] = field(default_factory=list)
    #: how a reader divided the classes into train and test (``{"mode", "seed"}``), recorded in the run
    class_split: dict | None = None

    def __len__(self) -> int:
        return len(next(iter(self.names.values())))


@dataclass
class DatasetSpec:
    """A registered data set: its reader, label kinds and published split sizes.

    ``read(root, label, eval_label)`` returns the official splits as :class:`SplitSource`
    (``train`` and ``test``, or ``train``, ``query``, ``gallery``). ``label_kinds[0]`` is the
    default label; ``"class"`` is accepted as its alias. ``published`` maps split names to
    ``(images, classes)`` from the papers. ``group_kind(label, eval_label)`` names the label whose
    classes must not cross the train/val/test boundary. ``reads_files=False``: built in (no ``root``
    read), so a ``data.root`` given with it means the user's own folder (:func:`dmlkit.config.loading.load_config`).
    """

    name: str
    read: Callable[..., dict[str, SplitSource]]
    label_kinds: tuple[str, ...] = ("class",)
    eval_mode: str = "leave_one_out"
    image_mode: str = "RGB"
    in_memory: bool = False
    published: dict[str, tuple[int, int]] = field(default_factory=dict)
    layout: str = ""
    group_kind: Callable[[str, str], str] | None = None
    reads_files: bool = True

    def resolve_label(self, label: str | None, what: str = "label") -> str:
        """Return the canonical label kind for ``label`` (``"class"`` means the default kind)."""
        if label is None or label == "class":
            return self.label_kinds[0]
        if label not in self.label_kinds:
            raise InvalidParameterError(
                f"The {what!r} parameter of dataset {self.name!r} must be one of "
                f"{{{', '.join(repr(k) for k in ('class',) + self.label_kinds)}}}. Got {label!r} instead."
            )
        return label

    def group_of(self, label: str, eval_label: str) -> str:
        return self.group_kind(label, eval_label) if self.group_kind else label

    def __call__(self, **kwargs) -> dict[str, SplitSource]:
        return self.read(**kwargs)


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    """Add ``spec`` to :data:`DATASETS` under ``spec.name``."""
    DATASETS.register(spec.name)(spec)
    return spec


def get_dataset_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` registered as ``name`` (did-you-mean error otherwise)."""
    return DATASETS.get(name)  # type: ignore[return-value]


def list_datasets(pattern: str = "*") -> list[str]:
    """Sorted names of the registered data sets matching a shell-style ``pattern``."""
    return DATASETS.names(pattern)

