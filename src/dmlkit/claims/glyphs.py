"""Omniglot glyphs for the claims tests: seeded class-disjoint splits, a network trained from scratch.

A fifth of every alphabet's characters is set aside once as the tuning pool (:func:`tuning_pool`): the
validation classes of the tuning runs, never used by any seed. Three settings, drawn from the other
characters and re-drawn for every seed (the seed picks the test classes, so a verdict covers the
class draw as well as the initialisation):

* ``characters``: characters are the classes; half of them test, a fifth of the rest validate,
  the others train (Proxy-Anchor, Proxy-NCA, DRO and ASAP claims).
* ``alphabets-disjoint``: EPS on disjoint alphabets: per seed 3 of the 5 alphabets train (alphabet
  labels; a fifth of their characters validate) and the characters of the other 2 are the test
  classes (scored on character labels: a set EPS's training never saw a character or alphabet of).
* ``alphabets``: EPS Sec. 5.2 as far as 5 alphabets allow: the network trains on *alphabet*
  labels only; half the characters of every alphabet are held out as test characters and a fifth
  of the rest validate (selection on their alphabet labels: the labels training has). The test
  characters are scored on character labels (EPS Table 3 left, "letters") and on alphabet labels
  (Table 3 right, "languages", NMI+ with 30x clusters).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from dmlkit.data.base import TensorImageDataset
from dmlkit.exceptions import DataError

#: Side of the glyphs the network sees (the glyph recipe's size for Omniglot).
IMAGE_SIZE = 28
#: Channels of the CNN's first block (then 2x and 4x): half the glyph recipe's 32, a third of its cost a step, so
#: that every arm, grid point and seed of the full run fits in its time on 2 cores.
GLYPH_WIDTH = 16
#: Fraction of the classes (characters; per alphabet in ``alphabets``) held out for testing.
TEST_FRACTION = 0.5
#: Fraction of the remaining classes held out for validation (checkpoint and learning-rate choice).
VAL_FRACTION = 0.2
#: Fraction of every alphabet's characters set aside once (a fixed draw) as the tuning pool: the validation
#: classes of every tuning run, never a train, validation or test class of any seed.
TUNING_FRACTION = 0.2
#: The draw of the tuning pool and of the tuning runs' training classes (fixed: one tuning for every seed).
TUNING_SEED = 1_000_003
SETTINGS = ("characters", "alphabets", "alphabets-disjoint")


@dataclass(frozen=True)
class GlyphPool:
    """Every Omniglot drawing found, resized to ``IMAGE_SIZE``, with its character and alphabet."""

    images: torch.Tensor  # uint8 [N, 1, IMAGE_SIZE, IMAGE_SIZE]
    characters: tuple[str, ...]
    alphabets: tuple[str, ...]


@functools.lru_cache(maxsize=2)
def load_pool(root: str, subset: int | None = None) -> GlyphPool:
    """Read Omniglot under ``root`` (zip or folders) once per process; ``subset=k`` keeps ``k`` drawings a character."""
    from dmlkit.data.omniglot import read_omniglot

    if not Path(root).exists():
        raise DataError(f"claims: the Omniglot root '{root}' does not exist (expected images_background*.zip or "
                        "images_background/<alphabet>/<character>/*.png under it; --omniglot sets it).")
    sources = read_omniglot(root)
    parts = [sources["train"], sources["test"]]
    if any(p.images is None for p in parts):
        raise DataError(f"claims: Omniglot under '{root}' was not decoded into memory.")
    images = torch.cat([p.images for p in parts])
    characters = [c for p in parts for c in p.names["character"]]
    alphabets = [a for p in parts for a in p.names["alphabet"]]
    small = torch.nn.functional.interpolate(images.float(), size=(IMAGE_SIZE, IMAGE_SIZE), mode="area")
    small = small.round().clamp(0, 255).to(torch.uint8)
    if subset is not None:
        seen: dict[str, int] = {}
        keep = []
        for i, c in enumerate(characters):
            seen[c] = seen.get(c, 0) + 1
            if seen[c] <= subset:
                keep.append(i)
        small = small[keep]
        characters, alphabets = [characters[i] for i in keep], [alphabets[i] for i in keep]
    return GlyphPool(small, tuple(characters), tuple(alphabets))


@dataclass
class GlyphSplits:
    """One seed's splits; ``test_alphabets`` holds the test rows' alphabet ids (scored in ``alphabets``)."""

    train: TensorImageDataset
    val: TensorImageDataset
    test: TensorImageDataset
    test_alphabets: torch.Tensor
    test_classes: list[str]
    setting: str


def _permuted(items: list[str], generator: torch.Generator) -> list[str]:
    return [items[i] for i in torch.randperm(len(items), generator=generator).tolist()]


def _dataset(pool: GlyphPool, rows: list[int], names: tuple[str, ...], tag: str) -> TensorImageDataset:
    classes = sorted({names[i] for i in rows})
    index = {c: j for j, c in enumerate(classes)}
    labels = torch.tensor([index[names[i]] for i in rows], dtype=torch.int64)
    return TensorImageDataset(pool.images[rows], labels, classes, name=f"omniglot-claims/{tag}")


def split_characters(characters: list[str], seed: int) -> tuple[set[str], set[str], set[str]]:
    """``(train, val, test)`` characters: a seeded permutation, :data:`TEST_FRACTION` test, then :data:`VAL_FRACTION`."""
    g = torch.Generator().manual_seed(seed)
    order = _permuted(sorted(set(characters)), g)
    n_test = int(round(len(order) * TEST_FRACTION))
    rest = order[n_test:]
    n_val = max(2, int(round(len(rest) * VAL_FRACTION)))
    return set(rest[n_val:]), set(rest[:n_val]), set(order[:n_test])


def tuning_pool(pool: GlyphPool) -> set[str]:
    """The characters no seed ever trains, validates or tests on: :data:`TUNING_FRACTION` of every alphabet's."""
    chosen: set[str] = set()
    for index, alphabet in enumerate(sorted(set(pool.alphabets))):
        chars = sorted({c for c, a in zip(pool.characters, pool.alphabets) if a == alphabet})
        order = _permuted(chars, torch.Generator().manual_seed(TUNING_SEED + index))
        chosen |= set(order[: max(1, int(round(len(chars) * TUNING_FRACTION)))])
    return chosen


