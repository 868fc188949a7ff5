# Set-up is automatic: `make run` and `make test` create the environment when it is missing.
# The interpreter's real path: uv recreates .venv whenever the path it is given (a pyenv shim, say) differs
# from the one .venv was built with, which made every `make run`/`make test` rebuild it (~45 s).
PYTHON ?= $(shell p=$$(command -v python3.11 || command -v python3) && $$p -c 'import sys; print(sys.executable)')
# The extras the application installs: every integration and the examples (not gpu, which pulls in CUDA).
EXTRAS := --extra airflow --extra celery --extra kubernetes --extra vertex --extra aws --extra examples
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
export UV_PYTHON_DOWNLOADS := never
export TF_CPP_MIN_LOG_LEVEL := 2
# `make run` keeps its state (artifacts, run records, the local Airflow) in the checkout, not in ~/.local/share.
export HPML_HOME ?= $(CURDIR)/.hpml

.PHONY: env browser postgres hosts-deps typecheck cluster cluster-down run test test-tfx tfx-requirements bench bench-input bench-e2e bench-scale bench-step bench-hosts bench-s3 clean

# uv itself comes from PyPI: into a private venv, or with pip --target where venv is missing.
$(UV):
	@$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 13), "hpml needs Python 3.11 to 3.13, found " + sys.version' 
	@( $(PYTHON) -m venv $(TOOLS) && $(TOOLS)/bin/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION) ) \
	  || ( rm -rf $(TOOLS) && $(PYTHON) -m pip install -q --disable-pip-version-check --target $(TOOLS)/lib uv==$(UV_VERSION) \
	       && mkdir -p $(TOOLS)/bin && ln -sf ../lib/bin/uv $(UV) ) \
	  || { echo "error: could not install uv; on Debian run: apt-get install python3-venv" >&2; exit 1; }

# Installs exactly what uv.lock pins (the dev group with pytest included), compiled to bytecode once:
# where PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile TensorFlow's sources
# again (measured: 16-20 s instead of 5.5-7 s to import it; later syncs only check the .pyc files, ~1 s).
env: $(UV)
	@$(UV) sync --frozen --python $(PYTHON) $(EXTRAS) --quiet --compile-bytecode

run: env
	$(VENV)/bin/hpml run penguin --engine airflow

