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

# the whole suite is ~9 minutes on 2 cores (worksteal: an idle worker takes tests from the other, so
# the slowest tests do not end the run on one core); past 40 it is stuck: stop it and print what ran
test: $(PY)
	timeout -k 30 2400 $(PY) -m pytest -q -n 2 --dist worksteal --durations=15 tests

demo: $(PY)
	$(VENV)/bin/robowds demo

bench: $(PY)
	$(PY) scripts/bench_export.py

# every benchmark docs/benchmarks.md publishes, in one run (~15 minutes on 2 cores): each script's
# table, then one summary table; the log goes beside the page, every figure as JSON to bench-out/DATE/
# (`BENCH_ARGS=--quick` checks that every script runs, in ~5 minutes, with figures that mean nothing)
bench-all: $(PY)
	PY=$(PY) scripts/run_benchmarks.sh $(BENCH_ARGS) | tee docs/benchmark-runs/$$(date -u +%Y-%m-%d)-bench-all.txt

clean:
	rm -rf $(VENV) build *.egg-info
