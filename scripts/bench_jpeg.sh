#!/usr/bin/env bash
# Builds stoker and runs the image pipeline benchmark (`stoker bench -w jpeg`): stoker from an
# image folder, record shards and the RAM cache, against the PyTorch DataLoader with
# torchvision's transforms, and bare libjpeg-turbo decode. The baseline needs torchvision, so it
# gets its own virtual environment, .venv-vision (torch==2.14.1, torchvision==0.29.1), kept out
# of CI. Extra arguments go to `stoker bench` (e.g. --json, --epochs 4, -v).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

apt_install "${BUILD_PACKAGES[@]}" python3 python3-venv python3-pip

if [ ! -x .venv-vision/bin/python ]; then
  python3 -m venv .venv-vision
fi
if ! .venv-vision/bin/python -c 'import torch, torchvision, PIL' >/dev/null 2>&1; then
  echo "== installing torch==2.14.1 torchvision==0.29.1 into .venv-vision"
  .venv-vision/bin/pip install -q torch==2.14.1 torchvision==0.29.1 pillow numpy
fi

build build -DCMAKE_BUILD_TYPE=Release
./build/stoker bench -w jpeg --python .venv-vision/bin/python "$@"
