#!/usr/bin/env bash
# Builds stoker and runs the main benchmark: stoker against the PyTorch DataLoader (torch 2.13.0,
# CPU build, in .venv) on generated data, first from C++ (`stoker bench`), then from Python
# (stoker.DataLoader against torch's in one training script: bench/python_bench.py). Extra
# arguments go to `stoker bench` (e.g. --json, -w tensor, --epochs 7). The torchvision cases
# (ImageFolder with its PIL transforms) run in .venv-vision (torch 2.14.1 + torchvision 0.29.1,
# the pair that installs here; a large CUDA build that runs on the CPU).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

apt_install "${BUILD_PACKAGES[@]}" libdlpack-dev
python_venv .venv torch==2.13.0 numpy

build build -DCMAKE_BUILD_TYPE=Release
./build/stoker bench --python .venv/bin/python "$@"

echo
echo "== from Python: stoker.DataLoader against torch.utils.data.DataLoader"
.venv/bin/pip install -q .
.venv/bin/python bench/python_bench.py
echo "   (what a worker process adds to a cheap sample, against __getitem__ alone)"
.venv/bin/python bench/worker_overhead.py
echo "   (the batch path on worker threads against worker processes: what worker_type='auto' picks)"
.venv/bin/python bench/worker_kinds.py

echo
echo "== torchvision's ImageFolder + PIL transforms: stoker.DataLoader against torch's"
python_venv .venv-vision torch==2.14.1 torchvision==0.29.1 numpy pillow
.venv-vision/bin/pip install -q .
.venv-vision/bin/python bench/python_bench.py --workload tvfolder tvjitter

echo
echo "== auto against every fixed setting, with and without a CPU training step"
echo "   (bench/auto_matrix.py, in .venv-vision for torchvision's workloads; several minutes)"
.venv-vision/bin/python bench/auto_matrix.py

if [ -x .venv-test/bin/weed ]; then
  echo
  echo "== WebDataset shards over s3:// (SeaweedFS through a proxy adding 20 ms a request)"
  echo "   against webdataset and against local disk (bench/s3_bench.py; weed and webdataset"
  echo "   in .venv-test, from scripts/test.sh)"
  STOKER_WEED=.venv-test/bin/weed .venv-test/bin/python bench/s3_bench.py
  echo
  echo "== ImageFolder and record packs over s3:// against local disk (bench/s3_images_bench.py)"
  STOKER_WEED=.venv-test/bin/weed .venv-test/bin/python bench/s3_images_bench.py
fi

if .venv-test/bin/python -c "import ray, stoker" 2>/dev/null; then
  echo
  echo "== remote workers on Ray: local-only against local + a Ray node on the other core"
  echo "   (bench/ray_bench.py; .venv-test from scripts/test.sh, which installs ray there)"
  .venv-test/bin/python bench/ray_bench.py
fi

if .venv-test/bin/python -c "import av, stoker; stoker.VideoClips" 2>/dev/null; then
  echo
  echo "== video clips: stoker.VideoClips against PyAV in torch's DataLoader"
  echo "   (bench/video_bench.py; .venv-test from scripts/test.sh, which installs av there)"
  .venv-test/bin/python bench/video_bench.py
fi
