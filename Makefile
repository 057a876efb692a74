VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv test demo bench bench-all clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'

venv: $(PY)

test: $(PY)
	$(PY) -m pytest -q -n 2 tests

demo: $(PY)
	$(VENV)/bin/robowds demo

bench: $(PY)
	$(PY) scripts/bench_export.py

# every benchmark docs/benchmarks.md publishes, in one run (~15 minutes on 2 cores)
bench-all: $(PY)
	scripts/run_benchmarks.sh | tee docs/benchmarks-run.txt

clean:
	rm -rf $(VENV) build *.egg-info
