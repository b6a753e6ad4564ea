"""`dmlkit train --dry-run`: the resolved run printed (every part, what the recipe chose and why); nothing trained or written."""

from dmlkit.cli.main import main


def test_dry_run_prints_the_resolved_default_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--dry-run", "--out", str(out), "--set", "model.args={width: 8}",
                 "--set", "sampler.batch_size=32", "--set", "sampler.m=null"])
    printed = capsys.readouterr().out
    assert code == 0 and not out.exists()
    assert printed.startswith("resolved run: mnist-proxy-anchor\n")
    assert "  model " in printed and "SmallCNN" in printed and "  objective " in printed and "ProxyAnchorLoss" in printed
    assert "what the recipe chose and why (training split: " in printed
    # a value the recipe chose, with its reason; the training split's five digits and no validation classes
    assert "  sampler.m = 8  (" in printed
    assert "  protocol.val_class_fraction = 0.0  (5 training classes: too few for class-disjoint validation)" in printed
    assert "  train.feature_cache = off  (" in printed
