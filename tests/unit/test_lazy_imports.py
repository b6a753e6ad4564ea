"""The command line and the training engine import no heavy module they do not use: torch.compile's stack
(``torch._dynamo``, ``torch._inductor``, sympy), FSDP, Optuna (``dmlkit sweep``), scikit-learn and SciPy load only
in the runs that need them; PyTorch's optimisers import ``torch._dynamo`` too unless ``dmlkit train`` defers it
(``engine/lazy_dynamo.py``, for runs that compile nothing)."""

import subprocess
import sys

HEAVY = ("torch._dynamo", "torch._inductor", "sympy", "torch.distributed.fsdp", "optuna", "sklearn", "scipy")

TRAIN_PATH = ("dmlkit.cli.main", "dmlkit.cli.train", "dmlkit.engine.resolve", "dmlkit.engine.trainer",
              "dmlkit.engine.training.step_capture", "dmlkit.engine.distributed", "dmlkit.losses",
              "dmlkit.evaluation", "dmlkit.memory.cross_batch")


def test_the_train_path_imports_no_heavy_module():
    code = (f"import importlib, sys\nfor name in {TRAIN_PATH!r}:\n    importlib.import_module(name)\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_command_line_parses_without_torch_compile_stack():
    code = ("import sys\nfrom dmlkit.cli.main import main\n"
            "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_train_dry_run_builds_and_steps_its_optimisers_without_torch_dynamo(tmp_path):
    """The MNIST default's plan times training steps with an AdamW before the run: PyTorch would import
    torch._dynamo there (engine/lazy_dynamo.py)."""
    code = ("import sys\nfrom dmlkit.cli.main import main\n"
            "assert main(['train', '--dry-run', '--set', 'train.num_threads=1']) == 0\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "train.max_steps" in out.stdout  # the plan ran
    assert out.stdout.strip().splitlines()[-1] == "[]"
