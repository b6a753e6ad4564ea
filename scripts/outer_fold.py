"""Run a dmlkit command with one outer fold of Omniglot's training characters standing in for the test split.

Recipe choices are made on the training characters only; to compare two of them on characters no run trains or
selects on, the 68 training characters (sorted) are cut into four contiguous blocks of 17, and block ``OUTER``
becomes the ``test`` split while the other 51 are the training split (partly other alphabets, as the real test
split is). The test characters are never read. Used for the nested comparisons of docs/recipes.md.

    OUTER=0 python scripts/outer_fold.py train --set data.name=omniglot --set data.root=../shared/data/omniglot \\
        --set data.label=character --set data.image_size=28 --set train.time_budget=600 --out runs/outer0
"""

from __future__ import annotations

import os
import sys

from dmlkit.data import omniglot

BLOCK = 17


def read_with_outer_fold(fold: int):
    """``omniglot``'s reader with the training characters of block ``fold`` as the test split."""
    read = omniglot.read_omniglot

    def read_outer(root, label="character", eval_label="character"):
        train = read(root, label, eval_label)["train"]
        units = sorted(set(train.names["character"]))
        held = set(units[BLOCK * fold: BLOCK * (fold + 1)])
        keep = [u not in held for u in train.names["character"]]
        return {"train": omniglot._select(train, keep), "test": omniglot._select(train, [not k for k in keep])}

    return read_outer


if __name__ == "__main__":
    omniglot.OMNIGLOT.read = read_with_outer_fold(int(os.environ["OUTER"]))
    from dmlkit.cli.main import main

    sys.exit(main(sys.argv[1:]))
