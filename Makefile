# gpuspawner: everything a new Debian machine needs, installed and started by the project itself.
#   make venv         .venv with the project and its hub + test + docs extras
#   make chp          configurable-http-proxy@5 in node_modules/
#   make engine       local Docker engine (scripts/dockerd.sh) and the isolation rule
#                     between server networks (scripts/network.sh)
#   make btrfs-engine second engine on btrfs with per-container disk quotas
#   make labext       the JupyterLab extension, prebuilt (scripts/build-labextension.sh)
#   make labext-ui    node_modules of its galata UI tests (labextension/ui-tests; no browser
#                     download: Debian's chromium from make test-tools)
#   make images       gpuspawner/singleuser:latest on its deps stage gpuspawner/singleuser:deps
#                     (scripts/build-images.sh; a code change rebuilds the project stage only)
#   make pytorch-image gpuspawner/pytorch:latest, the single-user image plus the CUDA build of
#                     PyTorch, for the GPU profiles (scripts/build-pytorch-image.sh)
#   make gpu-check    on this host's real GPU: NVML vs nvidia-smi, a 1-GPU server, the panel
#                     and the culler under load, two shares per enforcement mechanism, MIG,
#                     XID/ECC; one table, exit 1 on a mismatch, 2 (one line) without a GPU
#   make dist         dist/: the wheel and the sdist (lab extension inside) and a wheelhouse
#                     of the hub's dependencies, for a hub machine (scripts/dist.sh)
#   make up           all of the above, then the hub on http://127.0.0.1:8000
#   make slurm        a private three-node Slurm cluster on loopback for the Slurm backend's
#                     tests (scripts/slurm.sh; `scripts/slurm.sh --stop` stops it) and the
#                     nodes' Python for notebook jobs (scripts/slurm-jobenv.sh)
#   make registry     a private image registry on 127.0.0.1:17010 for the users'-own-images
#                     tests (scripts/registry.sh; `scripts/registry.sh --stop` stops it)
#   make test         lint + the docs (warnings are errors) + the whole test suite (docker- and
#                     slurm-marked tests included), modules on TEST_WORKERS (2) parallel workers beside
#                     the Slurm tests
#   make test-unit    tests without an engine, a hub, a browser, slapd, Slurm or slow processes
#   make docs         the Sphinx site in docs/_build/html (warnings are errors)
#   make lint         ruff, import-linter, and the lab extension's prettier + eslint
#   make clean | distclean
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed
CHP    := node_modules/.bin/configurable-http-proxy
HUB_CONFIG ?= hub_config/jupyterhub_config.py
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
LINT_DIRS := $(wildcard gpuspawner tests idle_culler benchmarks hub_config labextension/ui-tests)

.PHONY: help venv chp engine btrfs-engine labext labext-ui images pytorch-image dist slurm registry up hub test \
	test-unit lint gpu-check \
	docs clean distclean

help:
	@sed -n 's/^#   //p' Makefile

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[hub,test,docs]'
	@touch $@

chp: $(CHP)

$(CHP):
	scripts/install-chp.sh

engine:
	scripts/dockerd.sh
	scripts/network.sh

btrfs-engine: engine images
	scripts/btrfs-engine.sh

labext: venv
	scripts/build-labextension.sh

labext-ui: venv
	scripts/build-labextension.sh --ui-deps

images: venv engine labext
	scripts/build-images.sh

pytorch-image: images
	scripts/build-pytorch-image.sh

gpu-check: venv
	$(VENV)/bin/python -m gpuspawner.gpushare.check $(GPU_CHECK_ARGS)

dist: venv
	scripts/dist.sh

up: venv chp engine images pytorch-image
	$(MAKE) --no-print-directory hub

# the hub alone (keeps its state in var/hub/, see hub_config/); Ctrl-C stops it and its proxy
hub:
	@test -f $(HUB_CONFIG) || { echo "missing $(HUB_CONFIG)" >&2; exit 1; }
	$(VENV)/bin/jupyterhub -f $(HUB_CONFIG)

