# One entry point for people and CI. `make setup` is idempotent; test/demo/bench call it first.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
# Portable x86-64 build of llama.cpp (AVX2/FMA), so a cached wheel runs on any recent server.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF
PYTEST_ARGS ?= --durations=15
TORCH_VERSION := 2.13.0
SETUP_LOG ?= $(VENV)/setup.log
EXTRAS := device,server,controller,dev
# $(call step,what (how long),command): run command with its output in $(SETUP_LOG), print
# what it did and how long it took; on failure print the log's tail and stop.
define step
	start=$$(date +%s); printf 'setup: %s ... ' "$(1)"; \
	if { $(2); } >>$(SETUP_LOG) 2>&1; then echo "done in $$(( $$(date +%s) - start )) s"; \
	else echo "FAILED"; tail -n 40 $(SETUP_LOG); \
	  echo "setup: failed; full log in $(SETUP_LOG)"; exit 1; fi
endef

.PHONY: setup system-packages demo smoke test lint format bench clean-lab help

help:
	@echo "make setup   install system packages (apt, as root) and the virtual environment"
	@echo "make demo    run the main job on the emulated lab with the built-in tiny models"
	@echo "make test    lint + the whole test suite"
	@echo "make lint    ruff check and format check"
	@echo "make bench   benchmarks: SD vs AD, batched verification, link emulation (root)"

setup: system-packages $(STAMP)

# Debian/Ubuntu packages the lab needs: sshd per emulated host, netfilter tools and the
# NFQUEUE library for the packet holder, a compiler and cmake for llama.cpp, chromium for the
# dashboard tests, sudo for the rehearsal lab's login users (tests/test_rehearsal.py).
APT_PACKAGES := openssh-server iptables nftables iproute2 ethtool libnetfilter-queue-dev \
	libnfnetlink-dev build-essential cmake procps mininet \
	chromium sudo

system-packages:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "setup: installing system packages (apt, 1-5 min): $$(echo $$missing)"; \
	    log=$(SETUP_LOG); mkdir -p $$(dirname $$log); \
	    { DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; } >$$log 2>&1 \
	      || { tail -n 40 $$log; echo "setup: apt-get failed; full log in $$log"; exit 1; }; \
	  else echo "missing system packages (install as root): $$missing"; exit 1; fi; \
	fi

# Quiet unless a step fails: each step says what it does and roughly how long it takes, pip's
# output goes to $(SETUP_LOG), whose tail is printed when a step fails.
$(STAMP): pyproject.toml constraints.txt
	@mkdir -p $(dir $(SETUP_LOG)); : >$(SETUP_LOG)
	@$(call step,virtual environment in $(VENV) (seconds),\
	  test -x $(BIN)/python || $(PY) -m venv $(VENV) || \
	  { apt-get install -y -q python3-venv && $(PY) -m venv $(VENV); })
	@$(call step,pip + wheel + setuptools (under a minute),\
	  $(BIN)/pip install --upgrade pip wheel setuptools)
	@$(call step,PyTorch $(TORCH_VERSION) (1-3 min; cached after),\
	  $(BIN)/pip install torch==$(TORCH_VERSION))
	@$(call step,the project and llama-cpp-python (about 5 min the first time: builds llama.cpp),\
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -c constraints.txt \
	  -e '.[$(EXTRAS)]')
	@touch $(STAMP)
	@echo "setup: done (log: $(SETUP_LOG))"
	@echo "setup: the first demo or test also builds the tiny models (about 4 min, then cached)"

# The run prints its conditions as they finish; the dashboard's path comes last (also after
# a run with failed conditions, whose exit status is kept).
demo: setup
	@$(BIN)/testbed run experiments/demo.yaml; rc=$$?; \
	$(BIN)/testbed dashboard results || exit $$?; exit $$rc

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
	$(BIN)/testbed bench link

clean-lab: setup
	$(BIN)/testbed lab clean
