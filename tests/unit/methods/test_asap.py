"""ASAP's outer loop: proximal gradient, k-center proxy re-initialisation, projections, exact resume."""

import json

import pytest
import torch

from dmlkit.config import load_config
from dmlkit.engine.checkpoint_files import load_checkpoint
from dmlkit.methods.asap import AsapHooks, proximal_gradient_, proxy_spread
from dmlkit.recipe import Trainer

ASAP = [
    "asap.enabled=true",
    "asap.proxies_per_class=2",
    "asap.pool_size=4",
    "asap.patience=1",
    "asap.proximal_lambda=0.01",
    "protocol.val_fraction=0.2",
    "train.eval_every=4",
    "train.checkpoint_every=4",
    "train.max_steps=24",
    "train.progress=false",
    "eval.clustering=false",
    "sampler.batch_size=32",
    "sampler.m=8",
    "model.embedding_size=8",
    "data.name=digits",  # 8x8 digits: the same ASAP steps as on MNIST at a fraction of the evaluation cost
]


def test_proximal_gradient_is_lambda_times_displacement():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    anchor = torch.tensor([0.5, 2.0, 4.0], dtype=torch.float64)
    # reference: autograd of lam/2 ||theta - theta*||^2
    lam = 0.3
    ref = torch.autograd.grad(0.5 * lam * ((p - anchor) ** 2).sum(), p)[0]
    p.grad = torch.full_like(p, 0.25)
    proximal_gradient_([p], [anchor], lam)
    assert torch.allclose(p.grad, ref + 0.25)
    q = torch.nn.Parameter(torch.zeros(2))
    proximal_gradient_([q], [torch.ones(2)], 2.0)  # no gradient yet
    assert torch.equal(q.grad, torch.full((2,), -2.0))


def test_per_class_rows_draws_distinct_rows_of_each_class():
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 2])
    g = torch.Generator().manual_seed(0)
    rows, mask = AsapHooks.per_class_rows(labels, 3, 3, g)
    assert rows.shape == (3, 3)
    assert mask.sum(1).tolist() == [3, 2, 3]
    for c in range(3):
        picked = rows[c][mask[c]]
        assert (labels[picked] == c).all() and len(set(picked.tolist())) == len(picked)
    eligible = torch.tensor([True, False, False, True, True, False, True, True, True, True])
    rows, mask = AsapHooks.per_class_rows(labels, 3, 3, g, eligible)
    assert set(rows[0][mask[0]].tolist()) == {0}
    assert eligible[rows[mask]].all()


def test_proxy_spread_reference():
    per_class = torch.tensor([[[0.0, 0.0], [3.0, 4.0]], [[1.0, 1.0], [1.0, 1.0]]])
    assert proxy_spread(per_class) == pytest.approx(2.5)  # (5 + 0) / 2 classes


@pytest.fixture(scope="module")
def asap_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("asap")
    trainer = Trainer(load_config(overrides=ASAP), run_dir)
    result = trainer.fit()
    return run_dir, trainer, result


def test_projection_reinitialises_proxies_from_pool_and_resets_their_optimizer_state(tmp_path):
    trainer = Trainer(load_config(overrides=ASAP), tmp_path)
    hooks = trainer.hooks
    assert isinstance(hooks, AsapHooks)
    hooks.on_train_start(trainer)
    proxies = trainer.objective.loss.proxies
    # after the first projection start, every proxy is the embedding of a training sample of its class
    from dmlkit.evaluation.embed import embed_dataset

    emb, raw = embed_dataset(trainer.model, trainer.splits.train)
    labels = trainer.label_map(raw)
    d = torch.cdist(proxies.detach(), emb)
    nearest = d.argmin(1)
    assert torch.allclose(d.min(1).values, torch.zeros(len(proxies)), atol=2e-3)  # cdist on float32
    assert torch.equal(labels[nearest], trainer.objective.loss.proxy_labels)
    # one optimiser step creates Adam state for the proxies; a new projection drops it
    from dmlkit.engine.batches import fetch_batch

    images, raw = fetch_batch(trainer.splits.train, list(range(32)))
    trainer.training_step(images, trainer.label_map(raw))
    assert proxies in trainer.optimizer.state
    hooks.start_projection(trainer)
    assert proxies not in trainer.optimizer.state
    assert hooks.anchors and all(torch.equal(a, p.detach()) for a, p in zip(hooks.anchors, trainer.model.parameters()))


def test_run_logs_projections_with_covering_radius(asap_run):
    run_dir, trainer, result = asap_run
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    projections = [r for r in log if r["kind"] == "projection"]
    assert projections, "the projection cut by the step budget is logged too"
    assert projections[-1]["complete"] is False
    for r in projections:
        assert r["covering_radius_before"] > 0 and r["covering_radius_after"] > 0
        assert r["steps"] > 0 and 0 <= r["best_map_at_r"] <= 1 and r["proxy_spread"] >= 0
    assert [r["projection"] for r in projections] == list(range(len(projections)))
    assert json.loads((run_dir / "metrics.json").read_text())["selected_on"] == "val"