lint: venv
	$(VENV)/bin/ruff check $(LINT_DIRS)
	$(VENV)/bin/lint-imports
	scripts/build-labextension.sh --deps
	cd labextension && npm run --silent lint:check

docs: venv
	@test -x $(VENV)/bin/sphinx-build || $(VENV)/bin/python -m pip install -q -e '.[hub,test,docs]'
	$(VENV)/bin/sphinx-build -W -q -b html docs docs/_build/html
	@echo "docs/_build/html/index.html"

# Debian's Slurm 22.05 + munge, started as a private cluster under var/slurm/ (munged,
# slurmctld on 127.0.0.1:17001, slurmd node1/node2/node3 with fake GPUs); its gres.conf comes from
# hub_config/slurm/*.yaml through `gpuspawner slurm-gres` (the venv's python, or python3 with
# PyYAML). No venv prerequisite: `make test` builds the venv before it. Then the nodes' Python
# for notebook jobs (papermill, ipykernel, nbconvert) in var/slurm/jobenv (scripts/slurm-jobenv.sh).
slurm:
	scripts/slurm.sh
	scripts/slurm-jobenv.sh

# Debian's docker-registry on 127.0.0.1:17010 (GPUSPAWNER_REGISTRY_PORT), blobs in var/registry/:
# the tests push users' images there and pull them back (docs/howto/user-images.md)
registry:
	scripts/registry.sh

# slapd + ldap-utils + chromium for the LDAP and service tests (Debian packages)
test-tools:
	scripts/ldap.sh

# the Slurm-marked tests run in one process (one shared cluster: two hubs on it sweep each
# other's jobs) beside the others, which run as whole modules on TEST_WORKERS pytest-xdist
# workers (--dist loadfile, longest modules first: tests/conftest.py); tests marked `exclusive`
# (they change the host's isolation rule) run after, alone. TEST_WORKERS=0: one process.
test: venv chp engine images pytorch-image btrfs-engine test-tools slurm registry labext-ui dist lint docs
ifeq ($(TEST_WORKERS),0)
	$(VENV)/bin/pytest -q -p no:xdist $(PYTEST_ARGS)
else
	@mkdir -p var/log; rc=0; \
	echo "pytest -m slurm (one process, output in var/log/test-slurm.log) beside" \
	  "pytest -n $(TEST_WORKERS) -m 'not slurm'"; \
	$(VENV)/bin/pytest -q -p no:xdist -m "slurm and not exclusive" --durations=5 \
	  --basetemp=/tmp/gpuspawner-slurm-tests $(PYTEST_ARGS) >var/log/test-slurm.log 2>&1 & \
	slurm=$$!; \
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --durations=10 -m "not slurm and not exclusive" $(PYTEST_ARGS) || rc=1; \
	wait $$slurm || rc=1; \
	echo "--- the Slurm-marked tests (var/log/test-slurm.log):"; cat var/log/test-slurm.log; \
	echo "--- the exclusive tests, alone:"; \
	$(VENV)/bin/pytest -q -p no:xdist -m exclusive $(PYTEST_ARGS) || [ $$? -eq 5 ] || rc=1; \
	exit $$rc
endif

test-unit: venv
	$(VENV)/bin/pytest -q \
	  -m "not docker and not hub and not browser and not ldap and not slurm and not slow" \
	  $(PYTEST_ARGS)

clean:
	rm -rf .pytest_cache .ruff_cache .hypothesis build dist *.egg-info var/build docs/_build
	find . -name __pycache__ -type d -prune -not -path './$(VENV)/*' -not -path './node_modules/*' -exec rm -rf {} +

# also the venv, node_modules and var/ (wheelhouse, btrfs loop file); engines' images stay;
# the Slurm cluster is stopped (its state in var/slurm/ stays), the registry stopped and its blobs
# removed
distclean: clean
	-scripts/slurm.sh --stop
	-scripts/registry.sh --stop
	-scripts/btrfs-engine.sh --stop
	-scripts/network.sh --stop
	rm -rf $(VENV) node_modules var/wheelhouse var/btrfs var/build var/registry
