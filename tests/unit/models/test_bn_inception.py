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
