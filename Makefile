# kvhandoff: `make demo` and `make test` are the whole quick start on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-slow test-render lint typecheck proto clean mooncake-libs venv-sglang \
	venv-vllm test-engines

venv: $(STAMP)

# The stamp depends on pyproject.toml so editing dependencies reinstalls; otherwise idempotent.
# The mooncake extra is the `--transport mooncake` page path; its wheel links libibverbs (Debian's
# libibverbs1, installed here when missing) and the loopback bind wrapper is compiled with cc.
$(STAMP): pyproject.toml impl/transport/loopback_bind.c
	ldconfig -p | grep -q 'libibverbs\.so\.1 ' || $(MAKE) mooncake-libs
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev,mooncake]'
	$(BIN)/python -m kvhandoff.impl.transport.loopback build
	touch $(STAMP)

# libibverbs1 (and the libnl libraries it pulls in); apt-get update only when the lists are stale.
mooncake-libs:
	SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	$$SUDO apt-get install -y -q --no-install-recommends libibverbs1 >/dev/null 2>&1 || \
	{ $$SUDO apt-get update -q >/dev/null && \
	  $$SUDO apt-get install -y -q --no-install-recommends libibverbs1 >/dev/null; }

demo: venv
	$(BIN)/kvhandoff demo

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy kvhandoff tools

test: venv lint typecheck
	$(BIN)/python -m pytest -q

test-slow: venv
	$(BIN)/python -m pytest -q -m slow

# Render the demo report's Mermaid charts with the mermaid npm package in headless Chromium (the
# test installs both if missing: npm into .render-cache/, apt-get install chromium); keeps a screenshot.
test-render: venv
	$(BIN)/python -m pytest -q -m slow tests/render

# SGLang 0.5.23 as a conformance target (docs/sglang.md), in an environment of its own, outside
# `make test`: about 2.6 GB and 3-6 minutes on two cores. Every package is pinned and installed
# --no-deps (tests/engines/sglang-requirements.txt): SGLang's own requirements pull CUDA torch.
SGLANG_VENV := .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed

venv-sglang: $(SGLANG_STAMP)

$(SGLANG_STAMP): tests/engines/sglang-requirements.txt $(STAMP)
	test -x $(SGLANG_VENV)/bin/python || $(PY) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install --quiet --no-deps -r tests/engines/sglang-requirements.txt
	touch $(SGLANG_STAMP)

# vLLM 0.33.0's scheduler and the NIXL connector's scheduler side as a conformance target
# (docs/vllm.md), in an environment of its own, outside `make test`: every package pinned and
# installed --no-deps (tests/engines/vllm-requirements.txt), CPU torch; vLLM's own requirements
# pull CUDA torch and GPU kernels.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): tests/engines/vllm-requirements.txt $(STAMP)
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -r tests/engines/vllm-requirements.txt
	touch $(VLLM_STAMP)

# The engines' smoke campaigns against the spec (SGLang: docs/sglang.md; vLLM: docs/vllm.md).
test-engines: venv venv-sglang venv-vllm
	$(BIN)/python -m pytest -q -m slow tests/engines

# Regenerate the committed gRPC code under impl/proto/gen and conformance/proto/gen (the harness
# service); tests check both are up to date.
proto: venv
	$(BIN)/python -m kvhandoff.impl.proto.build
	$(BIN)/python -m kvhandoff.conformance.proto.build

clean:
	rm -rf $(VENV) $(SGLANG_VENV) $(VLLM_VENV) .mypy_cache .pytest_cache .ruff_cache .render-cache