def test_patience_ends_projection_and_starts_next(tmp_path):
    trainer = Trainer(load_config(overrides=ASAP + ["asap.projections_without_improvement=2"]), tmp_path)
    trainer.run_dir.prepare(trainer.cfg, trainer.splits)
    hooks = trainer.hooks
    hooks.on_train_start(trainer)
    before = trainer.objective.loss.proxies.detach().clone()
    assert hooks.on_evaluation(trainer, 0.5, True) is False  # projection 0 improves
    assert hooks.on_evaluation(trainer, 0.4, False) is False  # patience 1 reached: projection 1 starts
    assert hooks.projection == 1 and hooks.projections_without_improvement == 0
    assert not torch.equal(before, trainer.objective.loss.proxies.detach())  # re-initialised by k-center
    assert hooks.on_evaluation(trainer, 0.3, False) is False  # first evaluation of projection 1
    assert hooks.on_evaluation(trainer, 0.2, False) is False  # projection 1 ends below 0.5
    assert hooks.projections_without_improvement == 1 and hooks.projection == 2
    assert hooks.on_evaluation(trainer, 0.1, False) is False
    assert hooks.on_evaluation(trainer, 0.05, False) is True  # second projection without improvement: stop
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["projection"] for r in log if r["kind"] == "projection"] == [0, 1, 2]


def test_resume_in_the_middle_of_a_projection_is_exact(tmp_path, asap_run):
    run_a, _, result_a = asap_run

    class Crash(AsapHooks):
        def after_backward(self, trainer):
            super().after_backward(trainer)
            if trainer.step + 1 == 15:
                raise KeyboardInterrupt

    cfg = load_config(overrides=ASAP)
    t = Trainer(cfg, tmp_path)
    t.hooks = Crash.__new__(Crash)
    t.hooks.__dict__.update(AsapHooks(t).__dict__)
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["step"] == 12
    result_b = Trainer(cfg, tmp_path, resume=True).fit()
    wa = load_checkpoint(run_a / "checkpoints" / "last.pt")["model"]
    wb = load_checkpoint(tmp_path / "checkpoints" / "last.pt")["model"]
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert result_a.test_metrics == result_b.test_metrics


def test_asap_reads_the_trainer_only_through_the_documented_training_state():
    import re
    from pathlib import Path

    from dmlkit.methods.hooks import TrainingState

    source = (Path(__file__).resolve().parents[3] / "src" / "dmlkit" / "methods" / "asap.py").read_text()
    used = set(re.findall(r"trainer\.([a-z_]+)", source))
    assert used and used <= set(TrainingState.__annotations__), used - set(TrainingState.__annotations__)


def test_end_of_projection_restores_the_best_weights_and_proxies(tmp_path, monkeypatch):
    """Alg. 1: theta* <- theta and rho* <- rho of the projection's best validation; the next
    GreedyKCenterProxy(rho*, b, f(.; theta*)) starts from both."""
    import dmlkit.methods.asap as asap_module

    trainer = Trainer(load_config(overrides=ASAP + ["asap.projections_without_improvement=5"]), tmp_path)
    trainer.run_dir.prepare(trainer.cfg, trainer.splits)
    hooks = trainer.hooks
    hooks.on_train_start(trainer)
    proxies = trainer.objective.loss.proxies
    assert hooks.on_evaluation(trainer, 0.5, True) is False  # the projection's best: theta, rho saved here
    best_weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    best_proxies = proxies.detach().clone()
    with torch.no_grad():  # training moves on past the best state
        for p in trainer.model.parameters():
            p.add_(0.1)
        proxies.add_(0.1)
    seen = {}
    refresh = asap_module.refresh_proxies_k_center

    def recording_refresh(bank, pool, mask, keep_current):
        seen["proxies"] = bank.proxies.detach().clone()
        seen["weights"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        return refresh(bank, pool, mask, keep_current=keep_current)

    monkeypatch.setattr(asap_module, "refresh_proxies_k_center", recording_refresh)
    assert hooks.on_evaluation(trainer, 0.4, False) is False  # patience reached: next projection
    assert hooks.projection == 1
    assert torch.equal(seen["proxies"], best_proxies)
    for k, v in best_weights.items():
        assert torch.equal(seen["weights"][k], v), k


def test_training_step_applies_the_proximal_gradient(tmp_path):
    """One SGD step with lambda > 0 moves theta by -lr * lambda * (theta - theta*) more than with lambda = 0."""
    lam, lr = 0.5, 0.1
    base = ASAP + ["optimizer.name=sgd", f"optimizer.lr={lr}", "optimizer.momentum=0", "optimizer.weight_decay=0"]
    from dmlkit.engine.batches import fetch_batch

    after, anchors = {}, None
    for value in (0.0, lam):
        trainer = Trainer(load_config(overrides=base + [f"asap.proximal_lambda={value}"]), tmp_path / str(value))
        trainer.hooks.on_train_start(trainer)
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        g = torch.Generator().manual_seed(0)
        # theta* away from theta, the same in both runs
        trainer.hooks.anchors = [p.detach() + 0.05 * torch.randn(p.shape, generator=g) for p in params]
        anchors = trainer.hooks.anchors
        start = [p.detach().clone() for p in params]
        images, raw = fetch_batch(trainer.splits.train, list(range(32)))
        trainer.training_step(images, trainer.label_map(raw))
        after[value] = [p.detach().clone() for p in params]
    moved = 0
    for a, b, theta, anchor in zip(after[0.0], after[lam], start, anchors):
        expected = -lr * lam * (theta - anchor)
        torch.testing.assert_close(b - a, expected, rtol=1e-4, atol=1e-6)
        moved += int((b - a).abs().max() > 0)
    assert moved == len(start)
