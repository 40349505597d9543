# ICE — developer entry points. `make demo` and `make test` work on a fresh machine.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-dev test check lint format typecheck protos bench clean vllm-install test-vllm vllm-serve vllm-record vllm-record-tokens bench-overload

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (set PY=...)"; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,truncate]'
	@touch $(STAMP)

# A real vLLM (CPU) behind ICE; when its install fails, the dev backend instead.
demo: $(STAMP)
	@$(MAKE) --no-print-directory vllm-install || echo "vLLM install failed: running the dev backend"
	$(BIN)/ice demo

demo-dev: $(STAMP)
	$(BIN)/ice demo --backend dev

# ICE_VLLM=1 (what CI sets) also installs real vLLM and runs the tests that need it.
ICE_VLLM ?=
test: $(STAMP) $(if $(filter 1,$(ICE_VLLM)),vllm-install)
	ICE_VLLM=$(ICE_VLLM) $(BIN)/pytest -q

# Format, lint, types, and the house's import contracts (the layers; the lab apart).
check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

lint: check

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy

# Regenerate ext_proc/_pb from protos/ (the generated files are committed; a test checks they match).
protos: $(STAMP)
	$(BIN)/python -m ext_proc.tools.protogen

bench: $(STAMP)
	$(BIN)/python bench/throughput.py

VLLM_VENV := .venv-vllm

# A real vLLM (CPU build) in its own venv + a tiny random-weight model: ~2 min, ~2.5 GB the first time.
vllm-install: $(STAMP)
	$(BIN)/python -m ext_proc.lab.vllm_local install --venv $(VLLM_VENV)
	$(BIN)/python -m ext_proc.lab.vllm_local build-model --venv $(VLLM_VENV)

test-vllm: vllm-install
	ICE_VLLM=1 $(BIN)/pytest -q -m vllm

bench-overload: vllm-install
	$(BIN)/python bench/overload.py

# Re-record vLLM's prompt-token counts for tests/data/tokens/vllm_usage.json.
vllm-record-tokens: vllm-install
	ICE_VLLM=1 ICE_RECORD_TOKENS=1 $(BIN)/pytest -q -m vllm tests/tokencount/test_tokencount.py

vllm-serve: vllm-install
	$(BIN)/python -m ext_proc.lab.vllm_local serve --venv $(VLLM_VENV) --port 8000

vllm-record: vllm-install
	$(BIN)/python -m ext_proc.lab.vllm_local record --venv $(VLLM_VENV)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .scratch/vllm .mypy_cache .ruff_cache .pytest_cache
