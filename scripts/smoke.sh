#!/usr/bin/env bash
# The benchmarks' smoke runs (they check the harnesses and measure nothing), for
# scripts/test.sh once the release build (build/) and .venv-test with the wheel are there.
#
# Two lanes side by side: most of a smoke run is starting Python and importing torch, one
# core's work. The "data" lane holds the runs that make data files in $TMPDIR and read them
# again (Parquet, WebDataset shards, the S3 sets, python_bench's image folder, the headline
# that reuses them all), one after another; the "engine" lane the rest. Each command's output
# and time go to build-py/smoke/<lane>.log; a command that fails ends its lane, and the run
# names it and prints the end of its log.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

py=.venv-test/bin/python
tmp="$($py -c 'import tempfile; print(tempfile.gettempdir())')"
logs=build-py/smoke
mkdir -p "$logs"

# run CMD...: one smoke command, timed.
run() {
  local start=${EPOCHREALTIME/,/.}
  echo "-- $*"
  "$@" || { echo "== smoke: FAILED (status $?): $*"; exit 1; }
  echo "-- took $(awk -v a="$start" -v b="${EPOCHREALTIME/,/.}" 'BEGIN { printf "%.1f", b - a }') s: $*"
}

engine_lane() {
  run ./build/stoker bench --smoke --no-baseline --json
  run ./build/stoker bench --smoke --device sim --json
  run ./build/stoker bench -w jpeg --smoke --no-baseline --json
  run ./build/stoker tune --smoke --seconds 0.5 --measure 0.2 --grid --grid-workers 1 2 \
    --repeat 2 --grid-depth 2 --json
  run ./build/stoker diagnose --smoke --seconds 0.5 --json
  run python3 -m py_compile bench/torch_dataloader.py bench/torchvision_baseline.py \
    examples/token_lm.py
  run $py bench/worker_overhead.py --smoke
  run $py bench/worker_kinds.py --smoke
  run $py bench/ray_bench.py --smoke
  run $py bench/chaos.py --smoke
  run $py bench/worker_gc.py --smoke
  run $py bench/worker_cpu.py --smoke
  run $py bench/auto_switch.py --smoke
  run $py bench/memory_cap.py --smoke
  run $py bench/memory_cap.py --smoke --stream
  run $py bench/memory_soak.py --smoke
  run $py bench/token_bench.py --smoke --no-peers
  run $py bench/text_token_bench.py --smoke
  run $py bench/video_bench.py --smoke # FFmpeg's libraries and CLI
  run ./build/stoker tune --video fuzz/corpus/video_open/h264.mp4 --seconds 0.5 --measure 0.2 \
    --json
  run ./build/stoker diagnose --video fuzz/corpus/video_open/vfr.mp4 --seconds 0.5 --json
  # bench/gpu_feed.py on the CPU (its GPU figures come from scripts/gpu_check.sh)
  run $py bench/gpu_feed.py --device cpu --smoke
  run $py bench/elastic_resume.py --smoke
  run $py bench/reproducibility.py --smoke
  run $py bench/reproducibility.py --smoke --cost
  run $py bench/auto_matrix.py --smoke --workload stream padding tiny
  run $py bench/frameworks_bench.py --smoke
}

data_lane() {
  run $py bench/python_bench.py --smoke
  # Parquet: the Python data set beside the C++ reader (`stoker bench --parquet`), then the
  # C++ reader from the command line on the file that smoke run made
  run $py bench/parquet_bench.py --smoke --stoker-bin build/stoker
  local pq_file="$tmp/stoker-bench-parquet-48-16.parquet"
  run ./build/stoker diagnose --parquet "$pq_file" --seconds 0.5 --json
  run ./build/stoker tune --parquet "$pq_file" --seconds 0.5 --measure 0.2 --json
  run ./build/stoker bench --parquet "$pq_file" --smoke --python $py --json
  run $py bench/parquet_bench.py --smoke
  run $py bench/parquet_shuffle.py --smoke
  # the shards the WebDataset smoke run made ($TMPDIR/stoker-bench-wds-64-2)
  run $py bench/webdataset_bench.py --smoke
  local wds_shards="$tmp/stoker-bench-wds-64-2/shards"
  run ./build/stoker diagnose --webdataset "$wds_shards" --seconds 0.5 --json
  run ./build/stoker tune --webdataset "$wds_shards" --seconds 0.5 --measure 0.2 --json
  run $py bench/s3_bench.py --smoke # SeaweedFS, STOKER_WEED
  run $py bench/s3_images_bench.py --smoke
  run $py bench/s3_shuffle.py --smoke
  run $py bench/s3_shuffle.py --smoke --static --sets rows  # objects served by nginx from files
  # the main job's table (bench/headline.py) without torchvision's rows (.venv-test has none)
  run $py bench/headline.py --smoke --out build-py/headline-smoke \
    --rows tensors seed gil cheap stream webdataset parquet s3 auto
}

engine_lane >"$logs/engine.log" 2>&1 &
engine=$!
data_lane >"$logs/data.log" 2>&1 &
data=$!
failed=0
for lane in engine data; do
  pid=$engine
  [ "$lane" = data ] && pid=$data
  if ! wait "$pid"; then
    tail -n 40 "$logs/$lane.log"
    echo "== smoke: the $lane lane failed (log: $logs/$lane.log)"
    failed=1
  fi
done
# the slowest five, to see where the stage's time goes
sed -n 's/^-- took \([0-9.]*\) s: /\1 /p' "$logs/engine.log" "$logs/data.log" | sort -rn | head -5 |
  awk '{ printf "   slowest: %6.1f s ", $1; $1 = ""; print substr($0, 1, 100) }'
exit "$failed"
