"""Shift-averaged embeddings, the embedder ensemble, its objective, and SmallCNN's downsampling by input size."""

from __future__ import annotations

import pytest
import torch

from dmlkit.config import load_config
from dmlkit.engine.model import build_model
from dmlkit.engine.objective import EnsembleObjective, TrainingObjective, build_objective
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import ProxyAnchorLoss
from dmlkit.models import EmbedderEnsemble, create_model
from dmlkit.models.ensemble import split_embeddings


def shifted(x: torch.Tensor, dy: int, dx: int, r: int) -> torch.Tensor:
    """``x`` moved by (dy, dx) pixels, border pixels repeated: a loop-free reference built by indexing."""
    h, w = x.shape[-2:]
    rows = (torch.arange(h) + dy).clamp(0, h - 1)
    cols = (torch.arange(w) + dx).clamp(0, w - 1)
    return x[:, :, rows][:, :, :, cols]


def test_shift_average_is_the_normalised_mean_over_every_offset():
    torch.manual_seed(0)
    model = create_model("small_cnn", embedding_size=8, width=4, shift_average=2).double().eval()
    x = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    with torch.no_grad():
        got = model(x)
        model.shift_average = 0
        views = [model(shifted(x, dy, dx, 2)) for dy in range(-2, 3) for dx in range(-2, 3)]
    mean = torch.stack(views).mean(dim=0)
    torch.testing.assert_close(got, mean / mean.norm(dim=1, keepdim=True), rtol=1e-12, atol=1e-12)
    assert torch.allclose(got.norm(dim=1), torch.ones(3, dtype=torch.float64))


def test_shift_average_leaves_training_mode_alone_and_is_validated():
    torch.manual_seed(0)
    plain = create_model("small_cnn", embedding_size=8, width=4)
    averaged = create_model("small_cnn", embedding_size=8, width=4, shift_average=1)
    averaged.load_state_dict(plain.state_dict())
    x = torch.rand(4, 1, 28, 28)
    torch.testing.assert_close(averaged.train()(x), plain.train()(x))
    assert not torch.allclose(averaged.eval()(x), plain.eval()(x))
    with pytest.raises(InvalidParameterError, match=r"The 'shift_average' parameter of Embedder must be an int >= 0. Got -1 instead."):
        create_model("small_cnn", shift_average=-1)


def test_ensemble_concatenates_unit_members_into_a_unit_embedding():
    torch.manual_seed(0)
    members = [create_model("small_cnn", embedding_size=6, width=4) for _ in range(3)]
    ensemble = EmbedderEnsemble(members).eval()
    x = torch.rand(5, 1, 28, 28)
    out = ensemble(x)
    assert out.shape == (5, 18) and ensemble.embedding_size == 18
    torch.testing.assert_close(out.norm(dim=1), torch.ones(5))
    parts = split_embeddings(out, ensemble.member_sizes)
    for part, member in zip(parts, members):
        torch.testing.assert_close(part, member(x))
    with pytest.raises(ValueError, match="at least 2 members"):
        EmbedderEnsemble(members[:1])


def test_ensemble_objective_is_the_sum_of_each_members_own_loss():
    torch.manual_seed(0)
    losses = [ProxyAnchorLoss(num_classes=4, embedding_size=6) for _ in range(2)]
    objective = EnsembleObjective([TrainingObjective(loss) for loss in losses], [6, 6])
    members = torch.nn.functional.normalize(torch.randn(2, 10, 6, dtype=torch.float64), dim=2)
    labels = torch.arange(10) % 4
    ensemble = (torch.cat(list(members), dim=1) / 2**0.5).requires_grad_()
    objective.double()
    got = objective(ensemble, labels)
    expected = sum(loss.double()(member, labels) for loss, member in zip(losses, members))
    torch.testing.assert_close(got, expected)
    got.backward()
    # each member's columns get exactly its own loss's gradient (times the split's sqrt(2))
    for i, loss in enumerate(losses):
        member = members[i].clone().requires_grad_()
        loss(member, labels).backward()
        torch.testing.assert_close(ensemble.grad[:, 6 * i:6 * (i + 1)], member.grad * 2**0.5)
    with pytest.raises(ValueError, match="2 objectives for 3 members"):
        EnsembleObjective([TrainingObjective(loss) for loss in losses], [6, 6, 6])


def test_build_model_ensemble_first_member_is_the_single_model_and_the_rest_differ():
    single_cfg = load_config(overrides=["model.args.width=4", "model.embedding_size=8"])
    ensemble_cfg = load_config(overrides=["model.args.width=4", "model.embedding_size=8", "model.ensemble=3",
                                          "model.shift_average=2"])
    torch.manual_seed(7)
    single = build_model(single_cfg)
    after_single = torch.rand(1)
    torch.manual_seed(7)
    ensemble = build_model(ensemble_cfg)
    after_ensemble = torch.rand(1)
    assert isinstance(ensemble, EmbedderEnsemble) and len(ensemble.members) == 3
    for key, value in single.state_dict().items():
        torch.testing.assert_close(ensemble.members[0].state_dict()[key], value)
    first = ensemble.members[0].head.weight
    assert not torch.allclose(first, ensemble.members[1].head.weight)
    assert not torch.allclose(ensemble.members[1].head.weight, ensemble.members[2].head.weight)
    assert all(m.shift_average == 2 for m in ensemble.members)
    torch.testing.assert_close(after_single, after_ensemble)  # later draws (the loss's proxies) do not move
    objective = build_objective(ensemble_cfg, num_classes=5)
    assert isinstance(objective, EnsembleObjective) and len(objective.objectives) == 3


@pytest.mark.parametrize("side, downsample, pooled, out_side", [
    (28, "auto", True, 3), (8, "auto", False, 1), (28, "stride", False, 4), (8, "max", True, 1),
])
def test_small_cnn_downsamples_by_pooling_or_striding_with_the_same_weights(side, downsample, pooled, out_side):
    from dmlkit.models import SmallCNN

    torch.manual_seed(0)
    net = SmallCNN(width=4, downsample=downsample)
    assert net.pools(side) is pooled
    assert net(torch.rand(2, 1, side, side)).shape == (2, 16, out_side, out_side)
    other = SmallCNN(width=4, downsample="stride" if pooled else "max")
    assert set(other.state_dict()) == set(net.state_dict())  # one set of weights serves both
    with pytest.raises(ValueError, match="'downsample' parameter of SmallCNN must be one of"):
        SmallCNN(downsample="avg")
