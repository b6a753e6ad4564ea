"""docs/losses.md names every registered loss and miner, with its class."""

from pathlib import Path

from dmlkit.losses import LOSSES
from dmlkit.mining import MINERS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "losses.md"


def test_every_registered_loss_and_miner_is_in_the_catalogue_page():
    text = PAGE.read_text()
    missing = [
        f"{name} ({registry.get(name).__name__})"
        for registry in (LOSSES, MINERS)
        for name in registry.names()
        if f"`{name}`" not in text or registry.get(name).__name__ not in text
    ]
    assert not missing, f"docs/losses.md lacks {missing}"
