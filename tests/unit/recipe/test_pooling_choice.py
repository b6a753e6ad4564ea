"""Pooling and the mirror average chosen on the validation classes with the untrained backbone:
plain average pooling without the mirror stands unless another configuration beats it by more than a
class-level standard error."""

from __future__ import annotations

import pytest
import torch

from dmlkit.evaluation.retrieval import paired_gain
from dmlkit.models import create_model
from dmlkit.recipe.pooling_choice import (
    PLAIN,
    PooledViews,
    apply_to_model,
    choose_pooling,
    class_paired_gain,
    embeddings_by_configuration,
)

# ----------------------------------------------------------------------------- the class-level error


def test_the_class_level_error_is_the_spread_of_the_per_class_mean_differences_float64():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(5).repeat_interleave(7)
    base = torch.rand(35, generator=g, dtype=torch.float64)
    ap = base + torch.randn(35, generator=g, dtype=torch.float64) * 0.05 + labels.double() * 0.01
    ap[3] = float("nan")  # a query without a true reference is left out
    gain, error = class_paired_gain(ap, base, labels)
    keep = ~ap.isnan()
    diffs = [float((ap - base)[keep & (labels == c)].mean()) for c in range(5)]
    mean = sum(diffs) / 5
    reference = (sum((d - mean) ** 2 for d in diffs) / 4) ** 0.5 / 5 ** 0.5
    assert gain == pytest.approx(float((ap - base)[keep].mean()), abs=1e-12)
    assert error == pytest.approx(max(reference, paired_gain(ap, base)[1]), rel=1e-9)


def test_queries_of_a_class_moving_together_widen_the_error_beyond_the_per_query_one():
    labels = torch.arange(6).repeat_interleave(80)
    base = torch.linspace(0.3, 0.9, 480, dtype=torch.float64)
    by_class = torch.tensor([0.03, 0.02, 0.025, -0.01, 0.015, -0.005], dtype=torch.float64)
    ap = base + by_class[labels]  # every query of a class gains (or loses) the same
    per_query_gain, per_query_error = paired_gain(ap, base)
    gain, error = class_paired_gain(ap, base, labels)
    assert gain == pytest.approx(per_query_gain) and per_query_gain > 2 * per_query_error  # "significant" per query
    assert gain < error * 2 and error > 3 * per_query_error  # over 6 classes it is not


# ----------------------------------------------------------------------------- the rule


def configs(base: torch.Tensor, shifts: dict) -> dict:
    return {config: base + shift for config, shift in shifts.items()}


def test_plain_average_pooling_stands_when_nothing_beats_it_significantly():
    labels = torch.arange(6).repeat_interleave(80)
    base = torch.linspace(0.3, 0.9, 480, dtype=torch.float64)
    by_class = torch.tensor([0.05, 0.03, 0.04, -0.04, 0.02, -0.03], dtype=torch.float64)[labels]
    wobble = torch.randn(480, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 0.02
    per_query = configs(base, {("avg", False): 0.0, ("avg", True): wobble - wobble.mean(), ("gem", True): by_class})
    chosen, reason = choose_pooling(per_query, labels)
    assert chosen == PLAIN and reason.startswith("avg: no other pooling or mirror beat")
    # the per-query error alone would have taken GeM + mirror (the 84-px development set's trap)
    assert choose_pooling(per_query)[0] == ("gem", True)


def test_a_significantly_better_pooling_wins_and_the_mirror_goes_when_it_adds_noise_only():
    labels = torch.arange(6).repeat_interleave(40)
    g = torch.Generator().manual_seed(3)
    base = torch.rand(240, generator=g, dtype=torch.float64) * 0.5
    noise = torch.randn(240, generator=g, dtype=torch.float64) * 0.01
    per_query = configs(base, {("avg", False): 0.0, ("gem", False): 0.05, ("gem", True): 0.0503 + noise - noise.mean(),
                               ("max", False): -0.05})
    chosen, reason = choose_pooling(per_query, labels)
    assert chosen == ("gem", False)
    assert "the mirror average adds only" in reason and "over avg" in reason


def test_the_mirror_stays_when_dropping_it_loses_more_than_a_standard_error():
    labels = torch.arange(6).repeat_interleave(40)
    base = torch.linspace(0.1, 0.6, 240, dtype=torch.float64)
    per_query = configs(base, {("avg", False): 0.0, ("gem", False): 0.03, ("gem", True): 0.06})
    chosen, reason = choose_pooling(per_query, labels)
    assert chosen == ("gem", True) and reason.startswith("gem + mirror: validation MAP@R")


def test_without_the_plain_configuration_the_first_listed_is_the_reference():
    base = torch.linspace(0.1, 0.6, 60, dtype=torch.float64)
    chosen, _ = choose_pooling({("gem", True): base, ("gem", False): base - 0.0})
    assert chosen == ("gem", True)
    with pytest.raises(ValueError):
        choose_pooling({})


# ----------------------------------------------------------------------------- one trunk pass, every configuration


@pytest.fixture(scope="module")
def embedder():
    torch.manual_seed(0)
    return create_model("efficientnet_lite0", pretrained=False, embedding_size=None, pooling="gem",
                        head_init="identity", freeze_bn=True, flip_average=True).eval()


@pytest.mark.parametrize("config", [("avg", False), ("avg", True), ("gem", False), ("gem", True), ("max", True),
                                    ("avg+max", False)])
def test_each_configuration_from_one_trunk_pass_equals_the_embedder_set_to_it(embedder, config):
    x = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    poolings = ("avg", "gem", "max", "avg+max")
    with torch.no_grad():
        pooled = PooledViews(embedder.trunk, poolings)(x)
    assert pooled.shape == (3, 2 * len(poolings) * 1280)
    got = embeddings_by_configuration(embedder, pooled, poolings, (False, True))[config]
    model = create_model("efficientnet_lite0", pretrained=False, embedding_size=None, pooling="gem",
                         head_init="identity", freeze_bn=True, flip_average=True)
    model.load_state_dict(embedder.state_dict())
    apply_to_model(model, config)
    with torch.no_grad():
        want = model.eval()(x)
    assert model.pool.pooling == config[0] and model.flip_average == config[1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_pooled_views_beside_the_card_meet_the_head_on_its_device():
    """``embed_dataset`` hands the pooled views back on the CPU while the model's head sits on the card:
    each view goes to the head's device and the embeddings come back where the views were."""
    from types import SimpleNamespace

    from ..device_emulation import DeviceEmulator

    torch.manual_seed(0)
    model = SimpleNamespace(head=torch.nn.Linear(4, 3), normalization="l2")
    pooled = torch.randn(5, 2 * 2 * 4, generator=torch.Generator().manual_seed(2))
    want = embeddings_by_configuration(model, pooled, ("avg", "gem"), (False, True))
    with DeviceEmulator() as emu:
        away = emu.away(pooled)
        got = embeddings_by_configuration(model, away, ("avg", "gem"), (False, True))
        assert all(emu.is_away(t) for t in got.values())
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