def build_splits(pool: GlyphPool, setting: str, seed: int, *, tuning: bool = False) -> GlyphSplits:
    """The splits of ``setting`` (:data:`SETTINGS`) for ``seed``, drawn from the characters outside the tuning pool.

    ``tuning``: the tuning split instead: the training classes of a fixed draw (:data:`TUNING_SEED`) and the
    tuning pool as validation classes (``seed`` is ignored), so that no seed's test class chooses a setting.
    """
    if setting not in SETTINGS:
        raise DataError(f"claims: unknown glyph setting {setting!r}; expected one of {SETTINGS}.")
    reserved = tuning_pool(pool)
    kept = [(c, a) for c, a in zip(pool.characters, pool.alphabets) if c not in reserved]
    seed = TUNING_SEED if tuning else seed
    if setting == "characters":
        train_c, val_c, test_c = split_characters([c for c, _ in kept], seed)
        train_names = val_names = pool.characters
    elif setting == "alphabets-disjoint":  # 3 alphabets train (and validate), the other 2 test
        alphabets = _permuted(sorted({a for _, a in kept}), torch.Generator().manual_seed(seed))
        n_test = max(1, len(alphabets) * 2 // 5)
        test_c = {c for c, a in kept if a in alphabets[:n_test]}
        train_c, val_c = set(), set()
        for index, alphabet in enumerate(alphabets[n_test:]):
            chars = sorted({c for c, a in kept if a == alphabet})
            order = _permuted(chars, torch.Generator().manual_seed(seed * 1009 + index))
            n_val = max(1, int(round(len(chars) * VAL_FRACTION)))
            val_c |= set(order[:n_val])
            train_c |= set(order[n_val:])
        train_names = val_names = pool.alphabets
    else:  # alphabets: characters held out within every alphabet, trained and validated on alphabet labels
        train_c, val_c, test_c = set(), set(), set()
        for index, alphabet in enumerate(sorted({a for _, a in kept})):
            chars = [c for c, a in kept if a == alphabet]
            tr, va, te = split_characters(chars, seed * 1009 + index)  # an independent draw per alphabet
            train_c |= tr
            val_c |= va
            test_c |= te
        train_names = val_names = pool.alphabets
    if tuning:  # validation on the pool; the draw's own validation and test classes are not used
        val_c, test_c = reserved, reserved
    rows = {key: [i for i, c in enumerate(pool.characters) if c in chars]
            for key, chars in (("train", train_c), ("val", val_c), ("test", test_c))}
    test = _dataset(pool, rows["test"], pool.characters, "test")
    alphabet_ids = {a: j for j, a in enumerate(sorted(set(pool.alphabets)))}
    return GlyphSplits(
        train=_dataset(pool, rows["train"], train_names, "train"),
        val=_dataset(pool, rows["val"], val_names, "val"),
        test=test,
        test_alphabets=torch.tensor([alphabet_ids[pool.alphabets[i]] for i in rows["test"]], dtype=torch.int64),
        test_classes=sorted(test_c),
        setting=setting,
    )


def create_glyph_model(seed: int, embedding_size: int, normalization: str) -> torch.nn.Module:
    """The glyph recipe's small CNN at :data:`GLYPH_WIDTH` from scratch; ``seed`` fixes its initial weights for every
    arm."""
    from dmlkit.models import create_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return create_model("small_cnn", embedding_size=embedding_size, normalization=normalization, width=GLYPH_WIDTH)
