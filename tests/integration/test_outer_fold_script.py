"""scripts/outer_fold.py: an outer block of Omniglot's training characters stands in for the test split."""

from __future__ import annotations

from pathlib import Path

import pytest

from dmlkit.data import omniglot

OMNIGLOT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "omniglot"


@pytest.mark.parametrize("fold", [0, 3])
def test_an_outer_block_of_the_training_characters_becomes_the_test_split(script_loader, fold):
    read = script_loader("outer_fold").read_with_outer_fold(fold)
    official = omniglot.read_omniglot(OMNIGLOT)
    splits = read(OMNIGLOT)
    train, test = set(splits["train"].names["character"]), set(splits["test"].names["character"])
    training = sorted(set(official["train"].names["character"]))
    assert len(training) == 68 and len(test) == 17 and len(train) == 51
    assert test == set(training[17 * fold:17 * (fold + 1)]) and train | test == set(training)
    assert not (train | test) & set(official["test"].names["character"])  # the real test characters are never read
    assert len(splits["test"]) == 17 * 20 and len(splits["train"]) == 51 * 20