# The browser test drives Debian's chromium (never a downloaded browser); install it when missing.
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@test -x $(CHROMIUM) || { echo "installing Debian's chromium for the browser test"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# The deployment test starts Debian's PostgreSQL in a folder of its own (never a downloaded one); install it when
# missing.
POSTGRES := $(firstword $(wildcard /usr/lib/postgresql/*/bin/pg_ctl))
postgres:
	@test -n "$(POSTGRES)" || { echo "installing Debian's postgresql for the deployment test"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; }

# The multi-host tests run Debian's Slurm (controller, nodes, munge) and Redis (Celery's broker) on test hosts
# (network namespaces); install them when missing.
hosts-deps:
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
	  && command -v redis-server >/dev/null || { \
	  echo "installing Debian's slurm-wlm, munge and redis-server for the multi-host tests"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge \
	    redis-server; }

# Test hosts to look at by hand: control, storage, worker1 and worker2 as network namespaces on a bridge (root).
# Ctrl-C removes them; `make cluster-down` removes ones a killed session left behind.
cluster: env hosts-deps
	$(VENV)/bin/python -m tests.cluster up

cluster-down: env
	$(VENV)/bin/python -m tests.cluster down

# Type-check (mypy) the modules pyproject.toml's [tool.mypy] names. The installed `hpml` maps the repository's
# folders (setup.py), which mypy cannot follow through the editable install: it reads them through links.
typecheck: env
	@rm -rf $(TOOLS)/typecheck && mkdir -p $(TOOLS)/typecheck/hpml && cp hpml/__init__.py $(TOOLS)/typecheck/hpml/
	@for folder in components pipelines examples; do ln -s $(CURDIR)/$$folder $(TOOLS)/typecheck/hpml/$$folder; done
	@ln -s $(CURDIR)/hpml/v1 $(TOOLS)/typecheck/hpml/v1
	$(VENV)/bin/mypy --python-executable $(VENV)/bin/python

# Lint first (ruff, configured in pyproject.toml): it takes a second and names the line to fix. The multi-host tests
# run first, alone: their fault timings (heartbeat timeouts, a 30 s cut) assume the machine's cores are theirs. The
# rest runs in TEST_WORKERS processes (pytest-xdist): much of it waits on subprocesses. tests/conftest.py keeps the
# tests that share the Airflow stack in one process.
TEST_WORKERS ?= 2
HOSTS_TESTS := $(wildcard tests/test_hosts_*.py)
test: env browser postgres hosts-deps typecheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest $(HOSTS_TESTS)
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) $(addprefix --ignore=,$(HOSTS_TESTS))
	@$(MAKE) --no-print-directory test-tfx

# TFX conformance: hpml's components and modules inside a real TFX 1.16, which needs Python 3.10 (TFX 1.17 and
# later need glibc 2.39). The environment is .venv-tfx, pinned by infra/tfx-1.16-requirements.txt, with hpml editable.
# Its tests run in TEST_WORKERS processes, as the rest does: each is a pipeline of its own.
# The first Python 3.10 that runs: pyenv's (developer and CI machines), else python3.10 on the PATH.
PYTHON310 ?= $(shell for p in $$(ls -d $$(pyenv root 2>/dev/null || echo $$HOME/.pyenv)/versions/3.10.*/bin/python 2>/dev/null) \
  $$(command -v python3.10); do $$p -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null && echo $$p && break; done)
TFX_VENV := .venv-tfx
$(TFX_VENV)/.synced: infra/tfx-1.16-requirements.txt pyproject.toml setup.py | $(UV)
	@rm -rf $(TFX_VENV) && $(UV) venv --quiet --seed --python $(PYTHON310) $(TFX_VENV)
	@$(UV) pip sync --quiet --python $(TFX_VENV)/bin/python infra/tfx-1.16-requirements.txt
	@$(UV) pip install --quiet --python $(TFX_VENV)/bin/python --no-deps --compile-bytecode -e .
	@touch $@

test-tfx:
	@if [ -z "$(PYTHON310)" ]; then \
	  echo "TFX conformance tests not run: no Python 3.10 here (TFX 1.16 needs it; set PYTHON310=/path/to/python3.10)"; \
	else $(MAKE) --no-print-directory $(TFX_VENV)/.synced && $(TFX_VENV)/bin/python -m pytest -n $(TEST_WORKERS) -p no:cacheprovider -W ignore::FutureWarning -W ignore::DeprecationWarning tests/tfx_conformance; fi

# After changing a dependency range in pyproject.toml: pin the TFX 1.16 environment again.
tfx-requirements: $(UV)
	$(UV) pip compile --quiet --no-header --no-annotate --python-version 3.10 --python-platform x86_64-manylinux_2_28 \
	  pyproject.toml --extra kubernetes --extra vertex --extra examples infra/tfx-1.16-requirements.in -o infra/tfx-1.16-requirements.txt

# Benchmarks write benchmarks/results/*.json|md (and benchmarks/distillation.md), which the docs link.
bench: env
	$(VENV)/bin/python benchmarks/distributed.py
	$(VENV)/bin/python benchmarks/gpipe.py
	$(VENV)/bin/python benchmarks/distillation.py
	$(VENV)/bin/python benchmarks/input_pipeline.py
	$(VENV)/bin/python benchmarks/input_peers.py
	$(VENV)/bin/python benchmarks/callbacks.py
	$(VENV)/bin/python benchmarks/trainer_step.py
	$(MAKE) --no-print-directory bench-scale
	$(MAKE) --no-print-directory bench-e2e

# The penguin pipeline on TFX 1.16, hpml's local engine and hpml's Airflow engine (about 20 minutes on 2 cores).
bench-e2e: env
	@test -n "$(PYTHON310)" || { echo "bench-e2e needs a Python 3.10 for TFX 1.16 (set PYTHON310)" >&2; exit 1; }
	@$(MAKE) --no-print-directory $(TFX_VENV)/.synced
	$(VENV)/bin/python benchmarks/end_to_end.py

# The input pipeline benchmarks alone: B1-B3 against the limits, then against TFXIO and an expert's tf.data
# (about 30 and 20 minutes on 2 cores).
bench-input: env
	$(VENV)/bin/python benchmarks/input_pipeline.py
	$(VENV)/bin/python benchmarks/input_peers.py

# hpml's ExampleGen + Transform against TFX 1.16's chain on generated CSVs of 100k, 1M and 10M rows (TFX up to 1M),
# with ExampleGen's one-core limit (about an hour on 2 cores); then Transform's phases at 1M and 10M rows (about 20
# minutes).
bench-scale: env
	@test -n "$(PYTHON310)" || { echo "bench-scale needs a Python 3.10 for TFX 1.16 (set PYTHON310)" >&2; exit 1; }
	@$(MAKE) --no-print-directory $(TFX_VENV)/.synced
	$(VENV)/bin/python benchmarks/scale.py
	$(VENV)/bin/python benchmarks/transform_phases.py

# One host against the test cluster (network namespaces: root): the pipeline with its artifacts on another host's
# store, and with its work on other hosts' Beam pools and Slurm (about an hour on 2 cores).
bench-hosts: env hosts-deps
	$(VENV)/bin/python benchmarks/hosts.py

# The artifact root on an S3 server on loopback against local disk, at 1M rows (about 10 minutes on 2 cores).
bench-s3: env
	$(VENV)/bin/python benchmarks/s3_store.py

# The tuned training step against Keras's defaults, Keras's "auto" and an exhaustive grid (about 25 minutes on 2 cores).
bench-step: env
	$(VENV)/bin/python benchmarks/trainer_step.py

clean:
	rm -rf .hpml $(VENV) $(TFX_VENV) $(TOOLS)
