# One entry point for people and CI. `make setup` is idempotent; test/demo/bench call it first.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
# Portable x86-64 build of llama.cpp (AVX2/FMA), so a cached wheel runs on any recent server.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF
PYTEST_ARGS ?=

.PHONY: setup system-packages demo smoke test lint format bench clean-lab help

help:
	@echo "make setup   install system packages (apt, as root) and the virtual environment"
	@echo "make demo    run the main job on the emulated lab with the built-in tiny models"
	@echo "make test    lint + the whole test suite"
	@echo "make lint    ruff check and format check"
	@echo "make bench   benchmarks: SD vs AD, batched verification, link emulation (root)"

setup: system-packages $(STAMP)

# Debian/Ubuntu packages the lab needs: sshd per emulated host, netfilter tools and the
# NFQUEUE library for the packet holder, a compiler and cmake for llama.cpp.
APT_PACKAGES := openssh-server iptables nftables iproute2 ethtool libnetfilter-queue-dev \
	libnfnetlink-dev build-essential cmake procps

system-packages:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing system packages: $$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	  else echo "missing system packages (install as root): $$missing"; exit 1; fi; \
	fi

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || { apt-get install -y -q python3-venv && $(PY) -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip wheel setuptools
	$(BIN)/pip install -q torch==2.13.0
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -q -c constraints.txt -e '.[device,server,controller,dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/testbed run experiments/demo.yaml

smoke: setup
	$(BIN)/testbed run experiments/smoke.yaml

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: lint
	$(BIN)/testbed models build-tiny
	$(BIN)/pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/testbed bench sd
	$(BIN)/testbed bench verify
	$(BIN)/python bench/bench_link.py

clean-lab: setup
	$(BIN)/testbed lab clean
