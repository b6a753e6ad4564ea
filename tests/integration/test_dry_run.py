"""`dmlkit train --dry-run`: the resolved run printed (every part, what the recipe chose and why); nothing trained or written."""

from dmlkit.cli.main import main


def test_dry_run_prints_the_resolved_default_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where `runs/<timestamp>-<name>` would be made
    code = main(["train", "--dry-run"])
    printed = capsys.readouterr().out
    assert code == 0 and list(tmp_path.iterdir()) == []
    assert printed.startswith("resolved run: mnist-proxy-anchor\n")
    assert "  model          small_cnn (Embedder), embedding size 64" in printed and "  objective " in printed and "ProxyAnchorLoss" in printed
    assert "what the recipe chose and why (training split: " in printed
    # a value the recipe chose, with its reason; the training split's five digits and no validation classes
    assert "  sampler.m = 16  (a fifth of 500 images per class, in [2, 16])" in printed
    assert "  protocol.val_class_fraction = 0.0  (5 training classes: too few for class-disjoint validation)" in printed
    assert "  train.feature_cache = off  (" in printed
