# Shared by the set-up scripts: installs missing Debian packages, makes virtual environments and
# builds. Each step checks what it needs and redoes what an interrupted run left broken, so a
# command killed at any moment succeeds when run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

JOBS=${JOBS:-$(nproc)}

# apt_install PKG...: installs whichever of the packages are not fully installed. A dpkg run
# that was interrupted ("dpkg was interrupted, you must manually run 'dpkg --configure -a'")
# is finished first. Services a package brings (nginx) are not started: the benchmarks start
# their own (a policy-rc.d that denies it, for the install, where the machine has none).
apt_install() {
  local missing=()
  for p in "$@"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] ||
      missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    local policy=/usr/sbin/policy-rc.d made=0 rc=0
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made=1
    fi
    dpkg --configure -a && apt-get update -qq &&
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
    if ((made)); then rm -f "$policy"; fi
    return "$rc"
  fi
}

# python_venv DIR [REQUIREMENT...]: a virtual environment at DIR whose python runs and has a
# working pip, with these installed (pip skips what is already there). One whose making did not
# finish (DIR.making is left: a `python3 -m venv` killed before it installed pip leaves a python
# without pip) or whose pip does not run is made again.
python_venv() {
  local dir=$1
  shift
  if [ -e "$dir.making" ] ||
    { [ -e "$dir" ] && ! "$dir/bin/python" -m pip --version >/dev/null 2>&1; }; then
    echo "== $dir: not a whole virtual environment (an interrupted set-up?); making it again"
    rm -rf "$dir"
  fi
  if [ ! -e "$dir" ]; then
    apt_install python3 python3-venv python3-pip
    touch "$dir.making"
    python3 -m venv "$dir"
    rm -f "$dir.making"
  fi
  if (($#)); then
    "$dir/bin/python" -m pip install -q "$@"
  fi
}

# python_imports VENV CODE REQUIREMENT...: runs CODE (e.g. "import torch, torchvision") in
# VENV's python; if it fails, the requirements are installed again over what is there. A pip
# install killed midway can leave a package that pip counts as installed but whose files are
# not all there, which python_venv's `pip install` would then skip.
python_imports() {
  local venv=$1 code=$2
  shift 2
  if ! "$venv/bin/python" -c "$code" >/dev/null 2>&1; then
    echo "== $venv: '$code' failed (an interrupted install?); installing $* again"
    "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$@"
    "$venv/bin/python" -c "$code"
  fi
}

BUILD_PACKAGES=(g++ cmake ninja-build pkg-config libgtest-dev libfmt-dev libcli11-dev
                nlohmann-json3-dev libjpeg62-turbo-dev libpng-dev libxxhash-dev
                libcurl4-openssl-dev libpugixml-dev
                libavformat-dev libavcodec-dev libavutil-dev libswscale-dev ffmpeg)

# The sanitizer builds (ASan+UBSan, TSan, the fuzzers): -O1 with line tables only (-g1; clang's
# -gline-tables-only), as the sanitizers' and OSS-Fuzz's own builds use, instead of
# RelWithDebInfo's -O2 -g. The reports' stack traces keep their files and lines; compiling costs
# about half the CPU (g++ ASan+UBSan: src/exec/engine.cc 18.9 -> 8.9 s, tests/loader_test.cc
# 48.9 -> 24.4 s).
SANITIZER_BUILD=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
# build-asan: clang with ASan+UBSan, the tests and the libFuzzer targets in one build (the
# library compiled once for both: scripts/test.sh runs the tests, scripts/fuzz.sh the
# fuzzers); Parquet through .venv-test's pyarrow (its Arrow C++ library).
ASAN_BUILD=("${SANITIZER_BUILD[@]}" -DCMAKE_CXX_COMPILER=clang++ -DSTOKER_SANITIZE=address,undefined
  -DSTOKER_FUZZ=ON -DSTOKER_BUILD_TESTS=ON -DSTOKER_BUILD_TOOLS=OFF
  -DSTOKER_PARQUET=ON "-DSTOKER_ARROW_PYTHON=$PWD/.venv-test/bin/python")

# configure DIR [cmake args...]: configures the project into DIR. A configure that did not
# finish (DIR/.configuring is left while one runs; or a cache without build.ninja) starts from
# an empty cache, and so does a second try after one that failed. The objects already built
# are kept: ninja rebuilds what changed.
configure() {
  local dir=$1
  shift
  if [ -e "$dir/CMakeCache.txt" ] &&
    { [ -e "$dir/.configuring" ] || [ ! -e "$dir/build.ninja" ]; }; then
    echo "== $dir: its last configure did not finish; configuring from an empty cache"
    rm -f "$dir/CMakeCache.txt"
  fi
  mkdir -p "$dir"
  touch "$dir/.configuring"
  if ! cmake -S . -B "$dir" -G Ninja -DSTOKER_WERROR=ON "$@" >/dev/null; then
    echo "== $dir: configure failed; once more from an empty cache"
    rm -f "$dir/CMakeCache.txt"
    cmake -S . -B "$dir" -G Ninja -DSTOKER_WERROR=ON "$@" >/dev/null
  fi
  rm -f "$dir/.configuring"
}

# build DIR [cmake args...]: configures the project into DIR and builds it.
build() {
  configure "$@"
  ninja -C "$1" -j "$JOBS"
}

# python_build_repair: removes each scikit-build-core build directory (build-py/<wheel tag>/)
# whose first configure did not finish (a cache but no build.ninja), which pip would not redo.
python_build_repair() {
  local d
  for d in build-py/cp*/; do
    if [ -e "$d/CMakeCache.txt" ] && [ ! -e "$d/build.ninja" ]; then
      echo "== $d: its last configure did not finish; building it afresh"
      rm -rf "$d"
    fi
  done
}

# python_package VENV [PIP ARG...]: the stoker package from this tree installed into VENV
# (scikit-build-core builds it in build-py/<wheel tag>/, incrementally: --no-build-isolation
# keeps the build's paths the same from one run to the next). A build directory whose first
# configure did not finish is removed; an install that fails is tried once more from empty
# build directories. PIP ARGs go to pip install (e.g. -C cmake.define.STOKER_BUILD_TOOLS=OFF).
python_package() {
  local venv=$1
  shift
  python_venv "$venv" scikit-build-core pybind11
  python_build_repair
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$JOBS}
  if ! "$venv/bin/python" -m pip install -q --no-build-isolation "$@" .; then
    echo "== installing the package failed; once more from empty build directories (build-py/cp*)"
    rm -rf build-py/cp*/
    "$venv/bin/python" -m pip install -q --no-build-isolation "$@" .
  fi
}

# Stage timings: `stage NAME...` prints "== NAME..." and starts timing a stage (ending the one
# before); `stage_times` ends the last one and prints each stage's seconds, wall-clock and CPU
# (user + system of this shell and the commands it waited for), and the total (a script runs it
# on EXIT, so a failed run shows where its time went, the failed stage last). On a shared or
# loaded machine the CPU seconds are the steadier measure of what a stage costs.
STAGE_NAMES=()
STAGE_SECONDS=()
STAGE_CPU=()
_stage_name=""
_stage_start=""
_stage_cpu_start=""
_stages_start=${EPOCHREALTIME/,/.}

# _cpu_ticks: this shell's CPU time and its waited-for children's, in clock ticks, from
# /proc/<pid>/stat (utime, stime, cutime, cstime), read without forking (a subshell's own counts
# would start at zero); in _cpu.
_cpu=0
_cpu_ticks() {
  local stat rest
  read -r stat </proc/$BASHPID/stat || { _cpu=0; return; }
  rest=${stat##*) }  # the fields after the command name, the state field first
  local -a f
  read -r -a f <<<"$rest"
  _cpu=$((f[11] + f[12] + f[13] + f[14]))
}
_clk_tck=$(getconf CLK_TCK 2>/dev/null || echo 100)
_cpu_ticks
_stages_cpu_start=$_cpu

_stage_end() {
  if [ -n "$_stage_name" ]; then
    _cpu_ticks
    STAGE_NAMES+=("$_stage_name")
    STAGE_SECONDS+=("$(awk -v a="$_stage_start" -v b="${EPOCHREALTIME/,/.}" \
      'BEGIN { printf "%.1f", b - a }')")
    STAGE_CPU+=("$(awk -v a="$_stage_cpu_start" -v b="$_cpu" -v t="$_clk_tck" \
      'BEGIN { printf "%.1f", (b - a) / t }')")
    _stage_name=""
  fi
}

stage() {
  _stage_end
  echo "== $*"
  _stage_name=$1
  _stage_start=${EPOCHREALTIME/,/.}
  _cpu_ticks
  _stage_cpu_start=$_cpu
}

stage_times() {
  local rc=$?
  _stage_end
  ((${#STAGE_NAMES[@]})) || return "$rc"
  echo
  echo "== stage times (seconds: wall-clock, CPU)$([ "$rc" -eq 0 ] || echo "; stopped in the last one, status $rc")"
  local i
  for i in "${!STAGE_NAMES[@]}"; do
    printf '%8s  %8s  %s\n' "${STAGE_SECONDS[$i]}" "${STAGE_CPU[$i]}" "${STAGE_NAMES[$i]:0:90}"
  done
  _cpu_ticks
  printf '%8s  %8s  %s\n' "$(awk -v a="$_stages_start" -v b="${EPOCHREALTIME/,/.}" \
    'BEGIN { printf "%.1f", b - a }')" "$(awk -v a="$_stages_cpu_start" -v b="$_cpu" \
    -v t="$_clk_tck" 'BEGIN { printf "%.1f", (b - a) / t }')" "in all"
  return "$rc"
}
