"""Local weights files: safe loading, round trips and the missing/unexpected key report."""

import pickle
import warnings

import pytest
import torch

from dmlkit.exceptions import CheckpointError
from dmlkit.models import create_model, load_weights, read_state_dict


def _inputs():
    return torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("wrapper", [None, "state_dict", "model"])
def test_full_embedder_round_trip(tmp_path, wrapper):
    source = create_model("small_cnn", embedding_size=6).eval()
    state = source.state_dict()
    path = tmp_path / "embedder.pth"
    torch.save(state if wrapper is None else {wrapper: state, "epoch": 3}, path)
    loaded = create_model("small_cnn", embedding_size=6, weights=path).eval()
    report = loaded.weights_report
    assert report.complete and not report.unexpected_keys
    assert len(report.loaded_keys) == len(state)
    with torch.no_grad():
        torch.testing.assert_close(loaded(_inputs()), source(_inputs()), rtol=0, atol=0)


def test_trunk_only_weights_leave_head_alone_and_report_extras(tmp_path):
    source = create_model("small_cnn", embedding_size=6)
    trunk_state = dict(source.trunk.state_dict())
    trunk_state["fc.weight"] = torch.zeros(10, 64)  # a classifier the embedder does not have
    path = tmp_path / "backbone.pth"
    torch.save(trunk_state, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing missing -> no warning
        loaded = create_model("small_cnn", embedding_size=6, weights=str(path))
    report = loaded.weights_report
    assert report.unexpected_keys == ["fc.weight"] and report.missing_keys == []
    for key, value in source.trunk.state_dict().items():
        assert torch.equal(loaded.trunk.state_dict()[key], value)
    assert "1 unexpected" in str(report) and "fc.weight" in str(report)


def test_missing_keys_warn_and_are_listed(tmp_path):
    state = dict(create_model("small_cnn").trunk.state_dict())
    dropped = [k for k in state if k.startswith("blocks.2.")]
    for key in dropped:
        del state[key]
    path = tmp_path / "partial.pth"
    torch.save(state, path)
    with pytest.warns(UserWarning, match=r"missing \(kept their initial values\): blocks\.2\.conv\.weight"):
        model = create_model("small_cnn", weights=path)
    assert sorted(model.weights_report.missing_keys) == sorted(dropped)
    assert not model.weights_report.complete
    with pytest.raises(CheckpointError, match="6 missing"):
        load_weights(model.trunk, path, strict=True)


def test_data_parallel_prefix_is_stripped(tmp_path):
    state = create_model("small_cnn").state_dict()
    path = tmp_path / "dp.pth"
    torch.save({f"module.{k}": v for k, v in state.items()}, path)
    assert set(read_state_dict(path)) == set(state)


def test_shape_mismatch_names_the_tensor(tmp_path):
    path = tmp_path / "wide.pth"
    torch.save(create_model("small_cnn", width=8).trunk.state_dict(), path)
    with pytest.raises(CheckpointError, match=r"blocks\.0\.conv\.weight: file \(8, 1, 3, 3\) vs model \(16, 1, 3, 3\)"):
        create_model("small_cnn", weights=path)


def test_unrelated_file_is_an_error(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"encoder.layer.weight": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError, match="None of the 1 tensors"):
        create_model("small_cnn", weights=path)


def test_invalid_files_name_the_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="notes.txt.*not a valid PyTorch checkpoint"):
        create_model("small_cnn", weights=text)
    with pytest.raises(CheckpointError, match="does not exist"):
        create_model("small_cnn", weights=tmp_path / "missing.pth")
    nested = tmp_path / "nested.pth"
    torch.save({"epoch": 1, "config": {"lr": 0.1}}, nested)
    with pytest.raises(CheckpointError, match="nested.pth.*does not hold a state_dict"):
        read_state_dict(nested)


class _Payload:
    def __reduce__(self):
        return (print, ("arbitrary code ran",))


def test_pickled_objects_are_refused_by_weights_only(tmp_path, capsys):
    path = tmp_path / "evil.pth"
    with open(path, "wb") as handle:
        pickle.dump({"conv.weight": _Payload()}, handle, protocol=2)
    with pytest.raises(CheckpointError, match="weights_only=True"):
        read_state_dict(path)
    assert "arbitrary code ran" not in capsys.readouterr().out


def test_pretrained_with_file_is_allowed_for_any_backbone(tmp_path):
    path = tmp_path / "bn.pth"
    model = create_model("eps_mnist_net")
    torch.save(model.trunk.state_dict(), path)
    loaded = create_model("eps_mnist_net", pretrained=True, weights=path)
    assert loaded.weights_report.complete
