# dmlkit developer entry points. `make train` and `make test` create the environment when missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dmlkit-installed
TORCH_PIN ?= torch==2.14.1 torchvision==0.29.1

.PHONY: env train test bench clean-env

env: $(STAMP)

$(STAMP): pyproject.toml setup.py src/dmlkit/evaluation/_knn_scan.c
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PIN)
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/dmlkit train $(ARGS)

test: $(STAMP)
	@bash scripts/install_chromium.sh
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15 $(ARGS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py $(ARGS)

clean-env:
	rm -rf $(VENV)
