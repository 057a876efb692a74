VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv test demo bench bench-all clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# constraints.txt pins every package (a lock): a fresh resolve of s3fs/aiobotocore/botocore can
	@# backtrack for an hour; 20 minutes means it is stuck
	timeout 1200 $(PY) -m pip install -q -c constraints.txt -e '.[test]' || { rm -rf $(VENV); exit 1; }

venv: $(PY)

# the whole suite is ~5-7 minutes on 2 cores; past 40 it is stuck: stop it and print what ran
test: $(PY)
	timeout -k 30 2400 $(PY) -m pytest -q -n 2 --durations=15 tests

demo: $(PY)
	$(VENV)/bin/robowds demo

bench: $(PY)
	$(PY) scripts/bench_export.py

# every benchmark docs/benchmarks.md publishes, in one run (~15 minutes on 2 cores)
bench-all: $(PY)
	scripts/run_benchmarks.sh | tee docs/benchmarks-run.txt

clean:
	rm -rf $(VENV) build *.egg-info
