#!/usr/bin/env bash
# Every benchmark whose figures docs/benchmarks.md publishes, with the documented command, in one run on
# one machine. Output (with the date, commit, CPU count and load) goes to stdout; `make bench-all` keeps
# it in docs/benchmark-runs/DATE-bench-all.txt. Each script prints its own benchlib table and writes its
# figures to bench-out/STAMP/NAME.json; the run ends with one summary table of them all. Arguments (e.g.
# --quick) go to every script. The torchcodec rows of bench_video appear only where torchcodec imports
# (see docs/benchmark-runs/video.md for the setup); set TORCHCODEC_PATH to its --target folder to add them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench-out/$STAMP  # a fresh folder per run: nothing of an earlier run is overwritten
mkdir -p "$OUT"
EXTRA=("$@")
echo "# robowds benchmarks, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
run() {  # run NAME CMD...: the command, with --json $OUT/NAME.json and the extra arguments
    local name=$1
    shift
    echo
    echo "\$ $*"
    "$@" --json "$OUT/$name.json" "${EXTRA[@]}" 2>&1
}
run bench_export $PY scripts/bench_export.py --episodes 300 --repeats 3
run bench_read $PY scripts/bench_read.py
run bench_read_rss $PY scripts/bench_read_rss.py
run bench_by_key $PY scripts/bench_by_key.py
run bench_cold_read $PY scripts/bench_cold_read.py
run bench_collate $PY scripts/bench_collate.py
run bench_batches $PY scripts/bench_batches.py
if [ -n "${TORCHCODEC_PATH:-}" ]; then
    run bench_video env PYTHONPATH="$TORCHCODEC_PATH" $PY scripts/bench_video.py
else
    run bench_video $PY scripts/bench_video.py
fi
run bench_codecs $PY scripts/bench_codecs.py
run bench_stats $PY scripts/bench_stats.py
run bench_remote $PY scripts/bench_remote.py
run bench_store_s3 $PY scripts/bench_store_s3.py
run bench_plan $PY scripts/bench_plan.py
run bench_mixture $PY scripts/bench_mixture.py --repeats 3
run bench_fields $PY scripts/bench_fields.py --episodes 8
run bench_transforms $PY scripts/bench_transforms.py
run bench_verify $PY scripts/bench_verify.py --episodes 150
run bench_disk_peak $PY scripts/bench_disk_peak.py --episodes 150
run bench_layout $PY scripts/bench_layout.py
run bench_convert $PY scripts/bench_convert.py --repeats 3
run bench_video_export $PY scripts/bench_video_export.py --repeats 3
run bench_segments $PY scripts/bench_segments.py
run bench_row_groups $PY scripts/bench_row_groups.py
run bench_append $PY scripts/bench_append.py --episodes 2000 --added 100
run bench_report $PY scripts/bench_report.py
echo
echo "# summary: every figure of this run (JSON in $OUT)"
$PY scripts/benchlib.py summary "$OUT"/*.json
echo
echo "# done $(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
