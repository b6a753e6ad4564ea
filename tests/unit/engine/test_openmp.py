"""The command line's OpenMP threads sleep while they wait (``OMP_WAIT_POLICY=PASSIVE``, set before torch loads);
a user's own setting stands, and the library alone never sets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[3] / "src")

#: In a fresh interpreter: the policy the command line leaves, and whether torch was loaded when it was set.
PROBE = """
import contextlib, io, os, sys
from dmlkit.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(["--version"])
    except SystemExit:
        pass
print(os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules)
"""


def _run(code: str, policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split("\n")[-2]


def test_the_command_line_sets_passive_waiting_before_torch_loads_and_a_users_setting_stands():
    assert _run(PROBE, None) == "PASSIVE False"  # set while torch was not loaded: OpenMP reads it when it loads
    assert _run(PROBE, "ACTIVE") == "ACTIVE False"


def test_wait_passively_says_whether_it_takes_effect_and_importing_dmlkit_sets_nothing():
    code = ("import os, dmlkit, dmlkit.engine.openmp as omp\n"
            "before = os.environ.get('OMP_WAIT_POLICY')\n"
            "import torch\n"
            "print(before, omp.wait_passively(), os.environ['OMP_WAIT_POLICY'])")
    assert _run(code, None) == "None False PASSIVE"  # torch already loaded: set for child processes only
    assert _run(code.replace("import torch\n", ""), "ACTIVE") == "ACTIVE False ACTIVE"
