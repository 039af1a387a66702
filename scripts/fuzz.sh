#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan, and runs each over its seed
# corpus (fuzz/corpus/<target>/) for FUZZ_SECONDS seconds (default: 75 s shared among the seven,
# 10 s each, $JOBS fuzzers at a time: about 40 s on 2 cores). Fails on any crash, leak,
# sanitizer report or timeout; the input that caused it is saved as
# build-fuzz/artifacts/<target>-crash-* (reproduce: build-asan/fuzz/<target>_fuzz FILE).
# New inputs the fuzzers find go to build-fuzz/corpus/<target>/, not into the repository.
# The fuzzers are built in build-asan (common.sh's ASAN_BUILD: the tests' ASan+UBSan build, in
# which scripts/test.sh has built them already); only they are built here.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

apt_install "${BUILD_PACKAGES[@]}" clang libclang-rt-14-dev

# pyarrow's Arrow C++ library, for the Parquet target (cmake/parquet.cmake).
python_venv .venv-test pyarrow
configure build-asan "${ASAN_BUILD[@]}"
targets=(records jpeg_decode png_decode transform_spec tar_index parquet_open video_open)
# The run's time stays about what it was with five targets at 15 s: 75 s shared among them.
seconds=${FUZZ_SECONDS:-$((75 / ${#targets[@]}))}
ninja -C build-asan -j "$JOBS" "${targets[@]/%/_fuzz}"
mkdir -p build-fuzz/artifacts
# fuzz TARGET: one fuzzer over its corpus for $seconds; its output in build-fuzz/TARGET.log.
fuzz() {
  local target=$1 dict=()
  mkdir -p "build-fuzz/corpus/$target"
  [ -f "fuzz/$target.dict" ] && dict=("-dict=fuzz/$target.dict")
  build-asan/fuzz/${target}_fuzz "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$target-" \
    "build-fuzz/corpus/$target" "fuzz/corpus/$target" >"build-fuzz/$target.log" 2>&1
}
# Each fuzzer is one process on one core: $JOBS of them run side by side (each still for
# $seconds), in lanes of targets one after another; then each target's result, in order.
echo "== fuzz ${targets[*]} (${seconds}s each, $JOBS at a time)"
pids=()
for ((lane = 0; lane < JOBS && lane < ${#targets[@]}; lane++)); do
  (
    for ((i = lane; i < ${#targets[@]}; i += JOBS)); do
      target=${targets[$i]}
      rm -f "build-fuzz/$target.status"
      fuzz "$target" && echo 0 >"build-fuzz/$target.status" || echo 1 >"build-fuzz/$target.status"
    done
  ) &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid"
done
failed=0
for target in "${targets[@]}"; do
  log="build-fuzz/$target.log"
  if [ "$(cat "build-fuzz/$target.status" 2>/dev/null)" != 0 ]; then
    tail -n 60 "$log"
    echo "== fuzz $target FAILED (log: $log)"
    failed=1
    continue
  fi
  echo "== fuzz $target (${seconds}s)"
  grep -E "stat::number_of_executed_units|stat::new_units_added" "$log" | tr '\n' ' '
  echo
done
((failed == 0)) || exit 1
echo "== fuzzing found nothing"
