"""GeM pooling, the identity-initialised head and the fp32 head under autocast."""

from __future__ import annotations

import pytest
import torch

from dmlkit.models import create_model
from dmlkit.models.embedder import GlobalPool, make_linear_head


def test_gem_pooling_matches_the_generalised_mean_in_float64():
    x = torch.rand(2, 5, 3, 4, dtype=torch.float64) * 3
    got = GlobalPool("gem")(x)
    for b in range(2):
        for c in range(5):
            values = [max(float(v), 1e-6) for v in x[b, c].flatten()]
            want = (sum(v ** 3 for v in values) / len(values)) ** (1 / 3)
            assert float(got[b, c]) == pytest.approx(want, rel=1e-12)
    assert torch.autograd.gradcheck(lambda t: GlobalPool("gem")(t), (x[:1, :2].clone().requires_grad_(),))


def test_identity_head_keeps_the_features_and_refuses_a_projection():
    head = make_linear_head(6, 6, "identity")
    x = torch.randn(3, 6)
    assert torch.equal(head(x), x)
    with pytest.raises(ValueError, match="needs embedding_size == the backbone's 6 features"):
        make_linear_head(6, 4, "identity")


def test_untrained_pretrained_embedding_is_the_normalised_pooled_feature():
    torch.manual_seed(0)
    model = create_model("efficientnet_lite0", pretrained=True, embedding_size=None, head_init="identity",
                         pooling="gem", freeze_bn=True).eval()
    assert model.embedding_size == 1280
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        pooled = model.features(x)
        assert torch.allclose(model(x), torch.nn.functional.normalize(pooled), atol=1e-6)


def test_head_and_pooling_run_in_fp32_under_autocast():
    torch.manual_seed(0)
    model = create_model("small_cnn", embedding_size=16, in_chans=1).eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        trunk = model.trunk(x)
        out = model(x)
    assert trunk.dtype == torch.bfloat16 and out.dtype == torch.float32
    with torch.no_grad():
        want = torch.nn.functional.normalize(model.head(model.pool(trunk.float())))
    assert torch.allclose(out, want, atol=1e-6)  # only the trunk saw bf16


def test_flip_average_is_the_normalised_sum_over_the_image_and_its_mirror():
    torch.manual_seed(0)
    model = create_model("small_cnn", embedding_size=8, in_chans=3, flip_average=True).double().eval()
    x = torch.randn(3, 3, 20, 20, dtype=torch.float64)
    with torch.no_grad():
        plain = [model._embed(x[i:i + 1])[0] for i in range(3)]
        mirror = [model._embed(x[i:i + 1].flip(-1))[0] for i in range(3)]
        want = torch.stack([torch.nn.functional.normalize(a + b, dim=0) for a, b in zip(plain, mirror)])
        assert torch.allclose(model(x), want, atol=1e-10)
        assert torch.allclose(model(x), model(x.flip(-1)), atol=1e-10)  # mirror-invariant
    model.train()
    assert torch.allclose(model(x), model._embed(x))  # training sees one view
