#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan, and runs each over its seed
# corpus (fuzz/corpus/<target>/) for FUZZ_SECONDS seconds (default: 75 s shared among the six,
# 12 s each; about a minute and a half in all). Fails on any crash, leak, sanitizer report or
# timeout; the input that caused it is saved as build-fuzz/artifacts/<target>-crash-*
# (reproduce: build-fuzz/fuzz/<target>_fuzz FILE).
# New inputs the fuzzers find go to build-fuzz/corpus/<target>/, not into the repository.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

apt_install "${BUILD_PACKAGES[@]}" clang libclang-rt-14-dev

# pyarrow's Arrow C++ library, for the Parquet target (cmake/parquet.cmake).
python_venv .venv-test pyarrow
build build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DSTOKER_SANITIZE=address,undefined -DSTOKER_FUZZ=ON \
  -DSTOKER_BUILD_TESTS=OFF -DSTOKER_BUILD_TOOLS=OFF \
  -DSTOKER_PARQUET=ON -DSTOKER_ARROW_PYTHON="$PWD/.venv-test/bin/python"

targets=(records jpeg_decode png_decode transform_spec tar_index parquet_open)
# The run's time stays about what it was with five targets at 15 s: 75 s shared among them.
seconds=${FUZZ_SECONDS:-$((75 / ${#targets[@]}))}
mkdir -p build-fuzz/artifacts
for target in "${targets[@]}"; do
  echo "== fuzz $target (${seconds}s)"
  mkdir -p "build-fuzz/corpus/$target"
  dict=()
  [ -f "fuzz/$target.dict" ] && dict=("-dict=fuzz/$target.dict")
  log="build-fuzz/$target.log"
  if ! build-fuzz/fuzz/${target}_fuzz "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$target-" \
    "build-fuzz/corpus/$target" "fuzz/corpus/$target" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "== fuzz $target FAILED (log: $log)"
    exit 1
  fi
  grep -E "stat::number_of_executed_units|stat::new_units_added" "$log" | tr '\n' ' '
  echo
done
echo "== fuzzing found nothing"
