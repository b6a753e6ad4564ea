"""Help stays fast: ``dmlkit --help`` and every ``dmlkit VERB --help`` import no torch (nor numpy, timm, faiss,
scikit-learn, scipy), so help prints in a fraction of a second (benchmarks/bench_cli_startup.py times it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dmlkit.cli.main import VERBS

SRC = str(Path(__file__).resolve().parents[3] / "src")
HEAVY = ("torch", "numpy", "timm", "faiss", "sklearn", "scipy", "PIL", "pandas", "pyarrow")

#: Run in a fresh interpreter: every help the command line has, then the heavy modules it imported.
PROBE = """
import contextlib, io, json, sys
from dmlkit.cli.main import VERBS, main
printed = {}
for argv in [["--help"], *[[verb, "--help"] for verb in VERBS]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as exc:
            assert exc.code == 0, (argv, exc.code)
    printed[" ".join(argv)] = out.getvalue()
print(json.dumps({"printed": printed, "heavy": [m for m in HEAVY if m in sys.modules]}))
"""


def test_help_of_dmlkit_and_of_every_verb_imports_no_torch():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)}
    code = f"HEAVY = {HEAVY!r}\n" + PROBE
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["heavy"] == [], f"help imported {result['heavy']}"
    assert all(verb in result["printed"]["--help"] for verb in VERBS)
    assert "--set KEY=VALUE" in result["printed"]["train --help"]  # the verbs' own options, not an empty parser
