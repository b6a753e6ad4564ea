"""Fine-tuning stops when validation stops improving significantly.

A validation counts as progress when its per-query AP@R gain over the last validation that made progress (the
untrained embedding at first) exceeds 2 standard errors of the paired differences; ``train.patience``
validations without progress stop the run. The kept checkpoint still has to beat the untrained embedding
significantly. The validation scores are scripted, so the rule is checked on known numbers.
"""

from __future__ import annotations

import torch

from dmlkit.engine import trainer as trainer_module
from dmlkit.engine.trainer import SIGNIFICANT_ERRORS, paired_gain
from dmlkit.engine.training import selection as selection_module
from dmlkit.recipe import Trainer

QUERIES = 400


def scripted(trainer: Trainer, monkeypatch, per_query: list[torch.Tensor]) -> None:
    """Validation ``i`` scores the per-query APs ``per_query[i]``."""
    calls = iter(per_query)
    current = {}
    for module in (trainer_module, selection_module):  # the loop and the validation room both ask
        monkeypatch.setattr(module, "selects_by_significance", lambda cfg: True)
    monkeypatch.setattr(trainer, "embed", lambda dataset, progress=False: (torch.zeros(1, 2), torch.zeros(1)))

    def per_query_ap(*args, **kwargs):
        current["ap"] = next(calls)
        return current["ap"]

    monkeypatch.setattr(selection_module, "map_at_r_per_query", per_query_ap)
    monkeypatch.setattr(trainer, "score", lambda *a, **k: {"map_at_r": float(current["ap"].mean())})


def aps(mean: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(QUERIES, generator=g, dtype=torch.float64) * 0.01
    return (torch.full((QUERIES,), mean, dtype=torch.float64) + noise - noise.mean()).clamp(0, 1)


def test_training_stops_after_patience_validations_without_a_significant_gain(tmp_path, tiny_config, monkeypatch):
    cfg = tiny_config("protocol.val_fraction=0.1", "train.max_steps=60", "train.eval_every=5", "train.patience=2")
    trainer = Trainer(cfg, tmp_path, echo=lambda _: None)
    script = [aps(0.50, 0),              # step 0: the untrained embedding
              aps(0.53, 1),              # step 5: a clear gain: progress, the new reference, kept
              aps(0.531, 2),             # step 10: a thousandth more: no progress (but the best so far)
              aps(0.5305, 3),            # step 15: no progress again: stop (patience 2)
              aps(0.50, 4)]
    scripted(trainer, monkeypatch, script)
    result = trainer.fit()
    assert result.steps == 15
    assert result.best_step == 10  # the highest MAP@R among those significantly above the untrained embedding
    records = [r for r in trainer.run_dir.read_log() if r.get("kind") == "eval" and r.get("split") == "val"]
    assert [r["step"] for r in records] == [0, 5, 10, 15]
    gain, error = paired_gain(script[2], script[1])
    assert records[2]["gain_over_reference"] == gain and not gain > SIGNIFICANT_ERRORS * error


def test_a_slow_steady_rise_keeps_training(tmp_path, tiny_config, monkeypatch):
    cfg = tiny_config("protocol.val_fraction=0.1", "train.max_steps=25", "train.eval_every=5", "train.patience=2")
    trainer = Trainer(cfg, tmp_path, echo=lambda _: None)
    # each validation adds a little; the gain over the last significant one is significant every other time
    script = [aps(0.50 + 0.001 * i, 10 + i) for i in range(6)]
    scripted(trainer, monkeypatch, script)
    result = trainer.fit()
    assert result.steps == 25 and result.best_step == 25
    progress = [r["gain_over_reference"] > SIGNIFICANT_ERRORS * r["reference_standard_error"]
                for r in trainer.run_dir.read_log() if r.get("kind") == "eval" and r.get("step", 0) > 0
                and r.get("split") == "val"]
    assert progress == [False, True, False, True, False]
