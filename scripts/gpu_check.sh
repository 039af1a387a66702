#!/usr/bin/env bash
# Everything GPU-related in one command, for whenever a GPU is at hand (not run in CI):
#   1. a GPU must answer (nvidia-smi), else this fails at once saying so;
#   2. builds into build-gpu (the CUDA backend needs no toolkit, but the `gpu` tests call the
#      runtime themselves: fails if no CUDA toolkit is found), and `stoker info` must find a
#      CUDA runtime with a device;
#   3. the `gpu`-labelled GoogleTest tests, none of them allowed to skip;
#   4. `stoker bench --device cuda`: host-to-device GB/s from pinned against pageable slabs;
#   5. `device="cuda"` from Python: batches arrive on the GPU, equal to the CPU ones (needs a
#      torch with CUDA in $PYTHON, default .venv-gpu/bin/python, then .venv-test/bin/python).
#   6. bench/gpu_feed.py: device="cuda" and pinned batches against torch's DataLoader with
#      pin_memory=True at its best num_workers and against the pinned copy rate (the limit).
# Prints a summary; exits non-zero on the first failure. Offline: installs nothing itself,
# except the stoker package into $PYTHON's environment (pip --no-build-isolation).
# On a GPU machine without the build's apt packages: build here with the CUDA toolkit
# (build-gpu and a wheel for its Python), carry them, and set GPU_CHECK_PREBUILT=1 (use
# build-gpu as it is) and GPU_CHECK_WHEEL=path/to/stoker.whl (install it, not the source tree;
# it is installed without its dependencies: install a wheel of each the machine lacks first,
# e.g. braceexpand on the device machines lent so far), with the Debian libraries the build
# links that the machine lacks on LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

summary=()
fail() {
  echo "gpu_check: FAILED: $*" >&2
  exit 1
}

echo "== GPU"
command -v nvidia-smi >/dev/null || fail "no GPU answers: nvidia-smi is not installed"
gpus=$(nvidia-smi -L 2>&1) || fail "no GPU answers: nvidia-smi -L says: $gpus"
echo "$gpus"
summary+=("GPU: $(echo "$gpus" | head -n 1)")

echo "== build (build-gpu) and the CUDA runtime it finds"
if [ "${GPU_CHECK_PREBUILT:-0}" = 1 ]; then
  [ -x build-gpu/stoker ] || fail "GPU_CHECK_PREBUILT=1 but build-gpu/stoker is not there"
else
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTOKER_BUILD_TESTS=ON \
    -DSTOKER_BUILD_TOOLS=ON -DSTOKER_WERROR=ON >build-gpu.cmake.log 2>&1 ||
    { cat build-gpu.cmake.log; fail "cmake"; }
  ninja -C build-gpu -j "$(nproc)"
fi
[ -x build-gpu/tests/cuda_test ] ||
  fail "no CUDA toolkit found (CUDAToolkit_ROOT or nvcc on PATH): the gpu tests were not built"
build-gpu/stoker info | tee build-gpu/info.txt
grep -q "^cuda devices: [1-9]" build-gpu/info.txt ||
  fail "stoker found no CUDA device: $(grep -E '^(cuda runtime|why no device):' build-gpu/info.txt)"
summary+=("runtime: $(grep '^cuda runtime:' build-gpu/info.txt)")

echo "== gpu-labelled tests"
ctest --test-dir build-gpu -L gpu --output-on-failure | tee build-gpu/gpu-tests.log ||
  fail "gpu-labelled tests"
# GoogleTest's skips count as passes in ctest: with a GPU here, none may skip.
if grep -q "\[  SKIPPED \]" build-gpu/Testing/Temporary/LastTest.log; then
  fail "gpu tests skipped although nvidia-smi sees a GPU: $(grep -m1 -A1 'SKIPPED' \
    build-gpu/Testing/Temporary/LastTest.log)"
fi
summary+=("gpu tests: $(grep -o '[0-9]*% tests passed.*' build-gpu/gpu-tests.log)")

echo "== stoker bench --device cuda (pinned vs pageable host-to-device)"
build-gpu/stoker bench --device cuda --json | tee build-gpu/bench-cuda.json
rates=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print("pinned %.2f GB/s, pageable %.2f GB/s" % (r["pinned"]["gb_per_s"], r["pageable"]["gb_per_s"]))' \
  build-gpu/bench-cuda.json) || fail "bench --device cuda gave no figures"
summary+=("H2D: $rates")
echo "== stoker bench --device sim (copy/compute overlap logic)"
build-gpu/stoker bench --device sim --smoke --json >/dev/null || fail "bench --device sim"

echo "== Python: device=\"cuda\""
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for p in .venv-gpu/bin/python .venv-test/bin/python; do
    if [ -x "$p" ]; then
      PYTHON=$p
      break
    fi
  done
fi
[ -n "$PYTHON" ] || fail "no Python environment: set PYTHON to one with torch (CUDA) installed"
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' ||
  fail "$PYTHON's torch sees no CUDA device (a CPU-only torch?): install a CUDA torch there"
if [ -n "${GPU_CHECK_WHEEL:-}" ]; then
  "$PYTHON" -m pip install -q --no-deps --no-index --force-reinstall "$GPU_CHECK_WHEEL" ||
    fail "pip install $GPU_CHECK_WHEEL into $PYTHON"
else
  "$PYTHON" -m pip install -q --no-build-isolation . || fail "pip install . into $PYTHON"
fi
"$PYTHON" - <<'EOF' || fail "device=\"cuda\" from Python"
import numpy as np
import torch

import stoker

data = np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256)
labels = np.arange(4096)
ds = stoker.ArrayDataset(data, labels)
cpu = stoker.DataLoader(ds, batch_size=128, num_workers=2)
# Batches on the GPU through stoker's side stream; and pinned host batches the training loop
# copies itself with non_blocking=True, dropping the host tensor at once (the seeds' idiom).
gpu = stoker.DataLoader(ds, batch_size=128, num_workers=2, device="cuda")
pinned = stoker.DataLoader(ds, batch_size=128, num_workers=2, pin_memory=True)
n = 0
for (xc, yc), (xg, yg), (xp, yp) in zip(cpu, gpu, pinned):
    assert xg.device.type == "cuda" and yg.device.type == "cuda"
    torch.cuda._sleep(10_000_000)  # a slow kernel queued ahead of the copy
    xp = xp.to("cuda", non_blocking=True)  # the host tensor is dropped at once
    assert torch.equal(xg.cpu(), xc) and torch.equal(yg.cpu(), yc)
    assert torch.equal(xp.cpu(), xc), "a pinned slab was refilled under its copy"
    n += 1
assert n == 32, n
assert stoker.cuda_available(), stoker.build_info()
assert gpu.stats()["device"].startswith("cuda"), gpu.stats()["device"]
print(f"python device=cuda: {n} batches equal to the CPU loader's; stats {gpu.stats()['device']}")
EOF
summary+=("python: device=\"cuda\" batches equal to the CPU loader's")

echo "== bench/gpu_feed.py: stoker against torch's pinned loader and the copy limit"
"$PYTHON" bench/gpu_feed.py | tee build-gpu/gpu-feed.txt || fail "bench/gpu_feed.py"
summary+=("feed (samples/s): $(grep -E '^  (torch w|stoker|H2D)' build-gpu/gpu-feed.txt |
  awk '{printf "%s%s %s %s; ", sep, $1, $2, $3}')")

echo
echo "== gpu_check summary"
printf '  %s\n' "${summary[@]}"
