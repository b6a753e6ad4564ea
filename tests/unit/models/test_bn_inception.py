"""BN-Inception: layer names of the converted Caffe model, widths, one small forward pass."""

import torch

from dmlkit.models import BNInception, create_model
from dmlkit.models.bn_inception import SPECS


def test_parameter_names_match_the_converted_caffe_model():
    keys = set(BNInception().state_dict())
    for key in [
        "conv1_7x7_s2.weight",
        "conv1_7x7_s2_bn.running_mean",
        "conv2_3x3_reduce.bias",
        "inception_3a_pool_proj_bn.weight",
        "inception_3c_double_3x3_2.weight",
        "inception_4e_3x3_bn.running_var",
        "inception_5b_pool_proj.weight",
    ]:
        assert key in keys
    assert "inception_3c_1x1.weight" not in keys and "inception_3c_pool_proj.weight" not in keys


def test_block_widths_chain_to_1024():
    # each block's input is the previous block's output; Ioffe & Szegedy Table 1 as converted
    widths = [spec.out_channels for spec in SPECS]
    assert widths == [256, 320, 576, 576, 576, 608, 608, 1056, 1024, 1024]
    assert all(SPECS[i + 1].in_channels == widths[i] for i in range(len(SPECS) - 1))


def test_trunk_weights_file_as_distributed_loads(tmp_path):
    # (the forward pass on one small image is in test_model_registry)
    trunk = BNInception()
    # a classifier file as distributed (with last_linear) loads into the trunk; last_linear is reported
    state = dict(trunk.state_dict())
    state["last_linear.weight"] = torch.zeros(1000, 1024)
    state["last_linear.bias"] = torch.zeros(1000)
    path = tmp_path / "bn_inception_imagenet.pth"
    torch.save(state, path)
    model = create_model("bn_inception", pretrained=True, weights=path, embedding_size=16)
    assert model.weights_report.complete
    assert model.weights_report.unexpected_keys == ["last_linear.weight", "last_linear.bias"]
    assert torch.equal(model.trunk.inception_5b_3x3.weight, trunk.inception_5b_3x3.weight)


#: Ioffe & Szegedy (2015), Fig. 5 as in the converted Caffe model: block name and its pooling branch
#: ("grid": stride-2 reduction with a pass-through max pool; otherwise the pool before the 1x1 projection).
PAPER_BLOCKS = [("3a", "avg"), ("3b", "avg"), ("3c", "grid"), ("4a", "avg"), ("4b", "avg"), ("4c", "avg"),
                ("4d", "avg"), ("4e", "grid"), ("5a", "avg"), ("5b", "max")]


def reference_forward(w: dict, x: torch.Tensor) -> torch.Tensor:
    """The trunk in float64 from its weights alone: conv -> eval batch norm -> ReLU units, blocks concatenated
    as [1x1, 3x3, double 3x3, pool] (written from the paper's description, not from BNInception)."""
    import torch.nn.functional as F

    def unit(name, x, stride=1):
        weight = w[f"{name}.weight"]
        y = F.conv2d(x, weight, w[f"{name}.bias"], stride=stride, padding=weight.shape[-1] // 2)
        bn = lambda k: w[f"{name}_bn.{k}"].view(1, -1, 1, 1)  # noqa: E731
        return torch.relu((y - bn("running_mean")) / torch.sqrt(bn("running_var") + 1e-5) * bn("weight") + bn("bias"))

    x = F.max_pool2d(unit("conv1_7x7_s2", x, 2), 3, 2, ceil_mode=True)
    x = F.max_pool2d(unit("conv2_3x3", unit("conv2_3x3_reduce", x)), 3, 2, ceil_mode=True)
    for name, pool in PAPER_BLOCKS:
        p, stride = f"inception_{name}", 2 if pool == "grid" else 1
        parts = [] if pool == "grid" else [unit(f"{p}_1x1", x)]
        parts.append(unit(f"{p}_3x3", unit(f"{p}_3x3_reduce", x), stride))
        parts.append(unit(f"{p}_double_3x3_2", unit(f"{p}_double_3x3_1", unit(f"{p}_double_3x3_reduce", x)), stride))
        if pool == "grid":
            parts.append(F.max_pool2d(x, 3, 2, ceil_mode=True))
        elif pool == "avg":
            parts.append(unit(f"{p}_pool_proj", F.avg_pool2d(x, 3, 1, 1, ceil_mode=True, count_include_pad=True)))
        else:
            parts.append(unit(f"{p}_pool_proj", F.max_pool2d(x, 3, 1, 1, ceil_mode=True)))
        x = torch.cat(parts, dim=1)
    return x


def test_forward_matches_a_float64_reference_written_from_the_paper():
    torch.manual_seed(0)
    trunk = BNInception().double().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics, so a misplaced or missing BN shows
        for module in trunk.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.1, 0.1)
        x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
        out = trunk(x)
        expected = reference_forward(trunk.state_dict(), x)
    assert out.shape == (2, 1024, 2, 2) == expected.shape
    assert torch.allclose(out, expected, rtol=1e-9, atol=1e-9)
    assert float(expected.abs().max()) > 0  # the ReLUs did not zero everything
