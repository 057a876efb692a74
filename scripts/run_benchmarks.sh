#!/usr/bin/env bash
# Every benchmark whose figures docs/benchmarks.md publishes, with the documented command, in one run on
# one machine. Output (with the date, commit, CPU count and load) goes to stdout; `make bench-all` keeps
# it in docs/benchmarks-run.txt. The torchcodec rows of bench_video appear only where torchcodec imports
# (see docs/benchmarks.md, "Video throughput"); set TORCHCODEC_PATH to its --target folder to add them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
echo "# robowds benchmarks, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
run() {
    echo
    echo "\$ $*"
    "$@" 2>&1
}
run $PY scripts/bench_export.py --episodes 300 --repeats 3
run $PY scripts/bench_read.py
run $PY scripts/bench_cold_read.py
run $PY scripts/bench_collate.py
run $PY scripts/bench_batches.py
if [ -n "${TORCHCODEC_PATH:-}" ]; then
    run env PYTHONPATH="$TORCHCODEC_PATH" $PY scripts/bench_video.py
else
    run $PY scripts/bench_video.py
fi
run $PY scripts/bench_codecs.py
run $PY scripts/bench_stats.py
run $PY scripts/bench_remote.py
run $PY scripts/bench_store_s3.py
run $PY scripts/bench_plan.py
run $PY scripts/bench_mixture.py --repeats 3
run $PY scripts/bench_fields.py --episodes 8
run $PY scripts/bench_layout.py
run $PY scripts/bench_convert.py --repeats 3
run $PY scripts/bench_video_export.py --repeats 3
run $PY scripts/bench_segments.py
run $PY scripts/bench_row_groups.py
echo
echo "# done $(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
