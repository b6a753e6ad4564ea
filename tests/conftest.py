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
tests lift it for the ``loopback`` server on 127.0.0.1 below (tests/unit/models/test_hub.py, and
the data set downloads of tests/unit/data).
"""

import http.server
import os
import threading

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read by libgomp when torch loads
os.environ["HF_HUB_OFFLINE"] = "1"  # no test reaches the internet for weights
os.environ["DMLKIT_PLAN_STORE"] = "off"  # no test replays another's kept measurements (tests of keeping set their own)
os.environ["DMLKIT_COST_STORE"] = "off"  # nor reads another run's kept least costs (tests of them set their own)

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


#: The test files in the order ``make test`` (``-n 2 --dist loadfile --no-loadscope-reorder``: a file runs whole
#: on one worker, so a module-scoped training run is built once, and the files are dealt out in collection
#: order, not re-sorted by their number of tests) deals them out first; the rest follow in collection order.
#: The two slowest single tests first, each at the start of its worker (the default job, about 90 s; kill
#: and resume), then the files longest first, so that the short files fill in at the end instead of one long
#: file dealt out last setting the wall time. Seconds of each file in ``--durations`` of the whole suite on the
#: loaded 2-core machine (2026-11-27): 103, 78, then 298, 227, 193, 142, 90, 85, 84, 57, 54, 54, 47, 41, 34.
LONG_FIRST = (
    "tests/integration/test_doc_examples.py",
    "tests/integration/test_reproduce_claims.py",
    "tests/integration/test_export.py",
    "tests/integration/test_photo_train.py",
    "tests/integration/test_cluster_embed.py",
    "tests/integration/test_report_layout_browser.py",
    "tests/integration/test_index_cli.py",
    "tests/reliability/test_user_mistakes.py",
    "tests/unit/engine/test_trainer_feature_cache.py",
    "tests/integration/test_train_cli.py",
    "tests/reliability/test_kill_resume.py",
    "tests/integration/test_python_api.py",
    "tests/integration/test_pretrained_weights_cli.py",
    "tests/reliability/test_bad_inputs.py",
    "tests/integration/test_presets.py",
    "tests/unit/engine/test_budget_trainer.py",
    "tests/unit/recipe/test_view_size.py",
    "tests/integration/test_kept_plans.py",
    "tests/unit/report/test_report_page.py",
    "tests/integration/test_embed_cli.py",
    "tests/unit/engine/test_trainer_numerics.py",
    "tests/unit/evaluation/test_knn.py",
    "tests/unit/test_gpu_check_script.py",
)


def _long_rank(item: pytest.Item) -> int:
    """The position of the item's file in :data:`LONG_FIRST`; ``len(LONG_FIRST)`` for every other file."""
    path = item.nodeid.split("::", 1)[0]
    return LONG_FIRST.index(path) if path in LONG_FIRST else len(LONG_FIRST)


def pytest_collection_modifyitems(config, items):
    """The files of :data:`LONG_FIRST` first, in its order (whole files, in collection order inside each)."""
    items.sort(key=_long_rank)  # stable: every other file keeps its place


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


class LoopbackFiles:
    """Files served over HTTP on 127.0.0.1 by a thread: ``Range: bytes=N-`` answered with 206.

    ``files[path] = bytes`` publishes a file; ``drop_after[path] = n`` makes the next request for it
    announce the full length, send ``n`` bytes and close the connection (a cut transfer), once.
    ``ignore_range`` holds paths whose server ignores ``Range``; ``requests`` records
    ``(path, range_header)`` of every request. A hostile or unlucky server: ``headers[path]`` replaces
    response headers (a value of None leaves the header out, e.g. ``Content-Length``), ``redirects[path]``
    answers 302 with that ``Location``.
    """

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.drop_after: dict[str, int] = {}
        self.ignore_range: set[str] = set()  # paths answered in full (200) whatever Range asks
        self.requests: list[tuple[str, str | None]] = []
        self.headers: dict[str, dict[str, str | None]] = {}
        self.redirects: dict[str, str] = {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output quiet
                pass

            def do_GET(self):
                owner.requests.append((self.path, self.headers.get("Range")))
                if self.path in owner.redirects:
                    self.send_response(302)
                    self.send_header("Location", owner.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = owner.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                wanted = self.headers.get("Range")
                if wanted and self.path not in owner.ignore_range and wanted.startswith("bytes=") and wanted.endswith("-"):
                    start = int(wanted[len("bytes="):-1])
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                headers = {"Content-Length": str(len(body)), "Accept-Ranges": "bytes",
                           **owner.headers.get(self.path, {})}
                for key, value in headers.items():
                    if value is not None:
                        self.send_header(key, value)
                self.end_headers()
                cut = owner.drop_after.pop(self.path, None)
                self.wfile.write(body if cut is None else body[:cut])
                if cut is not None:
                    self.wfile.flush()
                    self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def loopback():
    """A :class:`LoopbackFiles` server for the test (the data set downloads of tests/unit/data, the weight
    downloads of tests/unit/models/test_hub.py); shut down afterwards."""
    server = LoopbackFiles()
    yield server
    server.close()
