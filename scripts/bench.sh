#!/usr/bin/env bash
# Builds stoker and runs the main benchmark: stoker against the PyTorch DataLoader (torch 2.13.0,
# CPU build, in .venv) on generated data. Extra arguments go to `stoker bench`
# (e.g. --json, -w tensor, --epochs 7).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

apt_install "${BUILD_PACKAGES[@]}" python3 python3-venv python3-pip

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "== installing torch==2.13.0 and numpy into .venv"
  .venv/bin/pip install -q torch==2.13.0 numpy
fi

build build -DCMAKE_BUILD_TYPE=Release
./build/stoker bench --python .venv/bin/python "$@"
