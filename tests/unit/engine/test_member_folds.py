"""protocol.member_folds: each ensemble member holds out its own fold of the training classes (engine/member_folds.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dmlkit.config import load_config
from dmlkit.data.base import DataSplits, TensorImageDataset
from dmlkit.engine.batches import LabelMap, build_batch_sampler
from dmlkit.engine.member_folds import (
    MemberBatchSampler,
    apply_member_folds,
    fold_classes,
    fold_count,
    score_member_folds,
)
from dmlkit.engine.objective import EnsembleObjective, TrainingObjective
from dmlkit.engine.splits import hold_out_validation_classes
from dmlkit.exceptions import ConfigError
from dmlkit.losses import ProxyAnchorLoss
from dmlkit.models import EmbedderEnsemble, create_model

REPO = Path(__file__).resolve().parents[3]
OMNIGLOT = REPO.parent / "shared" / "data" / "omniglot"


def toy_splits(classes: int = 20, per_class: int = 4, fraction: float = 0.2, seed: int = 0) -> DataSplits:
    """An in-memory training split of ``classes`` classes (named c00, c01, ...), its validation classes held out."""
    labels = torch.arange(classes).repeat_interleave(per_class)
    images = torch.rand(len(labels), 1, 8, 8)
    train = TensorImageDataset(images, labels, [f"c{i:02d}" for i in range(classes)], transform=None)
    splits = DataSplits(name="toy", train=train)
    hold_out_validation_classes(splits, fraction, seed)
    return splits


def test_folds_are_disjoint_the_first_is_the_held_out_validation_classes_and_sizes_match():
    held = ["c03", "c11", "c17", "c05"]
    rest = [f"c{i:02d}" for i in range(20) if f"c{i:02d}" not in held]
    folds = fold_classes(held, rest, members=5, folds=5, seed=3)
    assert folds[0] == sorted(held)
    flat = [c for fold in folds for c in fold]
    assert len(flat) == len(set(flat)) == 20  # five folds cover every class once
    assert sorted(len(f) for f in folds) == [4, 4, 4, 4, 4]
    assert fold_classes(held, rest, members=3, folds=5, seed=3) == folds[:3]  # fewer members: the first folds
    assert fold_classes(held, rest, members=5, folds=5, seed=4) != folds  # seeded
    assert fold_count(0.2) == 5 and fold_count(0.25) == 4 and fold_count(0.9) == 2
    with pytest.raises(ValueError, match="1 <= members <= folds"):
        fold_classes(held, rest, members=6, folds=5, seed=0)


def test_each_member_trains_without_its_fold_and_is_scored_on_it_alone():
    splits = toy_splits()
    common_train = splits.train
    held = sorted(set(splits.val.class_names))
    label_map = LabelMap(splits.before_holdout.labels)
    folds = apply_member_folds(splits, label_map, members=3, fraction=0.2, seed=0)
    assert len(splits.train) == 80  # every training class again
    names = splits.train.class_names
    train_class = [names[i] for i in splits.train.labels.tolist()]
    val_class = [splits.val.class_names[i] for i in splits.val.labels.tolist()]
    assert folds.classes[0] == held
    for i in range(3):
        own = set(folds.classes[i])
        trained = {train_class[r] for r in folds.train_rows[i].tolist()}
        assert trained.isdisjoint(own) and len(trained) == 20 - len(own)
        assert {val_class[r] for r in folds.val_rows[i].tolist()} == own
        assert len(folds.val_rows[i]) == 4 * len(own)  # every image of its fold
        lookup = folds.label_maps[i]
        held_labels = {label_map(torch.tensor([names.index(c)])).item() for c in own}
        assert {int(c) for c in torch.nonzero(lookup < 0).flatten()} == held_labels
        assert sorted(lookup[lookup >= 0].tolist()) == list(range(20 - len(own)))  # its own 0..C_i-1
    assert folds.class_counts() == [20 - len(f) for f in folds.classes]
    # member 0 trains on exactly the rows the run without member folds trains on
    assert sorted(train_class[r] for r in folds.train_rows[0].tolist()) == sorted(
        common_train.class_names[i] for i in common_train.labels.tolist())
    assert splits.info["member_val_classes"] == folds.classes


def test_the_sampler_puts_each_members_own_batch_side_by_side():
    splits = toy_splits()
    label_map = LabelMap(splits.before_holdout.labels)
    folds = apply_member_folds(splits, label_map, members=3, fraction=0.2, seed=0)
    cfg = load_config(overrides=["sampler.batch_size=8", "sampler.m=2"])
    sampler = build_batch_sampler(cfg, splits.train.labels, member_folds=folds)
    assert isinstance(sampler, MemberBatchSampler)
    batches = sampler.batches(0)
    assert batches.shape == (sampler.num_batches, 24)
    labels = splits.train.labels
    for i, rows in enumerate(folds.train_rows):
        block = batches[:, 8 * i:8 * (i + 1)]
        assert set(block.flatten().tolist()) <= set(rows.tolist())
        per_class = torch.stack([torch.bincount(labels[b], minlength=20) for b in block])
        assert set(per_class[per_class > 0].tolist()) == {2}  # m images of each class in the member's batch
    assert torch.equal(sampler.batches(1), sampler.batches(1)) and not torch.equal(sampler.batches(0), sampler.batches(1))
    # member 0 draws the batches the run without member folds draws (seeded by cfg.seed, over the same rows)
    plain = build_batch_sampler(cfg, labels[folds.train_rows[0]])
    assert torch.equal(batches[:, :8], folds.train_rows[0][plain.batches(0)][: len(batches)])


def test_member_batches_give_each_member_its_block_and_zeros_elsewhere():
    torch.manual_seed(0)
    members = [create_model("small_cnn", embedding_size=6, width=4) for _ in range(3)]
    ensemble = EmbedderEnsemble(members, member_batches=True).train()
    x = torch.rand(12, 1, 28, 28)
    out = ensemble(x)
    assert out.shape == (12, 18)
    torch.manual_seed(1)
    for i, member in enumerate(members):
        expected = member(x[4 * i:4 * (i + 1)]) / 3 ** 0.5
        torch.testing.assert_close(out[4 * i:4 * (i + 1), 6 * i:6 * (i + 1)], expected)
        others = torch.ones(18, dtype=torch.bool)
        others[6 * i:6 * (i + 1)] = False
        assert torch.count_nonzero(out[4 * i:4 * (i + 1), others]) == 0
    ensemble.eval()
    torch.testing.assert_close(ensemble(x), torch.cat([m(x) for m in members], dim=1) / 3 ** 0.5)
    with pytest.raises(ValueError, match="3 equal blocks of rows in training mode. Got a batch of 10"):
        ensemble.train()(x[:10])


def test_each_members_loss_sees_its_block_with_its_own_labels():
    torch.manual_seed(0)
    maps = [torch.tensor([0, 1, -1, 2]), torch.tensor([-1, 0, 1, 2])]  # run labels 0..3; member 0 holds out 2
    losses = [ProxyAnchorLoss(num_classes=3, embedding_size=5) for _ in range(2)]
    objective = EnsembleObjective([TrainingObjective(loss) for loss in losses], [5, 5], member_labels=maps).double()
    blocks = torch.nn.functional.normalize(torch.randn(2, 6, 5, dtype=torch.float64), dim=2)
    labels = torch.tensor([0, 0, 1, 1, 3, 3, 1, 1, 2, 2, 3, 3])  # member 0's block, then member 1's
    ensemble = (torch.block_diag(blocks[0], blocks[1]) / 2 ** 0.5).requires_grad_()
    got = objective(ensemble, labels)
    own = [torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([0, 0, 1, 1, 2, 2])]  # mapped by hand
    expected = sum(loss.double()(block, lab) for loss, block, lab in zip(losses, blocks, own))
    torch.testing.assert_close(got, expected)
    got.backward()
    assert torch.count_nonzero(ensemble.grad[:6, 5:]) == 0 and torch.count_nonzero(ensemble.grad[6:, :5]) == 0
    assert not any("member_labels" in key for key in objective.state_dict())  # checkpoints keep their keys
    assert torch.equal(objective.member_labels_1, maps[1])  # a buffer: it follows the objective's device
    with pytest.raises(ValueError, match="1 label maps for 2 members"):
        EnsembleObjective([TrainingObjective(loss) for loss in losses], [5, 5], member_labels=maps[:1])


def reference_map_at_r(embeddings: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """AP@R of every query by its definition (Musgrave et al. Eq. 1), float64, one query at a time."""
    e = embeddings.double()
    aps = []
    for q in range(len(e)):
        r = int((labels == labels[q]).sum()) - 1
        sims = e @ e[q]
        sims[q] = -float("inf")
        order = torch.argsort(sims, descending=True)[:r]
        hits = (labels[order] == labels[q]).double()
        precision = torch.cumsum(hits, 0) / torch.arange(1, r + 1, dtype=torch.float64)
        aps.append(float((precision * hits).sum() / r))
    return aps


def test_validation_pools_every_members_queries_on_its_own_fold():
    splits = toy_splits()
    label_map = LabelMap(splits.before_holdout.labels)
    folds = apply_member_folds(splits, label_map, members=2, fraction=0.2, seed=0)
    torch.manual_seed(0)
    model = EmbedderEnsemble([create_model("small_cnn", embedding_size=4, width=2, in_chans=1) for _ in range(2)]).eval()

    def embed(module, dataset):
        x, y = dataset.get_batch(list(range(len(dataset))))
        with torch.no_grad():
            return module(x), y

    def score(e, y):
        from dmlkit.evaluation import retrieval_metrics
        from dmlkit.evaluation.retrieval import map_at_r_per_query

        return retrieval_metrics(e, y, ks=(1,)), map_at_r_per_query(e, y)

    metrics, per_query = score_member_folds(model, splits.val, folds, embed, score)
    expected = []
    for member, rows in zip(model.members, folds.val_rows):
        e, y = embed(member, splits.val.subset(rows, relabel=False))
        expected.append(reference_map_at_r(e, y))
    assert metrics["map_at_r"] == pytest.approx(sum(map(sum, expected)) / sum(map(len, expected)), abs=1e-6)
    for i, aps in enumerate(expected):
        assert metrics[f"map_at_r_member_{i}"] == pytest.approx(sum(aps) / len(aps), abs=1e-6)
    torch.testing.assert_close(per_query.double(), torch.tensor([a for aps in expected for a in aps],
                                                                dtype=torch.float64), atol=1e-6, rtol=0)


def test_member_folds_are_refused_without_validation_classes_or_with_too_many_members():
    for overrides, message in [
        (["protocol.member_folds=true", "protocol.fold=0"], "needs protocol.val_class_fraction > 0"),
        (["protocol.member_folds=true", "protocol.val_class_fraction=0"], "needs protocol.val_class_fraction > 0"),
        (["protocol.member_folds=true", "protocol.val_class_fraction=0.25", "model.ensemble=5"],
         "makes only 4 folds: raise the fraction or lower the ensemble"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(overrides=overrides)


def test_an_omniglot_ensemble_trains_each_member_on_its_own_fold_end_to_end(tmp_path, capsys):
    """The recipe turns member folds on for the glyph ensemble; every validation scores each member on its fold."""
    from dmlkit import load
    from dmlkit.recipe import Trainer, prepare_run

    cfg = load_config(overrides=[
        "data.name=omniglot", f"data.root={OMNIGLOT}", "data.label=character", "data.image_size=28",
        "model.ensemble=3", "model.name=small_cnn", "model.args={width: 4, in_chans: 1}", "model.shift_average=0",
        "train.max_steps=6", "train.eval_every=3", "train.progress=false", "sampler.batch_size=16",
    ])
    lines = []
    run = prepare_run(cfg, echo=lines.append)
    assert "protocol.member_folds = True" in "\n".join(lines)
    assert run.member_folds is not None and run.model.member_batches
    result = Trainer(run, tmp_path / "run", echo=lambda _line: None).fit()
    evals = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    vals = [r for r in evals if r.get("kind") == "eval" and r.get("split") == "val"]
    assert [r["step"] for r in vals] == [3, 6]
    assert all({"map_at_r_member_0", "map_at_r_member_1", "map_at_r_member_2"} <= set(r) for r in vals)
    assert len(run.splits.val) == sum(len(rows) for rows in run.member_folds.val_rows)  # each image scored once
    assert 0.0 < result.test_metrics["map_at_r"] <= 1.0
    model = load(tmp_path / "run")  # the saved ensemble embeds like any other
    assert isinstance(model, EmbedderEnsemble) and len(model.members) == 3
    from dmlkit.cli.main import main

    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), "--split", "val"]) == 2  # no split is held out from every member
    assert "each held out their own fold of the training classes" in capsys.readouterr().err


def test_a_plan_cut_to_one_member_turns_the_recipes_member_folds_off_and_says_so(monkeypatch):
    from dmlkit.recipe import glyph_plan, prepare_run

    class TickClock:  # every timed pass takes 0.2 s: no second member fits the budget
        now = 0.0

        def __call__(self) -> float:
            TickClock.now += 0.2
            return TickClock.now

    measure = glyph_plan.measure_glyph_costs
    monkeypatch.setattr(glyph_plan, "measure_glyph_costs",
                        lambda *args, **kwargs: measure(*args, **{**kwargs, "clock": TickClock()}))
    cfg = load_config(overrides=["data.name=omniglot", f"data.root={OMNIGLOT}", "data.label=character",
                                 "data.image_size=28", "train.progress=false"])
    lines = []
    run = prepare_run(cfg, echo=lines.append)
    printed = "\n".join(lines)
    assert "protocol.member_folds = True" in printed  # the recipe's ensemble of 5 ...
    assert run.cfg.model.ensemble == 1 and run.member_folds is None  # ... which the plan cut to one member
    assert "protocol.member_folds = False  (one model" in printed and run.cfg.protocol.member_folds is False


def test_member_folds_set_by_hand_for_a_users_own_model_are_refused():
    from dmlkit.recipe import prepare_run

    cfg = load_config(overrides=["data.name=omniglot", f"data.root={OMNIGLOT}", "data.label=character",
                                 "data.image_size=28", "protocol.member_folds=true", "model.ensemble=2"])
    model = create_model("small_cnn", embedding_size=8, width=4, in_chans=1)  # one model: nothing to fold
    with pytest.raises(ConfigError, match="protocol.member_folds=true needs an ensemble built from the config"):
        prepare_run(cfg, model=model, echo=lambda _line: None)


def test_a_resumed_member_fold_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path, crash_in_step):
    from dmlkit.engine.checkpoint_files import load_checkpoint
    from dmlkit.recipe import Trainer

    overrides = ["data.name=omniglot", f"data.root={OMNIGLOT}", "data.label=character", "data.image_size=28",
                 "model.ensemble=2", "model.name=small_cnn", "model.args={width: 4, in_chans: 1}",
                 "model.shift_average=0", "train.max_steps=5", "train.eval_every=5", "train.checkpoint_every=1",
                 "train.progress=false", "sampler.batch_size=16"]
    whole = Trainer(load_config(overrides=overrides), tmp_path / "whole", echo=lambda _: None)
    whole.fit()
    cut = Trainer(load_config(overrides=overrides), tmp_path / "cut", echo=lambda _: None)
    crash_in_step(cut, 4)
    with pytest.raises(KeyboardInterrupt):
        cut.fit()
    assert load_checkpoint(tmp_path / "cut" / "checkpoints" / "last.pt")["step"] == 3
    resumed = Trainer(load_config(path=tmp_path / "cut" / "config.yaml"), tmp_path / "cut", resume=True,
                      echo=lambda _: None)
    assert resumed.member_folds is not None and resumed.cfg.protocol.member_folds is True
    resumed.fit()
    trained = [load_checkpoint(run / "checkpoints" / "last.pt") for run in (tmp_path / "whole", tmp_path / "cut")]
    for part in ("model", "objective"):
        assert trained[0][part].keys() == trained[1][part].keys()
        for name in trained[0][part]:
            torch.testing.assert_close(trained[1][part][name], trained[0][part][name], rtol=0, atol=0, msg=name)
