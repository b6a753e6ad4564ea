"""Suite-wide settings: one torch thread per test process (the suite runs on 2 cores with 2 xdist
workers), inherited by the CLI subprocesses the integration tests start.

OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE``): a test or preset that asks for 2 threads
while the other worker computes puts 3 threads on 2 cores, and spinning OpenMP threads then wait a
scheduler slice at every parallel region (a 2-step cpu-* preset run: 41 s spinning, 2 s passive, on
the loaded machine). And a test that sets the thread count (``train.num_threads`` runs in-process)
gets it restored afterwards, so it does not leak into the worker's later tests. Restoring is not the
whole cure: a process that once trained on 2 threads stays slower on 1 (test_folder_train after
test_export's 2-thread run: 30 s CPU, 5 s alone), so in-process training in tests asks for one thread.

``DMLKIT_TEST_DEVICE`` (default ``cpu``; ``cuda`` on a GPU machine, as ``scripts/gpu_check.sh`` sets it)
is the device of the device tests: the ``test_device`` fixture, and ``train.device`` of the engine
tests' ``tiny_config``. A device torch cannot use stops the session before any test runs.

Nothing in the suite downloads: ``HF_HUB_OFFLINE=1`` (honoured by huggingface_hub and by
dmlkit.models.hub for every download) is set for the whole run and its subprocesses; the download
tests lift it for a server on 127.0.0.1 they start themselves (tests/unit/models/test_hub.py).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read by libgomp when torch loads
os.environ["HF_HUB_OFFLINE"] = "1"  # no test reaches the internet for weights

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

TEST_DEVICE_VARIABLE = "DMLKIT_TEST_DEVICE"


def configured_test_device() -> torch.device:
    """The device named by ``DMLKIT_TEST_DEVICE`` (default ``cpu``), checked to be usable here."""
    name = os.environ.get(TEST_DEVICE_VARIABLE, "cpu")
    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:
        raise pytest.UsageError(f"{TEST_DEVICE_VARIABLE}={name!r} is not a device torch can use here: {err}") from err
    return device


def pytest_configure(config):
    config.dmlkit_test_device = configured_test_device()


@pytest.fixture(scope="session")
def test_device(pytestconfig) -> torch.device:
    """Where the device tests put their tensors: ``DMLKIT_TEST_DEVICE`` (default ``cpu``)."""
    return pytestconfig.dmlkit_test_device


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """The worker's torch thread count after each test is the one before it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """``fill(name, tag)``: a Hugging Face cache under tmp_path (HF_HOME, offline) holding timm model ``name``'s
    weights (seeded, classifier included) as timm's Hub repository ``timm/<tag>`` keeps them; returns
    ``(state_dict, path of model.safetensors)``."""
    from safetensors.torch import save_file

    root = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)

    def fill(name: str = "test_resnet", tag: str = "test_resnet.r160_in1k", revision: str = "0" * 40):
        import timm

        torch.manual_seed(1)
        state = timm.create_model(name, pretrained=False).state_dict()
        repo = root / "hub" / f"models--timm--{tag}"
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
        path = snapshot / "model.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        return state, path

    return fill
